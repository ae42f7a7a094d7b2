"""A whole simulated node read as the exporter reads it: its real sources (NVML through
nvidia-ml-py and the stand-in library, sysfs over the rendered tree, the process resolver)
and one cycle with frozen clocks, so the output is reproducible byte for byte."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.attribution.resolver import ProcessResolver
from exporter.cli.flags import parse_config
from exporter.model import Snapshot
from simulator import nvml as simnvml
from simulator.node import SimulatedNode
from simulator.scenario import load_scenario
from tests.support import Clock, one_cycle

T0, T1 = 1.0, 31.0  # two cycles 30 s apart (rates exist), the first before any XID event


async def scenario_snapshot(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Snapshot:
    """The real sources over the simulated node at T1, after a first cycle at T0."""
    scenario = load_scenario(name)
    clock = Clock()
    node = SimulatedNode(scenario, tmp_path / "node", clock=clock)
    state = node.env().get(simnvml.STATE_ENV)
    if state:
        monkeypatch.setenv(simnvml.STATE_ENV, state)
    config = parse_config(node.exporter_args(), env={})
    sources = node.sources(config, clock=clock)  # PF netlink from the node's recordings
    try:
        clock.now = T0
        node.advance()
        for source in sources.values():
            source.collect()
        clock.now = T1
        node.advance()
        sysfs = config.sysfs if "sysfs" in scenario.sections else None
        resolver = None
        if scenario.has_processes:
            resolver = ProcessResolver(config.procfs, config.container_logs)
        snapshot = await one_cycle(
            scenario, tmp_path / "kubelet.sock", sources, t=T1, sysfs=sysfs, resolver=resolver
        )
    finally:
        for source in sources.values():
            source.close()
        for part in node.parts:
            part.close()
    assert all(h.success for h in snapshot.sources), snapshot.sources
    return snapshot
