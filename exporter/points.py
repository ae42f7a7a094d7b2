"""Snapshot -> points: the neutral form both sinks render.

A `Point` is one value of one metric-spec row with its OpenTelemetry attributes. The
Prometheus sink translates names and attribute keys; the OTLP sink uses them as they
are (with `k8s.node.name` moved to the resource). Neither sink knows a metric name.
"""

from __future__ import annotations

import functools
import itertools
import platform
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import NamedTuple

from exporter import __version__
from exporter.metrics import NODE_ATTRIBUTE, SPECS, MetricSpec
from exporter.model import (
    Attributes,
    Device,
    Holder,
    JoinedDevice,
    Layout,
    Owner,
    PairPlacement,
    Snapshot,
)

HELD_METHODS = ("GetAllocatableResources", "List")
"""The PodResources calls whose empty answers a restarting kubelet's window can hold
(exporter/podresources/settle.py): one `held` series each, 0 or 1."""


class Point(NamedTuple):
    """A tuple, not a frozen dataclass: a dense node makes ~1,000 a cycle, at a third of
    the cost of a frozen dataclass's __init__."""

    spec: MetricSpec
    attributes: Attributes
    value: float


def device_attributes(joined: JoinedDevice) -> Attributes:
    """Every identity attribute and the holder (`hw.info`, the landing page)."""
    return _attributes(joined, joined.reading.device.attributes)


def series_attributes(joined: JoinedDevice) -> Attributes:
    """What every value series of a device carries: the keys dashboards filter and group
    by (`hw.id`, type, vendor, model, parent) and the holder. The vendor identity (driver
    version, serial, PCI bus id, index, minor, MIG ids...) lives once on `hw.info`: a
    third fewer bytes, and a driver upgrade does not rename every series."""
    return _attributes(joined, ())


def _attributes(joined: JoinedDevice, extra: Attributes) -> Attributes:
    return _cached_attributes(joined.reading.device, joined.holder, extra)


@functools.lru_cache(maxsize=4096)
def _cached_attributes(device: Device, holder: Holder | None, extra: Attributes) -> Attributes:
    """Devices and holders rarely change between cycles: built once per (device, holder)."""
    pairs: list[tuple[str, str]] = [
        ("hw.id", device.id),
        ("hw.type", device.type),
        ("hw.vendor", device.vendor),
        ("hw.model", device.model),
        ("hw.parent", device.parent),
        *extra,
    ]
    if holder is not None:
        pairs += [
            ("k8s.namespace.name", holder.namespace),
            ("k8s.pod.name", holder.pod),
            ("k8s.container.name", holder.container),
        ]
    return tuple((k, v) for k, v in pairs if v)


_new = tuple.__new__
"""`_new(Point, (spec, attributes, value))`: a Point without its Python-level `__new__`."""


@functools.lru_cache(maxsize=4096)
def _value_series(
    base: Attributes, layout: Layout, node: Attributes
) -> tuple[tuple[MetricSpec, Attributes], ...]:
    """The spec and the whole attributes of each value of a device's reading: built once per
    (device and holder, layout, node), as a reading's layout and a device's attributes are
    the same objects cycle after cycle. The same attribute tuples each cycle also make the
    Prometheus sink's comparison of this cycle's series with the last a matter of identity."""
    return tuple(
        (SPECS[metric], base + attributes + node)
        for metric, attributes in zip(layout.metrics, layout.attributes, strict=True)
    )


def points(snapshot: Snapshot, *, with_node: bool = True) -> Iterator[Point]:
    """Every point of the snapshot, grouped by metric in spec-table order."""
    node: Attributes = ((NODE_ATTRIBUTE, snapshot.node),) if with_node and snapshot.node else ()
    by_metric: dict[str, list[Point]] = {name: [] for name in SPECS}
    info_spec, info = SPECS["hw.info"], by_metric["hw.info"]
    for joined in snapshot.devices:
        info.append(Point(info_spec, device_attributes(joined) + node, 1.0))
        reading = joined.reading
        values = _value_series(series_attributes(joined), reading.layout, node)
        for (spec, attributes), value in zip(values, reading.values, strict=True):
            by_metric[spec.name].append(_new(Point, (spec, attributes, value)))
    for point in _allocation_points(snapshot, node):
        by_metric[point.spec.name].append(point)
    for point in _pod_points(snapshot, node):
        by_metric[point.spec.name].append(point)
    for point in _workload_points(snapshot, node):
        by_metric[point.spec.name].append(point)
    for point in _exporter_points(snapshot, node):
        by_metric[point.spec.name].append(point)
    series = SPECS["kube_device_exporter.series"]
    total = sum(len(p) for p in by_metric.values()) + 1
    by_metric[series.name] = [Point(series, node, float(total))]
    return itertools.chain.from_iterable(by_metric.values())  # in SPECS order, as made


def _allocation_points(snapshot: Snapshot, node: Attributes) -> Iterator[Point]:
    info = SPECS["hw.allocation.info"]
    devices = {d.reading.device.id: d.reading.device for d in snapshot.devices}
    for alloc in snapshot.allocations:
        device = devices.get(alloc.device_id)
        pairs = (
            ("hw.id", alloc.device_id),
            ("hw.type", device.type if device else ""),
            ("hw.vendor", device.vendor if device else ""),
            ("hw.model", device.model if device else ""),
            ("k8s.namespace.name", alloc.holder.namespace),
            ("k8s.pod.name", alloc.holder.pod),
            ("k8s.container.name", alloc.holder.container),
            ("hw.allocation.kind", alloc.kind.value),
            ("hw.allocation.resource", alloc.resource_name),
            ("hw.allocation.device_id", alloc.raw_id),
            ("hw.allocation.replica", alloc.replica),
            ("hw.allocation.shared", "true" if alloc.shared else "false"),
            ("hw.allocation.claim", alloc.claim),
            ("hw.allocation.pool", alloc.pool),
            ("hw.numa_node", ",".join(str(n) for n in alloc.numa_nodes)),
        )
        yield Point(info, tuple((k, v) for k, v in pairs if v) + node, 1.0)

    allocatable: Counter[str] = Counter()
    for devs in snapshot.allocatable:
        allocatable[devs.resource_name] += len(devs.device_ids)
    allocated: Counter[str] = Counter(
        a.resource_name for a in snapshot.allocations if a.kind.value == "device_plugin"
    )
    allocated.update(dict(snapshot.allocations_left_out))
    for resource in sorted(allocatable):
        attrs = (("hw.allocation.resource", resource), *node)
        yield Point(SPECS["hw.allocatable.devices"], attrs, float(allocatable[resource]))
    for resource in sorted(set(allocatable) | set(allocated)):
        attrs = (("hw.allocation.resource", resource), *node)
        yield Point(SPECS["hw.allocated.devices"], attrs, float(allocated[resource]))
    for resource, registered in snapshot.registered:
        attrs = (("hw.allocation.resource", resource), *node)
        yield Point(SPECS["hw.allocation.resource.registered"], attrs, float(registered))
    for resource, count in snapshot.unseen:
        attrs = (("hw.allocation.resource", resource), *node)
        yield Point(SPECS["kube_device_exporter.devices.unseen"], attrs, float(count))
    yield from _health_points(snapshot, node)
    yield from _numa_points(snapshot, node)
    yield from _placement_points(snapshot, node)
    yield from _energy_points(snapshot, node)


def _health_points(snapshot: Snapshot, node: Attributes) -> Iterator[Point]:
    """Per device: allocatable or not under its resource; per resource: how many are not."""
    not_allocatable: Counter[str] = Counter()
    for joined in snapshot.devices:
        if not joined.resource:
            continue
        not_allocatable[joined.resource] += not joined.allocatable
        attrs = (
            ("hw.id", joined.reading.device.id),
            ("hw.allocation.resource", joined.resource),
            *node,
        )
        yield Point(SPECS["hw.device.allocatable"], attrs, float(joined.allocatable))
    for resource in sorted(not_allocatable):
        attrs = (("hw.allocation.resource", resource), *node)
        yield Point(SPECS["hw.not_allocatable.devices"], attrs, float(not_allocatable[resource]))


def _numa_points(snapshot: Snapshot, node: Attributes) -> Iterator[Point]:
    for numa in snapshot.containers:
        holder = (
            ("k8s.namespace.name", numa.holder.namespace),
            ("k8s.pod.name", numa.holder.pod),
            ("k8s.container.name", numa.holder.container),
        )
        placed = [*numa.devices, *(("cpu", n) for n in numa.cpus), *numa.memory]
        for what, numa_node in placed:
            attrs = (*holder, ("hw.numa.resource", what), ("hw.numa_node", str(numa_node)), *node)
            yield Point(SPECS["hw.container.numa.node"], attrs, 1.0)
        yield Point(
            SPECS["hw.container.cpus.exclusive"], (*holder, *node), float(numa.exclusive_cpus)
        )
        if numa.aligned is not None:
            yield Point(SPECS["hw.container.numa.aligned"], (*holder, *node), float(numa.aligned))


def _placement_points(snapshot: Snapshot, node: Attributes) -> Iterator[Point]:
    for pair in snapshot.placements:
        attrs = (
            *_holder(pair.holder),
            ("hw.gpu.id", pair.gpu_id),
            ("hw.network.id", pair.nic_id),
            ("hw.pcie.placement", pair.level_name),
            *node,
        )
        yield Point(SPECS["hw.container.pcie.placement"], attrs, float(pair.level))
    for holder, (best, worst) in sorted(best_and_worst(snapshot.placements).items()):
        attrs = (*_holder(holder), *node)
        yield Point(SPECS["hw.container.pcie.placement.best"], attrs, float(best))
        yield Point(SPECS["hw.container.pcie.placement.worst"], attrs, float(worst))


def _energy_points(snapshot: Snapshot, node: Attributes) -> Iterator[Point]:
    spec = SPECS["hw.container.energy"]
    devices = {d.reading.device.id: d.reading.device for d in snapshot.devices}
    for energy in snapshot.container_energy:
        device = devices.get(energy.device_id)
        pairs = (
            ("hw.id", energy.device_id),
            ("hw.type", device.type if device else ""),
            ("hw.vendor", device.vendor if device else ""),
            ("hw.model", device.model if device else ""),
        )
        holder = _holder(energy.holder) if energy.holder else ()
        attrs = tuple((k, v) for k, v in pairs if v) + holder + node
        yield Point(spec, attrs, energy.joules)


def _holder(holder: Holder) -> Attributes:
    return (
        ("k8s.namespace.name", holder.namespace),
        ("k8s.pod.name", holder.pod),
        ("k8s.container.name", holder.container),
    )


def _pod_points(snapshot: Snapshot, node: Attributes) -> Iterator[Point]:
    """k8s.pod.workload.info and the API watch's self-metrics (--kubernetes.api only)."""
    info = SPECS["k8s.pod.workload.info"]
    for pod in snapshot.pods:
        holder = (("k8s.namespace.name", pod.namespace), ("k8s.pod.name", pod.pod))
        yield Point(info, holder + pod.attributes + node, 1.0)
    api = snapshot.kubeapi
    if api is None:
        return
    for (verb, resource, code), count in sorted(api.requests_total.items()):
        attrs = (("verb", verb), ("resource", resource), ("code", code), *node)
        yield Point(SPECS["kube_device_exporter.kubernetes.requests"], attrs, float(count))
    yield Point(SPECS["kube_device_exporter.kubernetes.up"], node, float(api.up))
    yield from refused_points(api.refused, node)
    yield Point(SPECS["kube_device_exporter.kubernetes.pods"], node, float(api.pods))
    yield Point(
        SPECS["kube_device_exporter.kubernetes.pods.source"], (("source", api.source), *node), 1.0
    )


def refused_points(
    refused: Mapping[tuple[str, str, str], int], node: Attributes
) -> Iterator[Point]:
    """`kube_device_exporter.peer.answers.refused` of (peer, request, reason) counts."""
    spec = SPECS["kube_device_exporter.peer.answers.refused"]
    for (peer, request, reason), count in sorted(refused.items()):
        attrs = (("peer", peer), ("request", request), ("reason", reason), *node)
        yield Point(spec, attrs, float(count))


def _workload_points(snapshot: Snapshot, node: Attributes) -> Iterator[Point]:
    """Per (device, container) sums, and per-process series when kept (opt-in)."""
    devices = {d.reading.device.id: d.reading.device for d in snapshot.devices}

    def identity(device_id: str, owner: Owner | None) -> list[tuple[str, str]]:
        device: Device | None = devices.get(device_id)
        pairs = [
            ("hw.id", device_id),
            ("hw.type", device.type if device else ""),
            ("hw.vendor", device.vendor if device else ""),
            ("hw.model", device.model if device else ""),
            ("hw.parent", device.parent if device else ""),
        ]
        if owner is not None:
            pairs += [
                ("k8s.namespace.name", owner.namespace),
                ("k8s.pod.name", owner.pod),
                ("k8s.container.name", owner.container),
            ]
        return pairs

    for usage in snapshot.container_usage:
        pairs = identity(usage.device_id, usage.owner)
        if usage.owner is not None:
            pairs += [
                ("k8s.pod.uid", usage.owner.pod_uid),
                ("hw.allocation.requested", "true" if usage.requested else "false"),
            ]
        attrs = tuple((k, v) for k, v in pairs if v) + node
        for name, value in (
            ("hw.gpu.container.memory.usage", usage.memory_bytes),
            ("hw.gpu.container.utilization", usage.utilization),
            ("hw.gpu.container.processes", float(usage.processes)),
        ):
            if value is not None:
                yield Point(SPECS[name], attrs, value)
    for proc in snapshot.processes:
        pairs = identity(proc.device_id, snapshot.owners.get(proc.pid))
        pairs.append(("process.pid", str(proc.pid)))
        attrs = tuple((k, v) for k, v in pairs if v) + node
        for name, value in (
            ("hw.gpu.process.memory.usage", proc.memory_bytes),
            ("hw.gpu.process.utilization", proc.utilization),
        ):
            if value is not None:
                yield Point(SPECS[name], attrs, value)


def _exporter_points(snapshot: Snapshot, node: Attributes) -> Iterator[Point]:
    def point(name: str, value: float, *attrs: tuple[str, str]) -> Point:
        return Point(SPECS[name], (*attrs, *node), value)

    yield point(
        "kube_device_exporter.build.info",
        1.0,
        ("version", __version__),
        ("python_version", platform.python_version()),
    )
    for health in snapshot.sources:
        src = ("source", health.name)
        yield point("kube_device_exporter.source.success", float(health.success), src)
        yield point("kube_device_exporter.source.duration", health.duration_seconds, src)
        yield point(
            "kube_device_exporter.source.field_errors", float(health.field_errors_total), src
        )
    pr = snapshot.podresources
    for (method, code), count in sorted(pr.requests_total.items()):
        yield point(
            "kube_device_exporter.podresources.requests",
            float(count),
            ("method", method),
            ("code", code),
        )
    for method, seconds in sorted(pr.last_duration_seconds.items()):
        yield point(
            "kube_device_exporter.podresources.request.duration", seconds, ("method", method)
        )
    yield point(
        "kube_device_exporter.podresources.up",
        float(pr.connected),
        ("api_version", pr.api_version),
    )
    yield point(
        "kube_device_exporter.podresources.last_success_timestamp", pr.last_success_timestamp
    )
    yield point(
        "kube_device_exporter.podresources.invalid_device_ids", float(pr.invalid_device_ids_total)
    )
    for method in HELD_METHODS:
        yield point(
            "kube_device_exporter.podresources.held", float(method in pr.held), ("method", method)
        )
    kubelet = "kubelet-podresources"
    yield from refused_points({(kubelet, m, r): n for (m, r), n in pr.refused.items()}, node)
    yield point("kube_device_exporter.cycle.duration", snapshot.cycle_duration_seconds)
    yield point("kube_device_exporter.cycles", float(snapshot.cycles_total))
    yield point("kube_device_exporter.attribution.enabled", float(snapshot.attribution))
    yield point(
        "kube_device_exporter.cycle.last_success_timestamp", snapshot.last_success_timestamp
    )
    for sample in snapshot.self_samples:
        yield Point(SPECS[sample.metric], (*sample.attributes, *node), sample.value)


def best_and_worst(pairs: Iterable[PairPlacement]) -> dict[Holder, tuple[int, int]]:
    """Per container: its best pair's level, and its worst GPU's best level (the GPU that
    is farthest from its nearest NIC: what a job that gives each GPU its nearest NIC, as
    NCCL does, is held back by). The worst of all pairs would say nothing: on any
    two-socket node some GPU-NIC pair crosses sockets."""
    nearest: dict[Holder, dict[str, int]] = {}
    for pair in pairs:
        per_gpu = nearest.setdefault(pair.holder, {})
        per_gpu[pair.gpu_id] = min(per_gpu.get(pair.gpu_id, pair.level), pair.level)
    return {h: (min(g.values()), max(g.values())) for h, g in nearest.items()}
