"""DRM fdinfo: per-client GPU memory and engine time of amdgpu, i915 and xe processes.

The keys are the kernel's (`Documentation/gpu/drm-usage-stats.rst`), printed for every open
DRM file in `/proc/<pid>/fdinfo/<fd>`:
- `drm-driver`, `drm-pdev: <aaaa:bb:cc.d>` (the PCI device), `drm-client-id: <uint>` ("used
  to distinguish duplicated and shared file descriptors": one client, however many fds);
- `drm-engine-<engine>: <uint> ns` busy time, a counter, and `drm-engine-capacity-<engine>`
  (how many engines of that class; busy time can grow that many times faster than wall
  time); xe prints `drm-cycles-<engine>` / `drm-total-cycles-<engine>` instead;
- `drm-total-`, `drm-resident-`, `drm-shared-`... `<region>: <uint>[ KiB| MiB]` per memory
  region (`drm_print_memory_stats`), and amdgpu's legacy `drm-memory-<region>`, an alias of
  resident (`amdgpu_fdinfo.c`: "Legacy amdgpu keys, alias to drm-resident-memory-").
Device memory is the device-local regions: amdgpu `vram`, i915 `local0`.., xe `vram0`...

Reading another process's fds needs ptrace read access to it (`/proc/<pid>/fd` and
`fdinfo` check PTRACE_MODE_READ, `fs/proc/fd.c`): running as UID 0 with every capability
dropped, that is the processes that run as UID 0 too; others are skipped and counted.
"""

from __future__ import annotations

import logging
import os
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from exporter.attribution.resolver import own_pid_namespace, read_small
from exporter.ids import pci_address
from exporter.model import ProcessUsage
from exporter.settings.values import boolean
from exporter.sources import SourceOption

_UNITS = {"": 1, "B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}
_LINE = re.compile(r"^(?P<key>[a-z][a-z0-9_.-]*):\s*(?P<value>\S+)(?:\s+(?P<unit>\S+))?\s*$")
_LOCAL_REGION = re.compile(r"^(?:vram|local)\d*$")
_MEMORY_KINDS = ("resident", "memory", "total")
"""Which key to take a region's memory from, best first (`memory` is amdgpu's legacy alias
of resident; `total` counts memory not resident too, the last resort)."""
_READ_LIMIT = 16 * 1024


@dataclass(frozen=True, slots=True)
class DrmClient:
    driver: str
    pdev: str
    """Canonical PCI address."""
    client_id: int
    engines_ns: dict[str, int] = field(default_factory=dict)
    capacity: dict[str, int] = field(default_factory=dict)
    cycles: dict[str, tuple[int, int]] = field(default_factory=dict)
    """xe: engine -> (busy cycles, total cycles)."""
    memory_bytes: int | None = None
    """Resident memory in the device-local regions; None when the file has none."""


def parse_fdinfo(text: str) -> DrmClient | None:
    """One fdinfo file; None when it is not a DRM client of a PCI device."""
    values: dict[str, tuple[int, str]] = {}
    strings: dict[str, str] = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m is None:
            continue
        key, value, unit = m["key"], m["value"], m["unit"] or ""
        strings[key] = value
        if value.isdigit() and (unit in _UNITS or unit == "ns"):
            values[key] = (int(value), unit)
    driver, pdev = strings.get("drm-driver"), pci_address(strings.get("drm-pdev", ""))
    client = strings.get("drm-client-id", "")
    if not driver or pdev is None or not client.isdigit():
        return None
    engines: dict[str, int] = {}
    capacity: dict[str, int] = {}
    busy_cycles: dict[str, int] = {}
    total_cycles: dict[str, int] = {}
    memory: dict[tuple[str, str], int] = {}
    for key, (number, unit) in values.items():
        if key.startswith("drm-engine-capacity-"):
            capacity[key.removeprefix("drm-engine-capacity-")] = number
        elif key.startswith("drm-engine-") and unit == "ns":
            engines[key.removeprefix("drm-engine-")] = number
        elif key.startswith("drm-total-cycles-"):
            total_cycles[key.removeprefix("drm-total-cycles-")] = number
        elif key.startswith("drm-cycles-"):
            busy_cycles[key.removeprefix("drm-cycles-")] = number
        elif unit != "ns":
            for kind in _MEMORY_KINDS:
                region = key.removeprefix(f"drm-{kind}-")
                if region != key and _LOCAL_REGION.match(region):
                    memory[(kind, region)] = number * _UNITS[unit]
    cycles = {e: (busy_cycles[e], total_cycles[e]) for e in busy_cycles if e in total_cycles}
    return DrmClient(driver, pdev, int(client), engines, capacity, cycles, _device_memory(memory))


def _device_memory(memory: dict[tuple[str, str], int]) -> int | None:
    regions = {region for _, region in memory}
    if not regions:
        return None
    total = 0
    for region in regions:
        total += next(memory[(k, region)] for k in _MEMORY_KINDS if (k, region) in memory)
    return total


@dataclass(slots=True)
class Scan:
    clients: list[tuple[int, DrmClient]] = field(default_factory=list)
    """(host PID, client), each client once (the lowest PID holding it)."""
    unreadable: int = 0
    """Processes whose fds this process may not read (another UID, no CAP_SYS_PTRACE)."""


def scan(procfs: Path, drivers: Iterable[str]) -> Scan:
    """Every DRM client of `drivers` in every process of `procfs`."""
    wanted = set(drivers)
    out = Scan()
    seen: set[tuple[str, str, int]] = set()
    try:
        pids = sorted(int(e) for e in os.listdir(procfs) if e.isdigit())
    except OSError:
        return out
    for pid in pids:
        fd_dir = procfs / str(pid) / "fd"
        try:
            fds = os.listdir(fd_dir)
        except PermissionError:
            out.unreadable += 1
            continue
        except OSError:
            continue  # exited
        for fd in fds:
            try:
                target = os.readlink(fd_dir / fd)
            except OSError:
                continue  # closed since the listing
            if not target.startswith("/dev/dri/"):
                continue
            text = read_small(procfs / str(pid) / "fdinfo" / fd, _READ_LIMIT)
            client = parse_fdinfo(text) if text is not None else None
            if client is None or client.driver not in wanted:
                continue
            key = (client.driver, client.pdev, client.client_id)
            if key not in seen:
                seen.add(key)
                out.clients.append((pid, client))
    return out


class Busy:
    """Per-client engine busy fractions between two scans."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._last: dict[tuple[str, int], tuple[float, DrmClient]] = {}

    def update(self, clients: Iterable[DrmClient]) -> dict[tuple[str, int], float]:
        """(pdev, client id) -> the busiest engine class's busy fraction since the last
        scan (engine time over wall time and engine count; xe: busy over total cycles).
        A client seen for the first time, or whose counters went back, has none yet."""
        now = self._clock()
        current = {(c.pdev, c.client_id): c for c in clients}
        out: dict[tuple[str, int], float] = {}
        for key, client in current.items():
            last = self._last.get(key)
            if last is None:
                continue
            fractions = _fractions(client, last[1], now - last[0])
            if fractions:
                out[key] = max(fractions)
        self._last = {key: (now, client) for key, client in current.items()}
        return out


def _fractions(client: DrmClient, before: DrmClient, seconds: float) -> list[float]:
    """Busy fraction per engine class; none when any counter went back (the id now names
    another client: a driver reload restarts the ids) or no time passed."""
    went_back = any(
        ns < before.engines_ns.get(engine, 0) for engine, ns in client.engines_ns.items()
    ) or any(
        busy < before.cycles.get(engine, (0, 0))[0] for engine, (busy, _) in client.cycles.items()
    )
    if went_back or seconds <= 0:
        return []
    found = []
    for engine, ns in client.engines_ns.items():
        was = before.engines_ns.get(engine)
        if was is None or ns < was or seconds <= 0:
            continue
        engines = max(1, client.capacity.get(engine, 1))
        found.append(min(1.0, (ns - was) / 1e9 / seconds / engines))
    for engine, (busy, total) in client.cycles.items():
        if engine not in before.cycles:
            continue
        was_busy, was_total = before.cycles[engine]
        if busy < was_busy or total <= was_total:
            continue
        engines = max(1, client.capacity.get(engine, 1))
        found.append(min(1.0, (busy - was_busy) / (total - was_total) / engines))
    return found


def processes_option(what: str) -> SourceOption:
    """`--collector.NAME.processes` of a DRM GPU source: `what` it reads per process."""
    return SourceOption("processes", what, "true", boolean)


class DrmProcesses:
    """What a sysfs source adds for its driver(s): one `ProcessUsage` per (process, device)
    from the processes' DRM clients, summed over the process's clients."""

    def __init__(
        self,
        procfs: Path,
        drivers: tuple[str, ...],
        clock: Callable[[], float],
        log: logging.Logger,
    ) -> None:
        self.procfs = procfs
        self.drivers = drivers
        self.busy = Busy(clock)
        self.log = log
        self._said = ""

    def read(self, devices_by_pdev: dict[str, str]) -> list[ProcessUsage]:
        reason = own_pid_namespace(self.procfs)
        if reason:
            self._say(f"DRM fdinfo not read: {reason}")
            return []
        found = scan(self.procfs, self.drivers)
        if found.unreadable:
            self._say(
                f"DRM fdinfo: {found.unreadable} processes' fds are not readable (another "
                "UID; reading them needs CAP_SYS_PTRACE, see docs/attribution.md)"
            )
        busy = self.busy.update(c for _, c in found.clients)
        memory: dict[tuple[int, str], list[int | None]] = defaultdict(list)
        utilization: dict[tuple[int, str], list[float]] = defaultdict(list)
        for pid, client in found.clients:
            device_id = devices_by_pdev.get(client.pdev)
            if device_id is None:
                continue  # a device this source does not report
            memory[(pid, device_id)].append(client.memory_bytes)
            fraction = busy.get((client.pdev, client.client_id))
            if fraction is not None:
                utilization[(pid, device_id)].append(fraction)
        out = []
        for (pid, device_id), amounts in sorted(memory.items()):
            known = [m for m in amounts if m is not None]
            fractions = utilization.get((pid, device_id))
            out.append(
                ProcessUsage(
                    device_id,
                    pid,
                    float(sum(known)) if known else None,
                    sum(fractions) if fractions else None,
                )
            )
        return out

    def _say(self, message: str) -> None:
        if message != self._said:
            self.log.info("%s", message)
            self._said = message
