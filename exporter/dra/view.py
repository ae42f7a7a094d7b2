"""The poller's view of DRA: slice identities for the join, and the DRA series.

With `--kubernetes.dra` a `SliceWatcher` keeps this node's ResourceSlices (and the
cluster's DeviceTaintRules, where served) current in the background, and the pod watch
carries the pods' claim health; this object only reads their caches. Without it, a claimed
DRA device is joined by its name alone (the NVML source's `gpu.nvidia.com/gpu-<minor>`),
and whatever that cannot join is counted (`kube_device_exporter_dra_unidentified`) and
named once in the log, never missed silently.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from exporter.dra.identity import (
    DeviceKey,
    Identity,
    device_kind,
    device_taints,
    free_devices,
    identify,
    numa_nodes,
)
from exporter.dra.identity import unidentified as unidentified_of
from exporter.model import Allocation, AllocationKind, Device, Sample

if TYPE_CHECKING:  # the API client loads only with --kubernetes.api
    from exporter.dra.slicewatch import SliceWatcher
    from exporter.kubeapi.watcher import PodWatcher
    from exporter.model import ClaimHealth

log = logging.getLogger("exporter.dra")


class DraView:
    def __init__(self, slices: SliceWatcher | None = None, pods: PodWatcher | None = None) -> None:
        self.slices = slices
        self.pods = pods
        """The pod watch, reading whole pods with --kubernetes.dra: their claims' health."""
        self._identity: tuple[object, Identity] | None = None
        self._allocations: tuple[Allocation, ...] = ()
        self._unidentified: tuple[DeviceKey, ...] = ()

    def identity(self, devices: Sequence[Device]) -> Mapping[DeviceKey, str] | None:
        """(driver, pool, device) -> hw.id for the join ("" for a slice device no source
        has); None without slices (the join then looks DRA devices up by name)."""
        if self.slices is None or not self.slices.synced.is_set():
            return None
        generation, slices, _ = self.slices.current()
        key = (generation, tuple(devices))
        if self._identity is None or self._identity[0] != key:
            self._identity = (key, identify(slices, devices))
        found = self._identity[1]
        return {**dict.fromkeys(found.unmatched, ""), **found.devices}

    def numa(self) -> Mapping[DeviceKey, int] | None:
        """(driver, pool, device) -> NUMA node, from the slices of the last `identity()`."""
        if self._identity is None or self.slices is None:
            return None
        return numa_nodes(self._identity[1].slices)

    def extended(self, allocations: Sequence[Allocation]) -> list[Allocation]:
        """DRA allocations of a claim the scheduler made for an extended resource (KEP-5004)
        named by that resource, as a device-plugin pod's are: `hw_allocation_resource` is
        what the container asked for (`example.com/gpu`), from the pod's
        `extendedResourceClaimStatus` (exporter/dra/extended.py); kind, claim, pool and
        device stay the DRA ones. A container holding two such resources through one claim
        keeps the driver: PodResources names no request, so which device serves which
        resource is not known here."""
        if self.pods is None:
            return list(allocations)
        pods = {(p.namespace, p.name): p.extended for p in list(self.pods.pods.values())}
        out = []
        for a in allocations:
            claims = pods.get((a.holder.namespace, a.holder.pod), ())
            if a.kind is AllocationKind.DRA and claims:
                claim = a.claim.partition("/")[2]
                names = {
                    c.resource
                    for c in claims
                    if (c.claim, c.container) == (claim, a.holder.container)
                }
                if len(names) == 1:
                    a = replace(a, resource_name=names.pop())
            out.append(a)
        return out

    def observe(self, allocations: Sequence[Allocation]) -> None:
        """After the join: what containers hold, and which DRA devices stayed unjoined
        (named in the log once each time that set changes)."""
        self._allocations = tuple(allocations)
        missing = unidentified_of(allocations)
        if missing != self._unidentified and missing:
            how = (
                "no device of their ResourceSlice attributes (uuid, PCI bus ID) is seen here"
                if self.slices is not None
                else "without --kubernetes.dra (ResourceSlices) only NVIDIA's gpu-<minor> names "
                "can be joined"
            )
            log.warning(
                "DRA devices not identified (%s): %s; their allocations carry no hw_id",
                how,
                ", ".join("/".join(k) for k in missing),
            )
        elif self._unidentified and not missing:
            log.info("every DRA device held is identified again")
        self._unidentified = missing

    def _health(self) -> list[tuple[str, str, ClaimHealth]]:
        """(namespace, pod, entry) of the pods holding DRA claims now, from the pod watch."""
        if self.pods is None:
            return []
        holding = {
            (a.holder.namespace, a.holder.pod)
            for a in self._allocations
            if a.kind is AllocationKind.DRA
        }
        pods = list(self.pods.pods.values())  # a copy: the watch runs on the event loop
        return [
            (p.namespace, p.name, h)
            for p in sorted(pods, key=lambda p: (p.namespace, p.name))
            if (p.namespace, p.name) in holding
            for h in p.health
        ]

    def self_samples(self) -> tuple[Sample, ...]:
        out = [Sample("kube_device_exporter.dra.unidentified", float(len(self._unidentified)))]
        if self.slices is None:
            return tuple(out)
        out.append(Sample("kube_device_exporter.dra.slices.up", float(self.slices.up)))
        for (peer, request, reason), count in sorted(self.slices.refused().items()):
            attrs = (("peer", peer), ("request", request), ("reason", reason))
            out.append(Sample("kube_device_exporter.peer.answers.refused", float(count), attrs))
        if self._identity is None:
            return tuple(out)
        identity = self._identity[1]
        _, slices, rules = self.slices.current()
        for device in identity.slices:
            out.append(
                Sample(
                    "hw.dra.device.info",
                    1.0,
                    (
                        *_names(device.key),
                        ("hw.id", identity.devices.get(device.key, "")),
                        ("hw.dra.kind", device_kind(device)),
                    ),
                )
            )
        for device, taint, source in device_taints(identity.slices, rules):
            out.append(
                Sample(
                    "hw.dra.device.taint",
                    1.0,
                    (
                        *_names(device.key),
                        ("hw.id", identity.devices.get(device.key, "")),
                        ("hw.dra.taint.key", taint.key),
                        ("hw.dra.taint.value", taint.value),
                        ("hw.dra.taint.effect", taint.effect),
                        ("hw.dra.taint.source", source),
                    ),
                )
            )
        for namespace, pod, h in self._health():
            key = _resource_key(h.resource_id)
            out.append(
                Sample(
                    "hw.dra.allocation.health",
                    1.0,
                    (
                        ("k8s.namespace.name", namespace),
                        ("k8s.pod.name", pod),
                        ("k8s.container.name", h.container),
                        ("hw.allocation.claim", h.claim),
                        *_names(key),
                        ("hw.id", identity.devices.get(key, "")),
                        ("hw.dra.health", h.health),
                    ),
                )
            )
        for (driver, pool, kind), count in free_devices(slices, self._allocations, rules).items():
            out.append(
                Sample(
                    "hw.dra.free",
                    float(count),
                    (
                        ("hw.allocation.resource", driver),
                        ("hw.allocation.pool", pool),
                        ("hw.dra.kind", kind),
                    ),
                )
            )
        return tuple(out)


def _names(key: DeviceKey) -> tuple[tuple[str, str], ...]:
    """The labels `hw_allocation_info` names a DRA device with, so the two join."""
    driver, pool, device = key
    return (
        ("hw.allocation.resource", driver),
        ("hw.allocation.pool", pool),
        ("hw.allocation.device_id", device),
    )


def _resource_key(resource_id: str) -> DeviceKey:
    """`driver/pool/device` as the kubelet writes a resourceID; a CDI ID (the kubelet's
    choice when the driver gave one) names no pool: it stays whole as the device."""
    parts = resource_id.split("/", 2)
    if len(parts) == 3 and "=" not in resource_id:
        return (parts[0], parts[1], parts[2])
    return ("", "", resource_id)
