"""When scrapes come: enough to decide, at the end of a cycle, which bodies to build now.

A body built at the end of the cycle is ready when the scrape comes, so the scrape costs
what serving fixed bytes costs. Building every format every cycle would cost the most at
the most common setting (a 1 s or 10 s cycle scraped every 15-60 s): so only the formats
(text or OpenMetrics, gzip or not) a scraper asked for recently are built, and only at the
end of a cycle after which a scrape is due before the next cycle ends. Prometheus scrapes a
target at a fixed period and offset, so the next scrape is predictable from the last ones;
the shorter of the last two gaps is used (two Prometheus replicas scraping at different
offsets give alternating gaps; an odd short gap, two curls in a row, ages out after two
more scrapes), and a scrape that comes sooner than predicted is served
by building the body then, as before (never wrong, only slower).
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
"""A format not asked for in this many of its periods (or cycles, if longer) is no longer
built: its scraper is gone; if it comes back, its second scrape finds its body ready again."""
SLACK = 0.5
"""Cycles of slack on top of the next one: a cycle that ends late still has the body ready."""


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
                period = min(seen.gaps) if seen.gaps else 0.0
                if period and now - seen.last > FORGET_AFTER * max(period, self._cycle):
                    del self._asked[fmt]
                elif period and seen.last + period <= horizon:
                    due.append(fmt)
            return due
