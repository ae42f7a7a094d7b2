"""A simulated node: the simulated kubelet plus device parts, all from one scenario.

Device parts (the simulated NVML library, the sysfs tree) live in their own modules and
are found by scenario section name; each tells which environment and exporter flags
the exporter needs, and is advanced once a tick with the scenario time.
"""

from __future__ import annotations

import asyncio
import importlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from exporter.settings.config import Config
from exporter.sources import Source
from simulator.kubelet import SimulatedKubelet
from simulator.scenario import Scenario

PART_MODULES = {
    "nvidia": "simulator.nvml",
    "sysfs": "simulator.sysfs",
    "procfs": "simulator.procfs",
    "dra": "simulator.dra",
}
"""Scenario section -> module with `make_part(scenario, workdir) -> NodePart`; the procfs
part also runs when any container has `pids:`."""


class NodePart(Protocol):
    def env(self) -> dict[str, str]:
        """Environment the exporter process needs before it starts (LD_LIBRARY_PATH...)."""
        ...

    def exporter_args(self) -> list[str]:
        """Exporter flags this part needs (e.g. --path.sysfs DIR)."""
        ...

    def advance(self, t: float) -> None:
        """Move the devices to scenario time `t` (counters grow, faults fire)."""
        ...

    def close(self) -> None: ...


class SimulatedNode:
    def __init__(
        self, scenario: Scenario, workdir: Path, *, clock: Callable[[], float] | None = None
    ) -> None:
        self.scenario = scenario
        self.workdir = workdir
        started = time.monotonic()
        self.clock = clock or (lambda: time.monotonic() - started)
        self.socket_path = workdir / "pod-resources" / "kubelet.sock"
        self.kubelet = SimulatedKubelet(scenario, self.socket_path, clock=self.clock)
        self.parts: list[NodePart] = []
        for section, module in PART_MODULES.items():
            if section in scenario.sections or (section == "procfs" and scenario.has_processes):
                make_part = importlib.import_module(module).make_part
                self.parts.append(make_part(scenario, workdir))
        self.advance()

    def env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for part in self.parts:
            env.update(part.env())
        return env

    def exporter_args(self) -> list[str]:
        args = [
            "--kubelet-socket", str(self.socket_path),
            "--node-name", self.scenario.node,
            "--collect-interval", "2s",
        ]  # fmt: skip
        # No `nvidia:` section is a node without an NVIDIA driver: the NVML collector stays
        # on, as in the DaemonSet, and reports no devices (absent is not broken).
        if "sysfs" not in self.scenario.sections:
            # No `sysfs:` section is a node without AMD, Intel, RDMA or SR-IOV devices, not
            # this machine's: the sysfs sources read an empty tree and report absent.
            empty = self.workdir / "sysfs-empty"
            (empty / "class").mkdir(parents=True, exist_ok=True)
            args += ["--path.sysfs", str(empty), "--collector.netdev.vf-netlink", "false"]
        for part in self.parts:
            args += part.exporter_args()
        if "--path.container-logs" not in args:
            # No processes in the scenario, so no procfs part: the node's own empty
            # container-log folder, not this machine's /var/log/containers (which a demo
            # machine often lacks: attribution would warn about it).
            logs = self.workdir / "containers-none"
            logs.mkdir(parents=True, exist_ok=True)
            args += ["--path.container-logs", str(logs)]
        return args

    def sources(
        self, config: Config, *, clock: Callable[[], float] | None = None
    ) -> dict[str, Source]:
        """The exporter's sources over this node, as `Exporter(config, sources=...)` takes
        them: PF netlink is answered from the sysfs part's recorded answers (netlink.py);
        `clock` is the sources' monotonic clock (tests freeze it)."""
        from simulator.netlink import simulated_sources

        recorded = [p.netlink_path for p in self.parts if hasattr(p, "netlink_path")]
        return simulated_sources(config, recorded[0] if recorded else None, clock=clock)

    def advance(self) -> None:
        t = self.clock()
        for part in self.parts:
            part.advance(t)

    async def start(self) -> None:
        await self.kubelet.start()

    async def stop(self) -> None:
        await self.kubelet.stop()
        for part in self.parts:
            part.close()

    async def tick_forever(self, stop: asyncio.Event, every: float = 1.0) -> None:
        while not stop.is_set():
            await asyncio.to_thread(self.advance)
            try:
                await asyncio.wait_for(stop.wait(), timeout=every)
            except TimeoutError:
                continue
