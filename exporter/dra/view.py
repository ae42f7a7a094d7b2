"""The poller's view of DRA: slice identities for the join, the claims' word on who holds
what, and the DRA series.

With `--kubernetes.dra` a `SliceWatcher` keeps this node's ResourceSlices (and the
cluster's DeviceTaintRules, where served) current in the background, the pod watch carries
the pods' claim health and extended-resource mappings, and a `ClaimReader` reads the claims
PodResources lists (capacity shares, admin access, requests, device status); this object
only reads their caches. Without it, a claimed DRA device is joined by its name alone (the
NVML source's `gpu.nvidia.com/gpu-<minor>`), and whatever that cannot join is counted
(`kube_device_exporter_dra_unidentified`) and named once in the log, never missed silently.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from exporter.dra.claims import ClaimKey
from exporter.dra.holders import AdminHold, Narrowed, narrow, serves
from exporter.dra.identity import (
    DeviceKey,
    Identity,
    device_kind,
    device_taints,
    identify,
    numa_nodes,
)
from exporter.dra.identity import unidentified as unidentified_of
from exporter.dra.pool import held_keys, pool_state, shared_capacity
from exporter.model import Allocation, AllocationKind, Device, PodResourcesState, Sample

if TYPE_CHECKING:  # the API client loads only with --kubernetes.api
    from exporter.dra.claimread import ClaimReader
    from exporter.dra.claims import Claim
    from exporter.dra.slicewatch import SliceWatcher
    from exporter.kubeapi.watcher import PodWatcher
    from exporter.model import ClaimHealth, ExtendedClaim

log = logging.getLogger("exporter.dra")


class DraView:
    def __init__(
        self,
        slices: SliceWatcher | None = None,
        pods: PodWatcher | None = None,
        claims: ClaimReader | None = None,
    ) -> None:
        self.slices = slices
        self.pods = pods
        """The pod watch, reading whole pods with --kubernetes.dra: their claims' health."""
        self.claims = claims
        """The ResourceClaims PodResources lists, read by name (--kubernetes.dra)."""
        self._identity: tuple[object, Identity] | None = None
        self._allocations: tuple[Allocation, ...] = ()
        self._unidentified: tuple[DeviceKey, ...] = ()
        self._narrowed = Narrowed(PodResourcesState())
        self._read: Mapping[ClaimKey, Claim] = {}
        """The claims as the last `narrow()` saw them."""

    def narrow(self, state: PodResourcesState | None) -> PodResourcesState | None:
        """Before the join: tell the claim reader which claims PodResources lists, and take
        out of the answer what the claims say is not held (admin access, another
        container's request of an extended-resource claim): exporter/dra/holders.py."""
        if self.claims is None or state is None:
            return state
        listed = {
            (d.claim_namespace, d.claim_name)
            for p in state.pods
            for c in p.containers
            for d in c.dynamic_resources
        }
        self.claims.want(listed)
        self._read = self.claims.current()
        self._narrowed = narrow(state, self._read, self.claims.pending, self._mappings())
        return self._narrowed.state

    def _mappings(self) -> dict[tuple[str, str], tuple[ExtendedClaim, ...]]:
        if self.pods is None:
            return {}
        return {(p.namespace, p.name): p.extended for p in list(self.pods.pods.values())}

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
        device stay the DRA ones. Where the claim has been read, each device is named by the
        request its result serves (a container holding two such resources through one claim
        gets each right); before that, a container holding two keeps the driver."""
        if self.pods is None:
            return list(allocations)
        pods = self._mappings()
        out = []
        for a in allocations:
            claims = pods.get((a.holder.namespace, a.holder.pod), ())
            if a.kind is AllocationKind.DRA and claims:
                name = self._resource_of(a, claims)
                if name:
                    a = replace(a, resource_name=name)
            out.append(a)
        return out

    def _resource_of(self, a: Allocation, mappings: tuple[ExtendedClaim, ...]) -> str:
        namespace, _, claim = a.claim.partition("/")
        mine = [m for m in mappings if (m.claim, m.container) == (claim, a.holder.container)]
        read = self._read.get((namespace, claim))
        result = read.result(a.driver, a.pool, a.raw_id, a.replica) if read else None
        if result is not None:
            served = {m.resource for m in mine if serves(result.request, {m.request})}
            if len(served) == 1:
                return served.pop()
        names = {m.resource for m in mine}
        return names.pop() if len(names) == 1 else ""

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
        refused = dict(self.slices.refused())
        if self.claims is not None:
            claims = dict(self.claims.refused)  # a copy: the reader runs on the event loop
            refused.update({("kubernetes-api", "resourceclaims", r): n for r, n in claims.items()})
        for (peer, request, reason), count in sorted(refused.items()):
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
        state = pool_state(slices, held_keys(self._allocations), rules)
        for (driver, pool, kind), count in state.free.items():
            pool_labels = (("hw.allocation.resource", driver), ("hw.allocation.pool", pool))
            out.append(Sample("hw.dra.free", float(count), (*pool_labels, ("hw.dra.kind", kind))))
        for (driver, pool, counter_set, counter), left in state.left.items():
            labels = (
                ("hw.allocation.resource", driver),
                ("hw.allocation.pool", pool),
                ("hw.dra.counter_set", counter_set),
                ("hw.dra.counter", counter),
            )
            out.append(Sample("hw.dra.counter.free", left, labels))
            stranded = state.stranded.get((driver, pool, counter_set, counter), 0.0)
            out.append(Sample("hw.dra.counter.stranded", stranded, labels))
        out += self._claim_samples(identity)
        return tuple(out)

    def _claim_samples(self, identity: Identity) -> Iterator[Sample]:
        """What the claims say: shares, capacity left on shared devices, admin access,
        device status (conditions, network data)."""
        if self.claims is None:
            return
        yield Sample("kube_device_exporter.dra.claims.up", float(self.claims.up))
        read = self._read
        held = self._narrowed.holders or {}
        for cap in shared_capacity(identity.slices, (read[k] for k in held if k in read)):
            labels = (
                *_names(cap.device.key),
                ("hw.id", identity.devices.get(cap.device.key, "")),
                ("hw.dra.capacity", _short(cap.device.driver, cap.capacity)),
            )
            yield Sample("hw.dra.device.capacity", cap.total, labels)
            yield Sample("hw.dra.device.capacity.free", cap.free, labels)
        for key, holders in sorted(held.items()):
            claim = read.get(key)
            if claim is None:
                continue
            for pod in sorted({(h.namespace, h.pod) for h in holders}):
                yield from _claim_pod_samples(claim, pod, identity)
        for hold in self._narrowed.admin:
            yield _admin_sample(hold, identity)


def _claim_pod_samples(claim: Claim, pod: tuple[str, str], identity: Identity) -> Iterator[Sample]:
    """The share of each non-admin result of `claim`, and each device status, for the pod
    holding it."""
    who = (
        ("k8s.namespace.name", pod[0]),
        ("k8s.pod.name", pod[1]),
        ("hw.allocation.claim", f"{claim.namespace}/{claim.name}"),
    )
    for r in claim.results:
        if r.admin_access:
            continue
        for name, amount in r.consumed:
            yield Sample(
                "hw.dra.allocation.capacity",
                amount,
                (
                    *who,
                    *_names(r.key),
                    ("hw.allocation.replica", r.share_id),
                    ("hw.id", identity.devices.get(r.key, "")),
                    ("hw.dra.capacity", _short(r.driver, name)),
                ),
            )
    for d in claim.devices:
        device = (*who, *_names(d.key), ("hw.id", identity.devices.get(d.key, "")))
        for c in d.conditions:
            yield Sample(
                "hw.dra.allocation.condition",
                1.0,
                (
                    *device,
                    ("hw.dra.condition", c.type),
                    ("hw.dra.condition.status", c.status),
                    ("hw.dra.condition.reason", c.reason),
                ),
            )
        if d.interface or d.mac or d.ips:
            yield Sample(
                "hw.dra.allocation.network.info",
                1.0,
                (
                    *device,
                    ("hw.network.name", d.interface),
                    ("hw.network.mac", d.mac),
                    ("hw.network.ips", ",".join(d.ips)),
                ),
            )


def _admin_sample(hold: AdminHold, identity: Identity) -> Sample:
    r = hold.resource
    key = (r.driver_name, r.pool_name, r.device_name)
    return Sample(
        "hw.dra.admin_access.info",
        1.0,
        (
            ("k8s.namespace.name", hold.holder.namespace),
            ("k8s.pod.name", hold.holder.pod),
            ("k8s.container.name", hold.holder.container),
            ("hw.allocation.claim", hold.claim),
            *_names(key),
            ("hw.id", identity.devices.get(key, "")),
        ),
    )


def _short(driver: str, name: str) -> str:
    """A capacity name as the driver publishes it: its own domain left out (`memory`)."""
    return name.removeprefix(f"{driver}/")


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
