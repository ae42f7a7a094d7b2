"""Links that go down on a schedule: an InfiniBand port's `down:` windows in a scenario.

While a window lasts the port reads `state` `1: DOWN` (and `phys_state` not LinkUp, as
sysfsnet.py writes for any state but ACTIVE); every window that has begun by time t has
added one to `counters/link_downed`, which the kernel documents as the number of times the
port training state machine failed link error recovery and downed the link
(Documentation/ABI/stable/sysfs-class-infiniband, `counters/link_downed`).
"""

from __future__ import annotations

from simulator.scenario import ScenarioError
from simulator.sysfstree import Doc


def link_windows(port: Doc, t: float, state: str) -> tuple[str, int]:
    """(the port's state at t, how many down windows began by t) for `down: [{start, end}]`."""
    downs = 0
    for i, window in enumerate(port.items("down", {"start", "end"})):
        start = window.number("start")
        end = window.number("end", float("inf"))
        if end <= start:
            raise ScenarioError(f"{port.scenario}: {port.where}.down[{i}]: end before start")
        if start <= t:
            downs += 1
            if t < end:
                state = "DOWN"
    return state, downs
