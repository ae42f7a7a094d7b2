"""When scrapes come: enough to decide, at the end of a cycle, which bodies to build now.

A body built at the end of the cycle is ready when the scrape comes, so the scrape costs
what serving fixed bytes costs. Building every format every cycle would cost the most at
the most common setting (a 1 s or 10 s cycle scraped every 15-60 s): so only the formats
(text or OpenMetrics, gzip or not) a scraper asked for recently are built, and only at the
end of a cycle after which a scrape is due before the next cycle ends. Prometheus scrapes a
target at a fixed period and offset, so the next scrape is predictable from the last two
gaps: the shorter of them for one scraper (its jitter errs early), the one before the last
when they alternate (two Prometheus replicas at different offsets: short, long, short...;
the shorter would build every cycle of the long gap); an odd short gap (two curls in a row)
ages out after two more scrapes. A predicted scrape that has not come a cycle and a half
after its time is not waited for cycle after cycle: the next is then expected after the
longer of the last two gaps (one scraper whose last gap was cut by an odd one), then after
their sum (a pair of replicas, or one scraper's period cut in two by a curl). Waiting
built every cycle of the long gap after an odd short one: the bench's back-to-back rounds
did that, at a 1,000-pod node's price. A scraper at about the cycle's pace gets its body
every cycle. A scrape that comes sooner than predicted, or later, is served by building
the body then, as before (never wrong, only slower). A format is forgotten after three of
its *longest* recent gaps without a scrape, and never within a minute of its last:
forgetting after three of the shortest dropped a pair of replicas with gaps of 3 s and
12 s before their long gap was ever seen, and none of their scrapes found a body ready.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

Format = tuple[bool, bool]
"""(OpenMetrics, gzip)."""

GAPS_KEPT = 2
FORGET_AFTER = 3
"""A format not asked for in this many of its longest recent gaps (or cycles, if longer) is
no longer built: its scraper is gone; if it comes back, its second scrape finds its body
ready again."""
FORGET_NOT_BEFORE = 60.0
"""Seconds after its last scrape before a format may be forgotten: a pair of Prometheus
replicas (interval up to 60 s) shows its long gap only after its short one."""
SLACK = 0.5
"""Cycles of slack on top of the next one: a cycle that ends late still has the body ready."""
FAST = 2.0
"""A format whose recent gaps are all within this many cycles is built every cycle."""
ALTERNATING = 1 / 3
"""The last two gaps alternate (two scrapers) when they differ by more than this share of
the longer (one over 1.5x the other); less is one scraper's jitter."""


@dataclass(slots=True)
class _Asked:
    last: float
    gaps: deque[float] = field(default_factory=lambda: deque(maxlen=GAPS_KEPT))


class ScrapeCadence:
    """Scrape times per format (from the HTTP handlers) and cycle ends (from the sink)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._asked: dict[Format, _Asked] = {}
        self._last_cycle: float | None = None
        self._cycle = 0.0

    def asked(self, fmt: Format) -> None:
        """A scrape for `fmt` came now."""
        now = self._clock()
        with self._lock:
            seen = self._asked.get(fmt)
            if seen is None:
                self._asked[fmt] = _Asked(now)
                return
            seen.gaps.append(now - seen.last)
            seen.last = now

    def cycle_done(self) -> list[Format]:
        """A cycle ended now: the formats whose next scrape is due before the next cycle
        ends (with SLACK). One asked for only once so far (a person's curl, or a
        Prometheus's first scrape) is not built ahead: its second scrape builds it."""
        now = self._clock()
        with self._lock:
            if self._last_cycle is not None:
                self._cycle = now - self._last_cycle
            self._last_cycle = now
            horizon = now + self._cycle * (1 + SLACK)
            due = []
            for fmt, seen in list(self._asked.items()):
                if not seen.gaps:
                    continue
                longest = max(seen.gaps)
                forget_after = max(FORGET_AFTER * max(longest, self._cycle), FORGET_NOT_BEFORE)
                if now - seen.last > forget_after:
                    del self._asked[fmt]
                elif longest <= FAST * self._cycle or self._expected(seen, now, horizon):
                    due.append(fmt)
            return due

    def _expected(self, seen: _Asked, now: float, horizon: float) -> bool:
        """Whether `seen`'s next scrape is expected by `horizon`: after the predicted gap;
        once that time is more than a cycle and a half (SLACK) past, after the longer of
        the last two gaps, then after their sum. With one gap known (a scraper's third
        scrape) it is waited for."""
        gaps = seen.gaps
        late = now - self._cycle * (1 + SLACK)
        if len(gaps) < GAPS_KEPT:
            return seen.last + gaps[-1] <= horizon
        for gap in (_next_gap(gaps), max(gaps), sum(gaps)):
            if seen.last + gap >= late:
                return seen.last + gap <= horizon
        return False


def _next_gap(gaps: deque[float]) -> float:
    """The gap expected before the next scrape: the shorter of the last two (one scraper,
    with jitter), or the one before last when they differ by more than ALTERNATING of the
    longer (two scrapers at different offsets: short, long, short...)."""
    if len(gaps) < 2:
        return gaps[-1]
    before, last = gaps[-2], gaps[-1]
    if abs(before - last) > ALTERNATING * max(before, last):
        return before
    return min(before, last)
