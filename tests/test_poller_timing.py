"""kube_device_exporter_source_duration_seconds is the time each source takes, measured in
its worker thread, not the time the event loop took to notice it finished."""

from __future__ import annotations

import threading

from exporter.model import SourceResult
from tests.support.cycle import make_poller

_thread_time = threading.local()


def thread_clock() -> float:
    """Seconds that pass only in the thread that moves them: the event loop's thread sees
    no time at all, so only a measurement taken inside the worker can see a source's cost."""
    return float(getattr(_thread_time, "now", 0.0))


class Takes:
    def __init__(self, seconds: float, fail: bool = False) -> None:
        self.seconds = seconds
        self.fail = fail

    def collect(self) -> SourceResult:
        _thread_time.now = thread_clock() + self.seconds
        if self.fail:
            raise RuntimeError("broken after a while")
        return SourceResult("x")

    def close(self) -> None:
        return None


async def test_each_source_is_timed_in_its_own_thread() -> None:
    poller = make_poller(
        node="n",
        sources={"slow": Takes(3.0), "fast": Takes(0.0), "broken": Takes(1.5, fail=True)},
        client=None,
        clock=thread_clock,
    )
    snapshot = await poller.run_once()
    durations = {h.name: (h.success, h.duration_seconds) for h in snapshot.sources}
    assert durations == {"slow": (True, 3.0), "fast": (True, 0.0), "broken": (False, 1.5)}
