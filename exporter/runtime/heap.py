"""After the node shrinks, hand back what the allocators can.

When a big node empties (1,000 pods leave), every object of theirs is freed, yet RSS
stays near the peak: the allocators keep freed memory for the next growth.
`HeapTrimmer` watches each snapshot's size; on the cycle after it fell to half its peak
or less (the last big snapshot is gone by then), and once more a minute later (the
Prometheus layout of the big node lives until the next scrape), it runs

- a full garbage collection: besides reference cycles it empties CPython's free lists
  (up to 2,000 spare tuples of each length, floats, lists, dicts), whose blocks, left
  from the big node, pin pymalloc arenas. The exporter freezes its start-up objects out
  of the collector's sight (poller.py), so this does not scan them.
- glibc's `malloc_trim(0)`: it walks the heap and releases every free page
  (MADV_DONTNEED), not only its top. Where the C library has none (musl, macOS), only
  the collection runs.

What comes back depends on the allocator; docs/performance.md measures it. The image
runs Python on glibc's malloc (`SHIPPED_ENV`, set in the Dockerfile), where the trim
brings RSS back near where it was before the big node, however often the node grows and
shrinks. Python's own allocator (pymalloc, the interpreter's default)
unmaps a 1 MiB arena only once every object in it is freed; the objects that churn every
cycle keep landing in the big node's arenas, so after each swing more of them stay
mapped and RSS creeps towards the peak. glibc costs some CPU per cycle for that
(docs/performance.md, "Where a dense cycle goes").
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import sys
import time
from collections.abc import Callable

from exporter.model import Snapshot

log = logging.getLogger("exporter.heap")

SHRINK_RATIO = 0.5
"""Trim when the snapshot fell to this share of its peak since the last trim, or less."""
MIN_DROP = 500
"""... and by at least this many items (devices, allocations, processes...): below it
there is too little to hand back to be worth the walk (docs/design-figures.md)."""
SHIPPED_ENV = {"PYTHONMALLOC": "malloc"}
"""The environment the image starts Python with (Dockerfile `ENV`, checked by
tests/test_dockerfile.py; the benchmarks run the exporter with it): the allocator is
chosen before the interpreter starts, so it cannot be a flag."""
AGAIN_AFTER = 60.0
"""Seconds from the first trim to the second (the usual scrape intervals are shorter)."""


def malloc_trim() -> Callable[[], bool] | None:
    """glibc's `malloc_trim(0)` (True: some memory was released), or None without one."""
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the C library the process already runs on
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: bool(trim(0))


def uses_pymalloc() -> bool:
    """Python's own allocator serves small objects here (it counts the blocks it has handed
    out; under `PYTHONMALLOC=malloc` the count is 0)."""
    return sys.getallocatedblocks() > 0


def snapshot_size(snapshot: Snapshot) -> int:
    """The snapshot's items whose number follows the pods: what a cycle keeps in memory
    grows with it (its series included)."""
    return (
        len(snapshot.devices)
        + len(snapshot.allocations)
        + len(snapshot.allocatable)
        + len(snapshot.containers)
        + len(snapshot.container_usage)
        + len(snapshot.processes)
        + len(snapshot.pods)
    )


class HeapTrimmer:
    """The poller's after-cycle step (`Poller(after_cycle=...)`) that trims after a shrink:
    it publishes nothing, so it is not a sink; it runs once per cycle in the poller's worker
    thread, after the sinks took the snapshot."""

    name = "heap-trim"

    def __init__(
        self,
        trim: Callable[[], bool] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        again_after: float = AGAIN_AFTER,
    ) -> None:
        self._trim = trim if trim is not None else malloc_trim()
        self._clock = clock
        self._again_after = again_after
        self._peak = 0
        self._due: list[float] = []
        """When the pending trims are due: each runs on the first cycle at or after it."""
        self.trims = 0
        if uses_pymalloc():
            # Only a pod runs for long enough to care; a local run (`kube-device-exporter`
            # from a checkout) would print it every time.
            in_pod = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
            log.log(
                logging.INFO if in_pod else logging.DEBUG,
                "Python's own allocator (pymalloc) serves small objects: after a big node "
                "shrinks, RSS stays near its peak; the image sets PYTHONMALLOC=malloc, "
                "set it in your own image too (docs/deploy.md, Resources)",
            )

    def after_cycle(self, snapshot: Snapshot) -> None:
        now = self._clock()
        if self._due and now >= self._due[0]:
            del self._due[0]
            self.trim()
        size = snapshot_size(snapshot)
        if size <= self._peak * SHRINK_RATIO and self._peak - size >= MIN_DROP:
            # The poller still holds the last big snapshot until the sinks are done with
            # this one: trim on the next cycle, then once more.
            self._due = [now, now + self._again_after]
            self._peak = size
        self._peak = max(self._peak, size)

    def trim(self) -> None:
        before = _rss_bytes()
        gc.collect()
        released = self._trim() if self._trim is not None else False
        self.trims += 1
        log.debug(
            "the node shrank: RSS %.1f -> %.1f MiB (malloc_trim %s)",
            before / 2**20,
            _rss_bytes() / 2**20,
            "released pages" if released else "released nothing or is unavailable",
        )


def _rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
