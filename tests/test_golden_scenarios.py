"""Whole /metrics of every bundled scenario, compared with tests/golden/, linted by promtool.

The real sources (NVML through nvidia-ml-py and the simulated library, the sysfs sources
over the rendered tree) run against the simulated node at fixed scenario times with frozen
clocks, so the output is reproducible byte for byte. `pytest --update-golden` rewrites.
"""

from __future__ import annotations

import asyncio
import ctypes
from pathlib import Path
from typing import Any

import pytest

from exporter.app import build_sources
from exporter.attribution.resolver import ProcessResolver
from exporter.cli import parse_config
from exporter.metrics import Kind
from exporter.model import Snapshot
from exporter.simulate import nvml as simnvml
from exporter.simulate.node import SimulatedNode
from exporter.simulate.scenario import bundled_names, load_scenario
from exporter.sinks.dcgm import FIELDS
from exporter.sources import Source
from exporter.sources.nvml import NvmlSource
from tests.nvml_support import fakenvml  # noqa: F401 - fixture
from tests.peers import promtool_check_metrics
from tests.support import Clock, assert_golden, metrics_text, one_cycle

T0, T1 = 1.0, 31.0  # two cycles 30 s apart (rates exist), the first before any XID event


def test_every_bundled_scenario_has_a_golden_file() -> None:
    assert sorted(bundled_names()) == ["demo", "dense", "mixed", "numa"]


@pytest.mark.parametrize("name", ["demo", "dense", "mixed", "numa"])
async def test_golden_metrics(
    name: str,
    tmp_path: Path,
    fakenvml: ctypes.CDLL,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    update_golden: bool,
) -> None:
    snapshot = await scenario_snapshot(name, tmp_path, monkeypatch)
    text = metrics_text(snapshot)
    assert_golden(f"scenario-{name}.prom", text, update_golden)
    promtool_check_metrics(text)


async def test_golden_dense_in_dcgm_schema(
    tmp_path: Path,
    fakenvml: ctypes.CDLL,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    update_golden: bool,
) -> None:
    snapshot = await scenario_snapshot("dense", tmp_path, monkeypatch)
    text = metrics_text(snapshot, schema=("dcgm",))
    assert_golden("scenario-dense-dcgm.prom", text, update_golden)
    # dcgm-exporter's names are the point: its counters have no `_total` and its labels
    # are camelCase (`modelName`, `UUID`, `Hostname`). promtool's lint says exactly that,
    # for exactly its families, and nothing else.
    families = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE DCGM_")}
    counters = {f.spec.name for f in FIELDS if f.spec.kind is Kind.COUNTER} & families
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" in counters
    camel = "label names should be written in 'snake_case' not 'camelCase'"
    promtool_check_metrics(
        text,
        lint=[f'{c} counter metrics should have "_total" suffix' for c in counters]
        + [f"{name} {camel}" for name in families]
        + ["DCGM_FI_DEV_PCIE_REPLAY_COUNTER metric name should not include type 'counter'"],
    )


async def scenario_snapshot(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Snapshot:
    """The real sources over the simulated node at T1, after a first cycle at T0."""
    scenario = load_scenario(name)
    clock = Clock()
    node = SimulatedNode(scenario, tmp_path / "node", clock=clock)
    state = node.env().get(simnvml.STATE_ENV)
    if state:
        monkeypatch.setenv(simnvml.STATE_ENV, state)
    config = parse_config(node.exporter_args(), env={})
    sources = build_sources(config, clock=clock)
    try:
        clock.now = T0
        node.advance()
        for source in sources.values():
            source.collect()
        clock.now = T1
        node.advance()
        await _xids_delivered(sources, scenario.sections.get("nvidia", {}))
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


async def _xids_delivered(sources: dict[str, Source], nvidia: dict[str, Any]) -> None:
    """XIDs arrive on the NVML source's event thread: wait (bounded) until every event of
    (T0, T1] has been counted, so the golden output does not depend on thread timing."""
    expected = sum(1 for e in nvidia.get("xid", []) if T0 < e["at"] <= T1)
    source = sources.get("nvml")
    if not expected or not isinstance(source, NvmlSource):
        return
    for _ in range(100):
        if sum(source.xids.snapshot().values()) >= expected:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{expected} XID events not delivered: {source.xids.snapshot()}")
