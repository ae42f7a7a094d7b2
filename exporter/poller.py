"""The cycle: read the kubelet and every source, join, swap in one immutable snapshot.

Scrapes never come here: sinks get the snapshot once per cycle. A failing or hung
source only loses its own devices for that cycle; a failing kubelet keeps the last good
answer for `stale_after` seconds (pod labels must not flap on one rate-limited call).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from exporter.attribution.resolver import ProcessResolver
from exporter.attribution.usage import container_usage
from exporter.join import ResourceMatcher, join
from exporter.log import StateLog
from exporter.model import (
    ContainerUsage,
    KubeApiHealth,
    PodInfo,
    PodResourcesHealth,
    PodResourcesState,
    Sample,
    Snapshot,
    SourceHealth,
    SourceResult,
)
from exporter.numa import CpuNodeMap
from exporter.podresources.client import PodResourcesClient, PodResourcesError
from exporter.sinks import SelfMetrics, SnapshotSink
from exporter.sources import RestartRequired, Source
from exporter.sources.resources import SOURCE_FIXES, source_for
from exporter.threads import in_daemon_thread

log = logging.getLogger("exporter.poller")


class PodsView(Protocol):
    """The Kubernetes API's view of this node's pods, kept current elsewhere (no I/O here)."""

    def pod_infos(self, holders: Iterable[tuple[str, str]]) -> tuple[PodInfo, ...]: ...

    def health(self) -> KubeApiHealth: ...


@dataclass(slots=True)
class _SourceSlot:
    name: str
    source: Source
    running: asyncio.Future[SourceResult] | None = None
    field_errors_total: int = 0


class Poller:
    def __init__(
        self,
        *,
        node: str,
        sources: Mapping[str, Source],
        client: PodResourcesClient | None,
        sinks: Sequence[SnapshotSink] = (),
        self_metrics: Sequence[SelfMetrics] = (),
        matcher: ResourceMatcher | None = None,
        interval: float = 10.0,
        source_timeout: float = 5.0,
        stale_after: float = 300.0,
        cpu_nodes: CpuNodeMap | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        pods: PodsView | None = None,
        resolver: ProcessResolver | None = None,
        process_series: bool = False,
    ) -> None:
        self.node = node
        self.pods = pods
        self.client = client
        self.sinks = list(sinks)
        self.self_metrics = list(self_metrics)
        self.matcher = matcher or ResourceMatcher()
        self.interval = interval
        self.source_timeout = source_timeout
        self.stale_after = stale_after
        self._clock = clock
        self._wall_clock = wall_clock
        self.cpu_nodes = cpu_nodes
        self._resources: dict[str, str] = {}
        """hw.id -> the resource the kubelet listed it under: a device that leaves the
        allocatable list (its plugin marked it unhealthy) keeps its resource."""
        self._slots = [_SourceSlot(name, src) for name, src in sources.items()]
        self.resolver = resolver
        self.process_series = process_series
        """Keep per-process series (bare PIDs: one series per process, opt-in)."""
        self._state: PodResourcesState | None = None
        self._state_at = 0.0
        self._cycles = 0
        self._last_success = 0.0
        self._states = StateLog(log)
        self.snapshot: Snapshot | None = None
        self.ready = asyncio.Event()
        self.restart_required: dict[str, str] = {}
        """source -> why only a new process can recover it (/healthz fails while set)."""

    async def run_once(self) -> Snapshot:
        started = self._clock()
        state, results = await asyncio.gather(self._poll_kubelet(), self._collect_all())
        healths = [health for _, health in results]
        cpu_nodes = await self._cpu_nodes()
        joined = join(
            [r for r, _ in results if r is not None],
            state,
            self.matcher,
            cpu_nodes=cpu_nodes,
            known_resources=self._resources,
        )
        self._resources.update(
            (d.reading.device.id, d.resource) for d in joined.devices if d.resource
        )
        processes = tuple(p for r, _ in results if r is not None for p in r.processes)
        owners = None
        if self.resolver is not None:
            resolver = self.resolver
            owners = await asyncio.to_thread(resolver.resolve, [p.pid for p in processes])
        usage: tuple[ContainerUsage, ...] = ()
        if owners is not None:
            devices = [d.reading.device for d in joined.devices]
            usage = container_usage(processes, owners, joined.allocations, devices)
        self._cycles += 1
        self._last_success = self._wall_clock()
        self_samples: list[Sample] = []
        for provider in self.self_metrics:
            self_samples += provider.self_samples()
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
            podresources=self.client.health() if self.client else PodResourcesHealth(),
            cycle_duration_seconds=self._clock() - started,
            cycles_total=self._cycles,
            last_success_timestamp=self._last_success,
            self_samples=tuple(self_samples),
            unseen=joined.unseen,
            containers=joined.containers,
            pods=self.pods.pod_infos((a.holder.namespace, a.holder.pod) for a in joined.allocations)
            if self.pods
            else (),
            kubeapi=self.pods.health() if self.pods else None,
        )
        self._warn_unseen(joined.unseen, healths)
        for sink in self.sinks:
            await asyncio.to_thread(sink.update, snapshot)
        self.snapshot = snapshot
        self.ready.set()
        return snapshot

    async def run_forever(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            started = self._clock()
            try:
                await self.run_once()
            except Exception:  # a bug in one cycle must not end the agent
                log.exception("cycle failed")
            delay = max(0.0, self.interval - (self._clock() - started))
            try:
                await asyncio.wait_for(stop.wait(), timeout=delay)
            except TimeoutError:
                continue

    async def close(self, timeout: float = 3.0) -> None:
        """Close every source (in daemon threads: a source stuck in a driver call is left
        behind after `timeout`) and the kubelet channel."""
        closing = [in_daemon_thread(s.source.close, f"close-{s.name}") for s in self._slots]
        if closing:
            done, pending = await asyncio.wait(closing, timeout=timeout)
            for future in done:
                if future.exception() is not None:
                    log.warning("closing a source failed: %s", future.exception())
            for slot, future in zip(self._slots, closing, strict=True):
                if future in pending:
                    log.warning(
                        "source %s did not close in %gs (stuck in a call)", slot.name, timeout
                    )
        if self.client is not None:
            await self.client.close()

    def _warn_unseen(
        self, unseen: tuple[tuple[str, int], ...], healths: Sequence[SourceHealth]
    ) -> None:
        """One warning per resource when the kubelet can allocate devices no source sees,
        naming the likely cause; one info when they are seen again."""
        by_name = {h.name: h for h in healths}
        for resource, count in unseen:
            key = f"unseen/{resource}"
            if count == 0:
                self._states.ok(key, f"every allocatable {resource} device is seen again")
                continue
            self._states.failed(
                key,
                f"the kubelet can allocate {count} {resource} device(s) that no source sees: "
                + _likely_cause(resource, by_name),
            )

    async def _cpu_nodes(self) -> Mapping[int, int]:
        if self.cpu_nodes is None:
            return {}
        if self.cpu_nodes.stale():
            return await asyncio.to_thread(self.cpu_nodes.get)
        return self.cpu_nodes.get()

    # --- kubelet --------------------------------------------------------------------

    async def _poll_kubelet(self) -> PodResourcesState | None:
        if self.client is None:
            return None
        try:
            state = await self.client.poll()
        except PodResourcesError as exc:
            if exc.code != "BACKOFF":
                self._states.failed(
                    f"kubelet/{exc.code}", f"PodResources unavailable ({exc}); retrying every cycle"
                )
            if self._state is not None and self._clock() - self._state_at > self.stale_after:
                log.warning("dropping PodResources data older than %.0fs", self.stale_after)
                self._state = None
            return self._state
        self._states.ok_all("kubelet/", f"PodResources {state.api_version} answering")
        self._state, self._state_at = state, self._clock()
        return state

    # --- sources --------------------------------------------------------------------

    async def _collect_all(self) -> list[tuple[SourceResult | None, SourceHealth]]:
        return list(await asyncio.gather(*(self._collect(slot) for slot in self._slots)))

    async def _collect(self, slot: _SourceSlot) -> tuple[SourceResult | None, SourceHealth]:
        started = self._clock()
        if slot.running is not None and not slot.running.done():
            # Still stuck in last cycle's call (a hung driver): do not pile up threads.
            return None, self._fail(slot, started, "previous collection still running")
        timed = _Timed(slot.source.collect, self._clock)
        slot.running = in_daemon_thread(timed, f"collect-{slot.name}")
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


class _Timed:
    """Runs a source's collect() in the worker thread and times it there: the time a source
    takes, not the time the event loop took to notice (which is the same for every source)."""

    def __init__(self, collect: Callable[[], SourceResult], clock: Callable[[], float]) -> None:
        self.collect = collect
        self.clock = clock
        self.seconds: float | None = None

    def __call__(self) -> SourceResult:
        started = self.clock()
        try:
            return self.collect()
        finally:
            self.seconds = self.clock() - started


def _likely_cause(resource: str, healths: Mapping[str, SourceHealth]) -> str:
    source = source_for(resource)
    health = healths.get(source)
    fix = SOURCE_FIXES.get(source, "")
    if health is None:
        return f"the {source or 'matching'} collector is not enabled (--collector.{source})"
    if not health.success:
        return f"source {source} is failing ({health.error})"
    if health.absent:
        if source == "nvml":
            return (
                f"this pod has no NVML ({health.absent}): {fix}; on GKE use the gke overlay "
                "(driver mounts); see docs/deploy.md"
            )
        return f"source {source} finds no devices ({health.absent}): {fix}"
    return (
        "the device IDs match no device a source reports (compare `kube-device-exporter "
        "podresources` with /api/devices)"
    )
