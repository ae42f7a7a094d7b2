"""Counters that never go backwards, and that one bad read cannot corrupt.

The rule (docs/reliability.md quotes it):

- A raw value must be a finite number in [0, 2^64 - 1] (what an unsigned 64-bit counter can
  hold); anything else is a field error and the total stays where it was.
- A raw value that continues the last trusted one (not lower, and at most `jump_limit`
  higher) is taken at once.
- Anything else (a drop, or a jump beyond `jump_limit`) is a *discontinuity*: it is held,
  the total does not move, and the next read decides.
  - If the next read continues the last trusted value, the held read was a glitch (one read
    of 2^64-1, of 0, of garbage): it is dropped and counted as a field error.
  - If the next read continues the held one, the discontinuity was real. A drop was a reset
    (driver reload, `perfquery -R`, a 32-bit wrap): the total grows by what was counted since,
    the new raw value. A jump was real growth: the total grows by the whole difference.
  - Otherwise the newer read is held instead (and the older one counted as dropped).
- The first read is the device's count so far; one beyond `jump_limit` waits for a second read
  that continues it, so a glitch at start-up cannot set the counter for ever.

A real reset or jump therefore shows one cycle late; nothing is lost. The one case this
misreads: a counter reset whose next read already exceeds the pre-reset value; it is taken as a
glitch and the growth since the reset (not the whole count) is added.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass

COUNTER_MAX = float(2**64 - 1)
"""The largest value an unsigned 64-bit counter holds."""

JUMP_LIMIT = float(2**48)
"""Growth trusted without confirmation in one read, in the counter's base unit: 2.8e14 bytes
(47 minutes of an 800 Gb/s link at line rate), joules or events. Larger needs a second read."""


@dataclass(slots=True)
class Series:
    """One counter's state (`MonotonicCounters.series`)."""

    raw: float | None = None
    """The last trusted raw value; None until one is trusted."""
    total: float | None = None
    held: float | None = None
    """A discontinuous read waiting for the next read to confirm or refute it."""


class MonotonicCounters:
    """Totals kept across restarts and glitches of the raw counters they are fed."""

    def __init__(self, jump_limit: float = JUMP_LIMIT) -> None:
        self.jump_limit = jump_limit
        self._series: dict[Hashable, Series] = {}
        self.rejected = 0
        """Reads dropped as out of range or as glitches (field errors for the caller)."""

    def update(self, key: Hashable, raw: float) -> float | None:
        """The total after this read; None while nothing has been trusted for `key`."""
        s = self._series.get(key)
        if (
            s is not None
            and s.held is None
            and s.raw is not None
            and s.total is not None
            and s.raw <= raw <= s.raw + self.jump_limit
            and raw <= COUNTER_MAX
        ):  # continues the last trusted read, nothing held: most reads of most cycles
            s.total += raw - s.raw
            s.raw = raw
            return s.total
        return self._update(key, raw)

    def series(self, key: Hashable) -> Series:
        """The series of `key`, made when it is new (an empty one reads as no total): kept
        by a caller that reads the same keys every cycle (`update_each`, `totals`), so that
        none of them is looked up again."""
        return self._series.setdefault(key, Series())

    def update_each(
        self, row: list[float | None], at: tuple[tuple[int, Hashable, Series], ...]
    ) -> bool:
        """`update` of each raw value `row[i]`, for every (i, key, `series(key)`) in `at`:
        the value is replaced by the total (None while nothing is trusted). One call for a
        row of reads; the common case is `update`'s, written out here, the rest goes the
        same way. True when every total is trusted (no None put in `row`)."""
        limit, trusted = self.jump_limit, True
        for i, key, s in at:
            raw: float = row[i]  # type: ignore[assignment]  # a raw read, not yet a total
            last = s.raw
            if (
                s.held is None
                and last is not None
                and s.total is not None
                and last <= raw <= last + limit
                and raw <= COUNTER_MAX
            ):
                s.total += raw - last
                s.raw = raw
                row[i] = s.total
            else:
                total = row[i] = self._update(key, raw)
                trusted = trusted and total is not None
        return trusted

    def _update(self, key: Hashable, raw: float) -> float | None:
        if not (math.isfinite(raw) and 0.0 <= raw <= COUNTER_MAX):
            self.rejected += 1
            return self.last(key)
        s = self._series.setdefault(key, Series())
        if s.raw is None or s.total is None:
            confirms = s.held is not None and self._continues(s.held, raw)
            if s.held is not None and not confirms:
                self.rejected += 1  # the implausible first read was not confirmed
            if raw <= self.jump_limit or confirms:
                s.raw, s.total, s.held = raw, raw, None
            else:
                s.held = raw
            return s.total
        if self._continues(s.raw, raw):
            if s.held is not None:
                self.rejected += 1  # the held read was a glitch
            s.total += raw - s.raw
            s.raw, s.held = raw, None
        elif s.held is not None and self._continues(s.held, raw):
            s.total += raw if s.held < s.raw else raw - s.raw
            s.raw, s.held = raw, None
        else:
            if s.held is not None:
                self.rejected += 1
            s.held = raw
        return s.total

    def last(self, key: Hashable) -> float | None:
        """The total last returned for `key` (to keep reporting it while a read fails)."""
        s = self._series.get(key)
        return None if s is None else s.total

    @staticmethod
    def totals(series: tuple[Series, ...]) -> list[float | None]:
        """`last` of each of these series (`series(key)`), in one call."""
        return [s.total for s in series]

    def take_rejected(self) -> int:
        """Reads rejected since the last call (added to a cycle's field errors)."""
        count, self.rejected = self.rejected, 0
        return count

    def _continues(self, last: float, raw: float) -> bool:
        return last <= raw <= last + self.jump_limit
