"""The cycle: read the kubelet and every source, join, swap in one immutable snapshot.

Scrapes never come here: sinks get the snapshot once per cycle. A failing or hung
source only loses its own devices for that cycle; a failing kubelet keeps the last good
answer for `stale_after` seconds (pod labels must not flap on one rate-limited call).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Protocol

from exporter.attribution.resolver import ProcessResolver
from exporter.attribution.usage import HeldIndex, container_usage
from exporter.checks import warn_unseen
from exporter.cycle.steps import SnapshotStep, Steps
from exporter.derive.numa import CpuNodeMap
from exporter.dra.view import DraView
from exporter.ids import ResourceMatcher
from exporter.join import JoinResult, join
from exporter.model import (
    ContainerUsage,
    JoinedDevice,
    KubeApiHealth,
    PodInfo,
    PodResourcesHealth,
    PodResourcesState,
    Sample,
    Snapshot,
    SourceHealth,
    SourceResult,
)
from exporter.podresources.client import PodResourcesClient
from exporter.podresources.schedule import SOONEST, KubeletSchedule
from exporter.runtime.log import StateLog
from exporter.runtime.threads import BoundedWorker, DaemonWorker, Timed, in_daemon_thread
from exporter.sinks import SelfMetrics, SnapshotSink
from exporter.sources import RestartRequired, Source

log = logging.getLogger("exporter.poller")


class PodsView(Protocol):
    """The Kubernetes API's view of this node's pods, kept current elsewhere (no I/O here)."""

    def pod_infos(self, holders: Iterable[tuple[str, str]]) -> tuple[PodInfo, ...]: ...

    def health(self) -> KubeApiHealth: ...


class AfterCycle(Protocol):
    """A named step that publishes nothing (the heap trim), run after the sinks took the
    snapshot; one that raises is logged by name and the cycle goes on."""

    name: str

    def after_cycle(self, snapshot: Snapshot) -> None: ...


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


class Poller:
    def __init__(
        self,
        *,
        node: str,
        sources: Mapping[str, Source],
        client: PodResourcesClient | None,
        sinks: Sequence[SnapshotSink] = (),
        after_cycle: Sequence[AfterCycle] = (),
        after_publish: Sequence[Callable[[], None]] = (),
        self_metrics: Sequence[SelfMetrics] = (),
        matcher: ResourceMatcher | None = None,
        interval: float = 10.0,
        kubelet_every: float = 0.0,
        source_timeout: float = 5.0,
        stale_after: float = 300.0,
        cpu_nodes: CpuNodeMap | None = None,
        absent_recheck: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        pods: PodsView | None = None,
        resolver: ProcessResolver | None = None,
        process_series: bool = False,
        dra: DraView | None = None,
        steps: Sequence[SnapshotStep] = (),
    ) -> None:
        self.node = node
        self.pods = pods
        self.client = client
        self.sinks = list(sinks)
        self.after_cycle = list(after_cycle)
        self.after_publish = list(after_publish)
        """Work for the end of a cycle that is not the cycle's (the /metrics body built
        ahead of a scrape): in the same worker thread, after the duration is taken."""
        self.self_metrics = list(self_metrics)
        self.matcher = matcher or ResourceMatcher()
        self.interval = interval
        self.source_timeout = source_timeout
        self.stale_after = stale_after
        self.absent_recheck = absent_recheck
        self._clock, self._wall_clock = clock, wall_clock
        self._publisher = BoundedWorker("publish")
        self.cpu_nodes = cpu_nodes
        self._resources: dict[str, str] = {}
        """hw.id -> the resource it was listed under: kept when it leaves the list (unhealthy)."""
        self._slots = [_SourceSlot(name, src) for name, src in sources.items()]
        self.resolver = resolver
        self.process_series = process_series
        """Keep per-process series (bare PIDs: one series per process, opt-in)."""
        self.dra = dra
        """ResourceSlice identities for the join; told the allocations after it."""
        self.steps = Steps(steps)
        """Derived parts of a snapshot (GPU-NIC placement, energy per container), in order."""
        self._cycles = 0
        self._last_success = 0.0
        self._states = StateLog(log)
        self.kubelet = KubeletSchedule(
            client,
            every=_cycles(kubelet_every, interval),
            soonest=_cycles(SOONEST, interval),
            stale_after=stale_after,
            clock=clock,
        )
        self._last_duration: float | None = None
        self._join_cache: tuple[object, JoinResult] | None = None
        self._held = HeldIndex()
        self.snapshot: Snapshot | None = None
        self.ready = asyncio.Event()
        self.restart_required: dict[str, str] = {}
        """source -> why only a new process can recover it (/healthz fails while set)."""

    async def run_once(self) -> Snapshot:
        started = self._clock()
        kubelet = self.kubelet.start()
        results = await self._collect_all()
        kubelet = self.kubelet.devices_seen(_seen(results)) or kubelet
        budget = min(self.source_timeout, self.interval / 2)
        state, answered = await self.kubelet.state(kubelet, started, budget)
        cpu_nodes = await self._cpu_nodes()
        publish = partial(self._publish, started, state, answered, results, cpu_nodes)
        snapshot = await self._publisher.run(publish, self.interval + self.source_timeout)
        self.snapshot = snapshot
        self.ready.set()
        return snapshot

    def _publish(
        self,
        started: float,
        state: PodResourcesState | None,
        answered: bool,
        results: list[tuple[SourceResult | None, SourceHealth]],
        cpu_nodes: Mapping[int, int],
    ) -> Snapshot:
        """Join, attribute processes, build the snapshot and hand it to the sinks: in a
        worker thread, so the event loop keeps serving while a big node is worked through."""
        healths = [health for _, health in results]
        joined = self._join([r for r, _ in results if r is not None], state, cpu_nodes)
        if self.dra is not None:
            joined = replace(joined, allocations=tuple(self.dra.extended(joined.allocations)))
            self.dra.observe(joined.allocations)
        self._resources.update(
            (d.reading.device.id, d.resource) for d in joined.devices if d.resource
        )
        processes = tuple(p for r, _ in results if r is not None for p in r.processes)
        owners = None
        if self.resolver is not None:
            owners = self.resolver.resolve([p.pid for p in processes])
        usage: tuple[ContainerUsage, ...] = ()
        if owners is not None:
            devices = [d.reading.device for d in joined.devices]
            held = partial(self._held.held, joined.allocations, devices)
            usage = container_usage(processes, owners, joined.allocations, devices, held=held)
        self._cycles += 1
        self._last_success = self._wall_clock()
        self_samples: list[Sample] = []
        for provider in self.self_metrics:
            self_samples += provider.self_samples()
        health = self.client.health() if self.client else PodResourcesHealth()
        if not answered:
            health = replace(health, connected=False)
        snapshot = Snapshot(
            timestamp=self._last_success,
            node=self.node,
            devices=joined.devices,
            allocations=joined.allocations,
            allocatable=joined.allocatable,
            processes=processes if self.process_series else (),
            owners=owners or {},
            container_usage=usage,
            attribution=owners is not None,
            sources=tuple(healths),
            podresources=health,
            cycle_duration_seconds=(
                self._clock() - started if self._last_duration is None else self._last_duration
            ),
            cycles_total=self._cycles,
            last_success_timestamp=self._last_success,
            self_samples=tuple(self_samples),
            unseen=joined.unseen,
            registered=joined.registered,
            containers=joined.containers,
            pods=self.pods.pod_infos((a.holder.namespace, a.holder.pod) for a in joined.allocations)
            if self.pods
            else (),
            kubeapi=self.pods.health() if self.pods else None,
        )
        snapshot = self.steps(snapshot, cpu_nodes)
        warn_unseen(self._states, joined, healths, self.matcher)
        for sink in self.sinks:
            sink.update(snapshot)
        for step in self.after_cycle:
            try:
                step.after_cycle(snapshot)
            except Exception:
                log.exception("after-cycle step %s failed", step.name)
        self._last_duration = self._clock() - started
        for hook in self.after_publish:
            hook()
        return snapshot

    def _join(
        self,
        results: list[SourceResult],
        state: PodResourcesState | None,
        cpu_nodes: Mapping[int, int],
    ) -> JoinResult:
        """The join, redone only when the pods, the set of devices or the CPU map changed;
        otherwise last cycle's assignment is kept and only the readings are new."""
        readings = [r for result in results for r in result.readings]
        devices = tuple(r.device for r in readings)
        dra = self.dra.identity(devices) if self.dra is not None else None
        dra_numa = self.dra.numa() if self.dra is not None else None
        key = (state, devices, tuple(sorted(cpu_nodes.items())), dra, dra_numa)
        cached = self._join_cache
        if cached is not None and cached[0] == key:
            last = cached[1]
            joined_devices = tuple(
                JoinedDevice(r, j.holder, j.holders, j.allocatable, j.resource)
                for r, j in zip(readings, last.devices, strict=True)
            )
            return replace(last, devices=joined_devices)
        joined = join(
            results,
            state,
            self.matcher,
            cpu_nodes=cpu_nodes,
            known_resources=self._resources,
            dra=dra,
            dra_numa=dra_numa,
        )
        self._join_cache = (key, joined)
        return joined

    async def run_forever(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            started = self._clock()
            try:
                await self.run_once()
            except Exception:  # a bug in one cycle must not end the agent
                log.exception("cycle failed")
            if self._cycles == 1:
                # What lives after the first cycle (modules, sources, caches) lives for good:
                # out of the collector's sight, later collections scan only what cycles make.
                gc.collect()
                gc.freeze()
            delay = max(0.0, self.interval - (self._clock() - started))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)

    async def close(self, timeout: float = 3.0) -> dict[str, str]:
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

    # --- sources --------------------------------------------------------------------

    async def _collect_all(self) -> list[tuple[SourceResult | None, SourceHealth]]:
        return list(await asyncio.gather(*(self._collect(slot) for slot in self._slots)))

    async def _collect(self, slot: _SourceSlot) -> tuple[SourceResult | None, SourceHealth]:
        started = self._clock()
        if slot.absent is not None and started - slot.absent_since < self.absent_recheck:
            # No such hardware on this node: asked again every `absent_recheck` seconds,
            # not every cycle (a GPU node runs four sysfs sources that find nothing).
            return slot.absent, SourceHealth(
                slot.name, True, 0.0, slot.field_errors_total, absent=slot.absent.absent
            )
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
        tuple((d.device.id, *_health(d.samples)) for r in done for d in r.readings),
        tuple((p.device_id, p.pid) for r in done for p in r.processes),
    )


def _health(samples: Sequence[Sample]) -> tuple[str, float]:
    """A device's `hw.status` state and its XIDs so far, from its samples."""
    state, xids = "", 0.0
    for sample in samples:
        metric = sample.metric
        if metric == "hw.status":
            if sample.value:
                state = sample.attributes[0][1]
        elif metric == "hw.gpu.xid.errors":
            xids += sample.value
    return state, xids
