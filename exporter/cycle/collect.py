"""The collect stage: every source, the kubelet and the CPU map, on the event loop.

Sources are blocking (NVML calls, file reads): each runs in a daemon thread of its own for
as long as it lives, with `source_timeout`; one still stuck from the last cycle is not
called again (no thread pile-up on a hung driver); one that finds no hardware is asked
again every `absent_recheck` seconds, not every cycle. A failing or hung source loses only
its own devices for the cycle. The kubelet is asked when its schedule says so
(podresources/schedule.py) and waited for at most half an interval: a slow kubelet keeps
the last good answer, marked stale, and never holds up the device readings.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass

from exporter.cycle.pipeline import Cycle
from exporter.derive.numa import CpuNodeMap
from exporter.model import DeviceReading, SourceHealth, SourceResult
from exporter.podresources.client import PodResourcesClient
from exporter.podresources.schedule import KubeletSchedule, PodChanges
from exporter.runtime.log import StateLog
from exporter.runtime.threads import DaemonWorker, Timed, in_daemon_thread
from exporter.settings.config import DEFAULTS
from exporter.sources import RestartRequired, Source

log = logging.getLogger("exporter.poller")

ABSENT_RECHECK_SECONDS = 60.0
"""A source that found no hardware is asked again this often (a GPU node runs four sysfs
sources that find nothing)."""


@dataclass(slots=True)
class _SourceSlot:
    name: str
    source: Source
    running: asyncio.Future[SourceResult] | None = None
    field_errors_total: int = 0
    absent: SourceResult | None = None
    """The last result, while it says the hardware is not on this node."""
    absent_since: float = 0.0
    worker: DaemonWorker | None = None
    """The thread collect() runs in, cycle after cycle."""


class Collect:
    """The collect step (`pipeline.Collector`)."""

    name = "collect"

    def __init__(
        self,
        sources: Mapping[str, Source],
        client: PodResourcesClient | None,
        *,
        interval: float = DEFAULTS.collect_interval,
        kubelet_every: float = 0.0,
        source_timeout: float = DEFAULTS.collect_timeout,
        stale_after: float = DEFAULTS.podresources_stale_after,
        cpu_nodes: CpuNodeMap | None = None,
        absent_recheck: float = ABSENT_RECHECK_SECONDS,
        pods: PodChanges | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`kubelet_every`: seconds between kubelet polls while nothing changes (0: every
        cycle); `pods`: a pod feed whose events ask the kubelet (podresources/schedule.py)."""
        self.client = client
        self.interval = interval
        self.source_timeout = source_timeout
        self.cpu_nodes = cpu_nodes
        self.absent_recheck = absent_recheck
        self._clock = clock
        self._slots = [_SourceSlot(name, src) for name, src in sources.items()]
        self._states = StateLog(log)
        self.kubelet = KubeletSchedule(
            client,
            every=_cycles(kubelet_every, interval),
            stale_after=stale_after,
            pods=pods,
            clock=clock,
        )
        self.restart_required: dict[str, str] = {}
        """source -> why only a new process can recover it (/healthz fails while set)."""

    async def run(self, cycle: Cycle) -> None:
        kubelet = self.kubelet.start()
        started = self._clock()
        results = [self._still_absent(s, started) for s in self._slots]
        asked = [i for i, result in enumerate(results) if result is None]
        if len(asked) == 1:  # the usual GPU node: one source with hardware, no task for it
            results[asked[0]] = await self._collect(self._slots[asked[0]])
        elif asked:
            found = await asyncio.gather(*(self._collect(self._slots[i]) for i in asked))
            for i, result in zip(asked, found, strict=True):
                results[i] = result
        cycle.results = [r for r in results if r is not None]
        kubelet = self.kubelet.devices_seen(_seen(cycle.results)) or kubelet
        budget = min(self.source_timeout, self.interval / 2)
        cycle.kubelet, cycle.answered = await self.kubelet.state(kubelet, cycle.started, budget)
        cycle.cpu_nodes = await self._cpu_nodes()

    async def news(self) -> None:
        """Return when the kubelet has news the next cycle should not wait for (a pod
        event's poll answered differently: `KubeletSchedule.news`)."""
        await self.kubelet.news()

    async def close(self, timeout: float) -> dict[str, str]:
        """Close every source (in daemon threads: a source stuck in a driver call is left
        behind after `timeout`) and the kubelet channel; source -> why it did not close."""
        for slot in self._slots:
            if slot.worker is not None:
                slot.worker.stop()
        closing = [in_daemon_thread(s.source.close, f"close-{s.name}") for s in self._slots]
        problems: dict[str, str] = {}
        if closing:
            _, pending = await asyncio.wait(closing, timeout=timeout)
            for slot, future in zip(self._slots, closing, strict=True):
                if future in pending:
                    problems[slot.name] = f"did not close in {timeout:g}s (stuck in a call)"
                elif (exc := future.exception()) is not None:
                    problems[slot.name] = f"{type(exc).__name__}: {exc}"
        for name, problem in problems.items():
            log.warning("closing source %s failed: %s", name, problem)
        await self.kubelet.close()
        return problems

    async def _cpu_nodes(self) -> Mapping[int, int]:
        if self.cpu_nodes is None:
            return {}
        if self.cpu_nodes.stale():
            return await asyncio.to_thread(self.cpu_nodes.get)
        return self.cpu_nodes.get()

    def _still_absent(
        self, slot: _SourceSlot, now: float
    ) -> tuple[SourceResult | None, SourceHealth] | None:
        """The last result of a source that found no hardware, until it is asked again."""
        if slot.absent is None or now - slot.absent_since >= self.absent_recheck:
            return None
        return slot.absent, SourceHealth(
            slot.name, True, 0.0, slot.field_errors_total, absent=slot.absent.absent
        )

    async def _collect(self, slot: _SourceSlot) -> tuple[SourceResult | None, SourceHealth]:
        started = self._clock()
        if slot.running is not None and not slot.running.done():
            # Still stuck in last cycle's call (a hung driver): do not pile up threads.
            return None, self._fail(slot, started, "previous collection still running")
        timed = Timed(slot.source.collect, self._clock)
        if slot.worker is None:
            slot.worker = DaemonWorker(f"collect-{slot.name}")
        slot.running = slot.worker.submit(timed)
        try:
            result = await asyncio.wait_for(asyncio.shield(slot.running), self.source_timeout)
        except TimeoutError:
            return None, self._fail(slot, started, f"timed out after {self.source_timeout:g}s")
        except RestartRequired as exc:
            if slot.name not in self.restart_required:
                log.error("source %s needs a new process, /healthz now fails: %s", slot.name, exc)
            self.restart_required[slot.name] = str(exc)
            return None, self._fail(slot, started, f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - a source's failure is its own, not the cycle's
            return None, self._fail(slot, started, f"{type(exc).__name__}: {exc}", timed.seconds)
        self.restart_required.pop(slot.name, None)
        slot.field_errors_total += result.field_errors
        if result.absent and not result.readings:
            slot.absent, slot.absent_since = result, started
        else:
            slot.absent = None
        self._states.ok(f"source/{slot.name}", f"source {slot.name} collecting again")
        return result, SourceHealth(
            slot.name, True, timed.seconds or 0.0, slot.field_errors_total, absent=result.absent
        )

    def _fail(
        self, slot: _SourceSlot, started: float, error: str, seconds: float | None = None
    ) -> SourceHealth:
        self._states.failed(f"source/{slot.name}", f"source {slot.name} failed: {error}")
        elapsed = self._clock() - started if seconds is None else seconds
        return SourceHealth(slot.name, False, elapsed, slot.field_errors_total, error)


def _cycles(seconds: float, interval: float) -> int:
    """Whole cycles in `seconds`, rounded up (1 for a zero interval)."""
    return math.ceil(seconds / interval - 1e-9) if interval > 0 else 1


def _seen(results: list[tuple[SourceResult | None, SourceHealth]]) -> Hashable:
    """What the sources saw, for the kubelet's schedule: each device with its state and
    XID count (a device plugin's verdict follows from the same events), and each device's
    processes (a source that failed this cycle adds nothing)."""
    done = [r for r, _ in results if r is not None]
    return (
        tuple((d.device.id, *_health(d)) for r in done for d in r.readings),
        tuple((p.device_id, p.pid) for r in done for p in r.processes),
    )


def _health(reading: DeviceReading) -> tuple[str, float]:
    """A device's `hw.status` state and its XIDs so far, from its values."""
    layout, values = reading.layout, reading.values
    state = ""
    for at in layout.positions("hw.status"):
        if values[at]:
            state = layout.attributes[at][0][1]
    return state, sum((values[at] for at in layout.positions("hw.gpu.xid.errors")), 0.0)
