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


def test_a_row_of_reads_totals_as_one_read_at_a_time() -> None:
    """`update_each` writes `update`'s common case out for speed: every read of every
    series must come out as `update` makes it, glitches, resets and first reads included."""
    raws = [
        [5.0, 0.0, 2.0**64 - 1, 1.0],
        [6.0, 0.0, 7.0, 1.0],
        [7.0, 2.0**60, 8.0, float("nan")],  # a jump, a non-finite read
        [3.0, 2.0**60 + 1, 9.0, 2.0],  # a drop: held
        [4.0, 2.0**60 + 2, 2.0**64 - 1, 3.0],  # the drop confirmed (a reset); a glitch
        [2.0**64, 2.0**60 + 3, 10.0, 4.0],  # out of range
        [5.0, 2.0**60 + 3, 11.0, 5.0],
    ]
    keys = ("a", "b", "c", "d")
    one, row = MonotonicCounters(), MonotonicCounters()
    at = tuple((i, key, row.series(key)) for i, key in enumerate(keys))
    for read in raws:
        expected = [one.update(key, raw) for key, raw in zip(keys, read, strict=True)]
        totals: list[float | None] = list(read)
        trusted = row.update_each(totals, at)
        assert totals == expected
        assert trusted == (None not in expected)
        assert row.totals(tuple(s for _, _, s in at)) == [one.last(key) for key in keys]
        assert row.take_rejected() == one.take_rejected()
