"""Counters that never go backwards, whatever the hardware counter underneath does."""

from __future__ import annotations

from collections.abc import Hashable


class MonotonicCounters:
    """Totals kept across restarts of the raw counters they are fed.

    A driver reload, a device reset or a counter that wraps makes a raw value smaller
    than the last one; the total then grows by the new raw value (what was counted since
    the restart) instead of going back, as Prometheus' `rate()` would assume anyway.
    The first raw value seen is taken whole: it is what the device counted so far.
    """

    def __init__(self) -> None:
        self._raw: dict[Hashable, float] = {}
        self._total: dict[Hashable, float] = {}

    def update(self, key: Hashable, raw: float) -> float:
        last = self._raw.get(key)
        total = self._total.get(key, 0.0)
        total += raw if last is None or raw < last else raw - last
        self._raw[key], self._total[key] = raw, total
        return total

    def last(self, key: Hashable) -> float | None:
        """The total last returned for `key` (to keep reporting it while a read fails)."""
        return self._total.get(key)
