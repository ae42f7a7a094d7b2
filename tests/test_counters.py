"""MonotonicCounters: totals that never go back when the raw counter restarts or wraps."""

from __future__ import annotations

from exporter.sources.counters import MonotonicCounters


def test_totals_survive_restarts_and_wraps() -> None:
    counters = MonotonicCounters()
    assert counters.last("energy") is None
    raw = [500.0, 700.0, 700.0, 40.0, 90.0, 2**32 - 10, 5.0, 6.0]
    totals = [counters.update("energy", r) for r in raw]
    # a drop is held until the next read confirms it; then what was counted since is added
    big = 790.0 + 2**32 - 100
    assert totals == [500.0, 700.0, 700.0, 700.0, 790.0, big, big, big + 6.0]
    assert counters.last("energy") == totals[-1]
    assert counters.rejected == 0, "confirmed resets are no errors"
    assert counters.update("other", 3.0) == 3.0  # keys are independent


def test_an_implausible_first_read_waits_for_confirmation() -> None:
    counters = MonotonicCounters()
    assert counters.update("k", 2.0**64 - 1) is None, "no series from one read of all ones"
    assert counters.update("k", 7.0) == 7.0, "refuted: the first read was a glitch"
    assert counters.take_rejected() == 1 and counters.rejected == 0
    assert counters.update("j", 2.0**60) is None
    assert counters.update("j", 2.0**60 + 2**20) == 2.0**60 + 2**20, "a second read confirms it"
    assert counters.rejected == 0
