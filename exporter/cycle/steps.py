"""The steps of a cycle after collect: what each reads from the cycle and adds to it.

The features themselves know nothing of the cycle (a derived part is a function of a
snapshot, a sink takes a snapshot); these adapters put them in order. The composition root
(exporter/app.py) lists them in order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Protocol

from exporter.attribution.resolver import ProcessResolver
from exporter.attribution.usage import HeldIndex, container_usage
from exporter.checks import warn_unseen
from exporter.cycle.pipeline import Cycle, Stage, Step
from exporter.derive.budget import Budget
from exporter.dra.view import DraView
from exporter.ids import ResourceMatcher
from exporter.join import JoinResult, join
from exporter.model import (
    KubeApiHealth,
    PodInfo,
    PodResourcesHealth,
    Snapshot,
    joined_device,
)
from exporter.runtime.evolve import evolve
from exporter.runtime.log import StateLog
from exporter.sinks import SelfMetrics, SnapshotSink

log = logging.getLogger("exporter.poller")

SnapshotPart = Callable[[Snapshot, Mapping[int, int]], Snapshot]
"""(snapshot, CPU -> NUMA map) -> the snapshot with a derived part added."""


class PodsView(Protocol):
    """The Kubernetes API's view of this node's pods, kept current elsewhere (no I/O here)."""

    def pod_infos(self, holders: Iterable[tuple[str, str]]) -> tuple[PodInfo, ...]: ...

    def health(self) -> KubeApiHealth: ...


class Joiner:
    """The join step: redone only when the pods, the set of devices, the CPU map or the DRA
    identities changed; otherwise last cycle's assignment takes the new readings."""

    def __init__(self, matcher: ResourceMatcher, dra: DraView | None = None) -> None:
        self.matcher = matcher
        self.dra = dra
        self._resources: dict[str, str] = {}
        """hw.id -> the resource it was listed under: kept when it leaves the list (unhealthy)."""
        self._cache: tuple[object, JoinResult] | None = None

    def run(self, cycle: Cycle) -> None:
        cycle.joined = self._join(cycle)

    def _join(self, cycle: Cycle) -> JoinResult:
        """This cycle's join; `_resources` learns its devices' resources when it is made
        anew (last cycle's assignment, handed on, names the ones it already learned)."""
        results = cycle.collected
        readings = [r for result in results for r in result.readings]
        devices = tuple(r.device for r in readings)
        dra = self.dra.identity(devices) if self.dra is not None else None
        dra_numa = self.dra.numa() if self.dra is not None else None
        # What the claims say is not held (admin access, another container's request)
        # leaves the kubelet's answer before the join (exporter/dra/holders.py).
        kubelet = self.dra.narrow(cycle.kubelet) if self.dra is not None else cycle.kubelet
        key = (kubelet, devices, tuple(sorted(cycle.cpu_nodes.items())), dra, dra_numa)
        if self._cache is not None and self._cache[0] == key:
            last = self._cache[1]
            joined_devices = tuple(
                joined_device(r, j.holder, j.holders, j.allocatable, j.resource)
                for r, j in zip(readings, last.devices, strict=True)
            )
            return evolve(last, devices=joined_devices)
        joined = join(
            results,
            kubelet,
            self.matcher,
            cpu_nodes=cycle.cpu_nodes,
            known_resources=self._resources,
            dra=dra,
            dra_numa=dra_numa,
        )
        self._cache = (key, joined)
        self._resources.update(
            (d.reading.device.id, d.resource) for d in joined.devices if d.resource
        )
        return joined


def dra_allocations(dra: DraView) -> Step:
    """DRA allocations named by the extended resource a claim serves (KEP-5004); the view
    told what containers hold (for its series and its log)."""

    def run(cycle: Cycle) -> None:
        assert cycle.joined is not None
        allocations = tuple(dra.extended(cycle.joined.allocations))
        cycle.joined = evolve(cycle.joined, allocations=allocations)
        dra.observe(allocations)

    return Step("dra", Stage.BUILD, run)


class SnapshotBuilder:
    """The snapshot step: the joined devices and allocations, the sources' and the
    kubelet's health, and the pods the Kubernetes API knows."""

    def __init__(
        self,
        node: str,
        *,
        health: Callable[[], PodResourcesHealth] = PodResourcesHealth,
        pods: PodsView | None = None,
        process_series: bool = False,
        wall_clock: Callable[[], float],
    ) -> None:
        self.node = node
        self.health = health
        self.pods = pods
        self.process_series = process_series
        """Keep per-process series (bare PIDs: one series per process, opt-in)."""
        self._wall_clock = wall_clock

    def run(self, cycle: Cycle) -> None:
        joined = cycle.joined
        assert joined is not None
        now = self._wall_clock()
        health = self.health()
        if not cycle.answered:
            health = replace(health, connected=False)
        processes = tuple(p for r in cycle.collected for p in r.processes)
        assert cycle.previous_duration is not None  # the pipeline's
        pods = self.pods
        holders = (  # only with the API server's pods: a pass over every allocation
            [(a.holder.namespace, a.holder.pod) for a in joined.allocations] if pods else ()
        )
        cycle.snapshot = Snapshot(
            timestamp=now,
            node=self.node,
            devices=joined.devices,
            allocations=joined.allocations,
            allocatable=joined.allocatable,
            processes=processes if self.process_series else (),
            sources=tuple(cycle.healths),
            podresources=health,
            cycle_duration_seconds=cycle.previous_duration,
            cycles_total=cycle.number,
            last_success_timestamp=now,
            unseen=joined.unseen,
            registered=joined.registered,
            containers=joined.containers,
            pods=pods.pod_infos(holders) if pods else (),
            kubeapi=pods.health() if pods else None,
        )


class Attribution:
    """Process attribution: each process the sources saw to its container, and what each
    container uses of each device. Off for a cycle (the snapshot says so) when the host's
    /proc or the container logs cannot be read in time."""

    def __init__(self, resolver: ProcessResolver) -> None:
        self.resolver = resolver
        self._held = HeldIndex()

    def run(self, cycle: Cycle) -> None:
        snapshot = cycle.snapshot
        assert snapshot is not None
        processes = [p for r in cycle.collected for p in r.processes]
        owners = self.resolver.resolve([p.pid for p in processes])
        if owners is None:
            return
        devices = [d.reading.device for d in snapshot.devices]
        held = partial(self._held.held, snapshot.allocations, devices)
        usage = container_usage(processes, owners, snapshot.allocations, devices, held=held)
        cycle.snapshot = evolve(snapshot, owners=owners, container_usage=usage, attribution=True)


def derive(name: str, part: SnapshotPart) -> Step:
    """A part derived from the whole snapshot (GPU-NIC placement, energy per container)."""

    def run(cycle: Cycle) -> None:
        assert cycle.snapshot is not None
        cycle.snapshot = part(cycle.snapshot, cycle.cpu_nodes)

    return Step(name, Stage.DERIVE, run)


def unseen_warnings(matcher: ResourceMatcher) -> Step:
    """One warning per resource the kubelet can allocate and no source sees (as `doctor`
    says it), one line when they are seen again."""
    states = StateLog(log)

    def run(cycle: Cycle) -> None:
        assert cycle.joined is not None
        warn_unseen(states, cycle.joined, cycle.healths, matcher)

    return Step("unseen-warnings", Stage.DERIVE, run)


def exporter_series(providers: Sequence[SelfMetrics]) -> Step:
    """The exporter's own series from the parts that count things (the web server, OTLP,
    DRA, device events): fresh every cycle, also on the last good snapshot when this cycle
    built none. (The step failures are the pipeline's to add, `Cycle.to_publish`.)"""

    def run(cycle: Cycle) -> None:
        assert cycle.snapshot is not None
        own = tuple(s for provider in providers for s in provider.self_samples())
        cycle.snapshot = evolve(cycle.snapshot, self_samples=own)

    return Step("exporter-series", Stage.PUBLISH, run)


def budget(applied: Budget) -> Step:
    """The metric groups that are on and the series budget: what every sink publishes."""

    def run(cycle: Cycle) -> None:
        assert cycle.snapshot is not None
        cycle.published = applied.apply(cycle.snapshot)

    return Step("series-budget", Stage.PUBLISH, run)


def publish(name: str, sink: SnapshotSink) -> Step:
    """Hand the published snapshot to one sink (a sink that raises costs only itself)."""

    def run(cycle: Cycle) -> None:
        sink.update(cycle.to_publish())

    return Step(name, Stage.PUBLISH, run)


def after(name: str, work: Callable[[Snapshot], None]) -> Step:
    """Work after the cycle's duration is taken (the heap trim, bodies ahead of scrapes)."""

    def run(cycle: Cycle) -> None:
        assert cycle.snapshot is not None
        work(cycle.snapshot)

    return Step(name, Stage.AFTER, run)
