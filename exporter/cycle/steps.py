"""Snapshot steps: parts of a snapshot derived from the whole of it (GPU-NIC placement,
energy per container), added in the publish worker after the join.

A step that raises costs only its own part: the snapshot goes on without it, and the
failure is logged once per state change, not once per cycle (a bug in a derived series
must not take the device readings with it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from exporter.model import Snapshot
from exporter.runtime.log import StateLog

log = logging.getLogger("exporter.steps")

SnapshotStep = Callable[[Snapshot, Mapping[int, int]], Snapshot]
"""(snapshot, CPU -> NUMA map) -> the snapshot with the step's part added."""


class Steps:
    def __init__(self, steps: Sequence[SnapshotStep] = ()) -> None:
        self.steps = list(steps)
        self._states = StateLog(log)

    def __call__(self, snapshot: Snapshot, cpu_nodes: Mapping[int, int]) -> Snapshot:
        for step in self.steps:
            name = getattr(step, "__qualname__", repr(step))
            try:
                snapshot = step(snapshot, cpu_nodes)
            except Exception as exc:  # noqa: BLE001 - one derived part, not the cycle
                self._states.failed(name, f"{name} failed, its series are left out: {exc!r}")
                continue
            self._states.ok(name, f"{name} works again")
        return snapshot
