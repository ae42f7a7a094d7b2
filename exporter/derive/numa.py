"""The node's CPU -> NUMA node map, read from sysfs (`--path.sysfs`), an input of the join.

`<sysfs>/devices/system/node/node<N>/cpulist` lists the CPUs of NUMA node N
(Documentation/ABI/stable/sysfs-devices-node, "nodeX/cpulist: The CPUs associated to the
node") in the kernel's list format, `0-15,32-47` (`%*pbl`, lib/bitmap-str.c; the same
format as `/sys/devices/system/cpu/online`, Documentation/admin-guide/cputopology.rst). A
node without CPUs has an empty list; a kernel without NUMA support has no `node`
directory at all: then the map is empty and no container's CPUs are placed.

The map changes only with CPU hotplug, so it is read at most every `refresh` seconds by the
poller, in a worker thread, never on a scrape.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path

from exporter.runtime import hostfiles
from exporter.runtime.threads import BoundedWorker
from exporter.settings.config import DEFAULTS

log = logging.getLogger("exporter.numa")

NODE_DIR = Path("devices/system/node")
_NODE = re.compile(r"^node(\d+)$")


def parse_cpulist(text: str) -> tuple[int, ...]:
    """`0-3,8,10-11` -> (0, 1, 2, 3, 8, 10, 11); empty text -> (). ValueError on garbage."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        first, dash, last = part.partition("-")
        low, high = int(first), int(last if dash else first)
        if high < low:
            raise ValueError(f"descending range {part!r}")
        cpus += range(low, high + 1)
    return tuple(cpus)


def read_cpu_nodes(sysfs: Path) -> dict[int, int]:
    """CPU id -> NUMA node, from every `node<N>/cpulist` under `sysfs`. A node whose file is
    unreadable or unparsable is left out (its CPUs stay unplaced), never the whole map."""
    cpu_nodes: dict[int, int] = {}
    try:
        entries = sorted((sysfs / NODE_DIR).iterdir())
    except OSError:
        return cpu_nodes
    for entry in entries:
        m = _NODE.match(entry.name)
        if not m:
            continue
        text = hostfiles.read_text(entry / "cpulist", 64 * 1024, nofollow=True)
        try:
            cpus = parse_cpulist(text if text is not None else "")
        except ValueError as exc:
            log.debug("skipping %s: %s", entry, exc)
            continue
        for cpu in cpus:
            cpu_nodes[cpu] = int(m[1])
    return cpu_nodes


class CpuNodeMap:
    """`read_cpu_nodes(sysfs)`, re-read when older than `refresh` seconds. A read that has not
    returned in `timeout` seconds (a hung mount) keeps the last map; it is tried again once
    that read returns."""

    def __init__(
        self,
        sysfs: Path,
        *,
        refresh: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        timeout: float = DEFAULTS.collect_timeout,
    ) -> None:
        self.sysfs = sysfs
        self.refresh = refresh
        self.timeout = timeout
        self._worker = BoundedWorker("numa")
        self._stuck = False
        self._clock = clock
        self._map: dict[int, int] = {}
        self._read_at: float | None = None

    def stale(self) -> bool:
        return self._read_at is None or self._clock() - self._read_at >= self.refresh

    def get(self) -> Mapping[int, int]:
        """The map, read from sysfs first when stale (blocking: call it off the loop)."""
        if self.stale():
            try:
                fresh = self._worker.call(partial(read_cpu_nodes, self.sysfs), self.timeout)
            except TimeoutError:  # Stuck too: the last read has not returned yet
                if not self._stuck:
                    log.warning(
                        "reading %s takes over %gs: keeping the last CPU map",
                        self.sysfs / NODE_DIR,
                        self.timeout,
                    )
                self._stuck = True
                return self._map
            self._stuck = False
            if not fresh and self._read_at is None:
                log.info(
                    "no NUMA nodes under %s: containers' exclusive CPUs are not placed",
                    self.sysfs / NODE_DIR,
                )
            self._map, self._read_at = fresh, self._clock()
        return self._map
