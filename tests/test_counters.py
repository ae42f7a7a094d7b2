"""MonotonicCounters: totals that never go back when the raw counter restarts or wraps."""

from __future__ import annotations

from exporter.sources.counters import MonotonicCounters


def test_totals_survive_restarts_and_wraps() -> None:
    counters = MonotonicCounters()
    assert counters.last("energy") is None
    raw = [500.0, 700.0, 700.0, 40.0, 90.0, 2**32 - 10, 5.0]
    totals = [counters.update("energy", r) for r in raw]
    assert totals == [500.0, 700.0, 700.0, 740.0, 790.0, 790.0 + 2**32 - 100, 795.0 + 2**32 - 100]
    assert counters.last("energy") == totals[-1]
    assert counters.update("other", 3.0) == 3.0  # keys are independent
