"""The join: PodResources assignments x device readings -> who holds what. Pure.

Device plugins hand the kubelet many ID forms for one device (docs/device-ids.md lists
them with the plugins' source files). `normalize_device_id` turns a raw ID into a
lookup key plus a replica; sources declare the keys that name each of their devices
(`Device.aliases`), so the join itself knows no vendor.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from exporter.dra.identity import dra_ids, dra_placements
from exporter.ids import ResourceMatcher, normalize_device_id
from exporter.model import (
    Allocation,
    AllocationKind,
    ClaimResource,
    Container,
    ContainerDevices,
    ContainerNuma,
    Device,
    DeviceReading,
    Holder,
    JoinedDevice,
    Pod,
    PodResourcesState,
    SourceResult,
)


@dataclass(frozen=True, slots=True)
class JoinResult:
    devices: tuple[JoinedDevice, ...]
    allocations: tuple[Allocation, ...]
    allocatable: tuple[ContainerDevices, ...] = ()
    """The kubelet's allocatable devices of the resources we attribute."""
    unseen: tuple[tuple[str, int], ...] = ()
    """(resource, devices the kubelet can allocate that no source sees), per allocatable
    resource, when the kubelet's allocatable list is known."""
    containers: tuple[ContainerNuma, ...] = ()
    """NUMA placement of every container holding devices of matched resources."""
    registered: tuple[tuple[str, bool], ...] = ()
    """(resource, whether the kubelet lists any device of it now): see `_registered`."""


def join(
    results: Sequence[SourceResult],
    state: PodResourcesState | None,
    matcher: ResourceMatcher | None = None,
    *,
    cpu_nodes: Mapping[int, int] | None = None,
    known_resources: Mapping[str, str] | None = None,
    dra: Mapping[tuple[str, str, str], str] | None = None,
    dra_numa: Mapping[tuple[str, str, str], int] | None = None,
) -> JoinResult:
    """`cpu_nodes`: the node's CPU -> NUMA map (exporter/derive/numa.py). `known_resources`:
    hw.id -> the resource earlier answers listed it under (the poller remembers them), so a
    device that left the allocatable list is still reported under its resource. `dra`/`dra_numa`:
    hw.id/NUMA node per DRA device from the ResourceSlices (exporter/dra/identity.py)."""
    matcher = matcher or ResourceMatcher()
    readings = [r for result in results for r in result.readings]
    state = state or PodResourcesState()
    state = replace(state, pods=merged_pods(state.pods))
    allocatable = tuple(d for d in state.allocatable if matcher(d.resource_name))
    index = _Index([r.device for r in readings], allocatable if state.allocatable_known else None)

    allocations: list[Allocation] = []
    for pod in state.pods:
        for container in pod.containers:
            holder = Holder(pod.namespace, pod.name, container.name)
            for devs in container.devices:
                if matcher(devs.resource_name):
                    allocations += _device_plugin(holder, devs, index)
            for claim in container.dynamic_resources:
                for res in claim.claim_resources:
                    allocations += [
                        Allocation(
                            holder=holder,
                            resource_name=res.driver_name,
                            raw_id=res.device_name,
                            device_id=device_id,
                            shared=bool(res.share_id),
                            replica=res.share_id,
                            kind=AllocationKind.DRA,
                            claim=f"{claim.claim_namespace}/{claim.claim_name}",
                            driver=res.driver_name,
                            pool=res.pool_name,
                        )
                        for device_id in dra_ids(dra, res) or index.claimed(res)
                    ]

    holders: dict[str, set[Holder]] = defaultdict(set)
    for a in allocations:
        if a.device_id:
            holders[a.device_id].add(a.holder)
    allocations = [
        replace(a, shared=True) if a.device_id and len(holders[a.device_id]) > 1 else a
        for a in allocations
    ]
    allocatable_ids = {
        device_id: devs.resource_name
        for devs in allocatable
        for raw in devs.device_ids
        for device_id in index.resolve(devs.resource_name, raw)
    }
    resources = _resources(
        readings, allocatable_ids, allocations, known_resources or {}, state.allocatable_known
    )
    joined = []
    for reading in readings:
        who = holders.get(reading.device.id, set())
        joined.append(
            JoinedDevice(
                reading=reading,
                holder=next(iter(who)) if len(who) == 1 else None,
                holders=len(who),
                allocatable=reading.device.id in allocatable_ids,
                resource=resources.get(reading.device.id, ""),
            )
        )
    allocations.sort(key=lambda a: (a.holder, a.kind.value, a.resource_name, a.raw_id, a.device_id))
    unseen: dict[str, int] = {}
    if state.allocatable_known:
        for devs in allocatable:
            missing = sum(
                1 for raw in devs.device_ids if not index.resolve(devs.resource_name, raw)
            )
            unseen[devs.resource_name] = unseen.get(devs.resource_name, 0) + missing
    cpus = cpu_nodes or {}
    placements = tuple(
        numa
        for pod in state.pods
        for container in pod.containers
        if (numa := container_numa(pod.namespace, pod.name, container, matcher, cpus, dra=dra_numa))
    )
    return JoinResult(
        tuple(joined),
        tuple(dict.fromkeys(allocations)),  # each once, in order
        allocatable,
        tuple(sorted(unseen.items())),
        placements,
        _registered(allocatable, allocations, state, matcher, known_resources or {}),
    )


def _registered(
    allocatable: Sequence[ContainerDevices],
    allocations: Sequence[Allocation],
    state: PodResourcesState,
    matcher: ResourceMatcher,
    known: Mapping[str, str],
) -> tuple[tuple[str, bool], ...]:
    """Per resource: True while the kubelet lists a device of it as allocatable; False while
    it lists none but listed some to this process before, or a container holds some: its
    plugin is not registered (K10 in docs/podresources.md). A one-device resource whose
    device turns unhealthy reads False too (the same answer). Held answers count as listed
    (podresources/settle.py); nothing while the allocatable list is unknown."""
    if not state.allocatable_known:
        return ()
    offered = {d.resource_name for d in allocatable if d.device_ids}
    held = {a.resource_name for a in allocations if a.kind is AllocationKind.DEVICE_PLUGIN}
    before = {r for r in state.resources_listed if matcher(r)} | set(known.values())
    return tuple(sorted((r, r in offered) for r in offered | held | before))


def _resources(
    readings: Sequence[DeviceReading],
    allocatable: Mapping[str, str],
    allocations: Sequence[Allocation],
    known: Mapping[str, str],
    allocatable_known: bool,
) -> dict[str, str]:
    """hw.id -> the resource a device is allocatable under now, or held under, or was
    allocatable under before. Nothing when the allocatable list is unknown (no v1 kubelet,
    the gate off): then allocatable or not cannot be told. A device that is another seen
    device's parent (a GPU in MIG mode) is left out: its capacity is its children's, and
    it leaves the list by design when it is partitioned.

    A resource with no allocatable device at all is left out too: its device plugin is
    not registered (stopped, restarting, or not yet back after a kubelet restart), and the
    kubelet then drops all its devices at once (docs/podresources.md, real-kubelet
    behaviour 10) — nothing says a device turned unhealthy; `_registered` says it is gone.
    (A resource of one device that turns unhealthy looks the same.)"""
    if not allocatable_known:
        return {}
    parents = {r.device.parent for r in readings if r.device.parent}
    offered = set(allocatable.values())
    held = {
        a.device_id: a.resource_name
        for a in allocations
        if a.device_id and a.kind is AllocationKind.DEVICE_PLUGIN
    }
    out: dict[str, str] = {}
    for reading in readings:
        device_id = reading.device.id
        if device_id in parents:
            continue
        resource = allocatable.get(device_id) or held.get(device_id) or known.get(device_id)
        if resource in offered:
            out[device_id] = resource
    return out


def container_numa(
    namespace: str,
    pod: str,
    container: Container,
    matcher: ResourceMatcher,
    cpu_nodes: Mapping[int, int],
    *,
    dra: Mapping[tuple[str, str, str], int] | None = None,
) -> ContainerNuma | None:
    """Where a container's devices, exclusive CPUs and pinned memory sit; None for a
    container holding no device of a matched resource.

    Aligned means: the set of NUMA nodes of its exclusive CPUs equals the set of NUMA nodes
    of its devices, and so does the set of NUMA nodes of its pinned memory (every type
    together) - every node holding one of its devices also holds some of its CPUs and
    memory, and none of its CPUs or memory sits on a node without one of its devices. A
    container spanning nodes 0 and 1 with GPUs and CPUs on both is aligned; GPUs on 0 and 1
    with CPUs on 0 only is not. Resources with no placement (shared-pool CPUs: no
    `cpu_ids`; no memory manager: no `memory`) are left out of the comparison; with nothing
    left to compare, or an exclusive CPU missing from the CPU map, it is not judged (None).
    """
    held = [d for d in container.devices if matcher(d.resource_name) and d.device_ids]
    claimed = dra_placements(container, dra or {})
    if not held and not claimed:
        return None
    devices = sorted({(d.resource_name, node) for d in held for node in d.numa_nodes} | claimed)
    cpus = sorted({cpu_nodes[c] for c in container.cpu_ids if c in cpu_nodes})
    unplaced = any(c not in cpu_nodes for c in container.cpu_ids)
    memory = sorted({(m.memory_type, n) for m in container.memory for n in m.numa_nodes})
    device_nodes = {node for _, node in devices}
    memory_nodes = {node for _, node in memory}
    aligned: bool | None = None
    if device_nodes and not unplaced and (cpus or memory_nodes):
        aligned = (not cpus or set(cpus) == device_nodes) and (
            not memory_nodes or memory_nodes == device_nodes
        )
    return ContainerNuma(
        holder=Holder(namespace, pod, container.name),
        devices=tuple(devices),
        exclusive_cpus=len(container.cpu_ids),
        cpus=tuple(cpus),
        memory=tuple(memory),
        aligned=aligned,
    )


class _Index:
    """Lookup key -> every device claiming it (a RoCE VF is both a NIC VF and an IB port),
    pool resource -> its devices, and how many replicas the kubelet advertises per key."""

    def __init__(
        self, devices: Sequence[Device], allocatable: Sequence[ContainerDevices] | None
    ) -> None:
        self.aliases: dict[str, list[str]] = defaultdict(list)
        self.pools: dict[str, list[str]] = defaultdict(list)
        for device in devices:
            keys = {normalize_device_id(a)[0] for a in (device.id, *device.aliases)}
            for key in sorted(keys):
                self.aliases[key].append(device.id)
            for pool in sorted(device.pools):
                self.pools[pool].append(device.id)
        self.replicas: dict[str, int] | None = None
        if allocatable is not None:
            counts: dict[str, set[str]] = defaultdict(set)
            for devs in allocatable:
                for raw in devs.device_ids:
                    key, replica = normalize_device_id(raw)
                    counts[key].add(replica)
            self.replicas = {key: len(reps) for key, reps in counts.items()}

    def resolve(self, resource_name: str, raw: str) -> list[str]:
        found = self.aliases.get(normalize_device_id(raw)[0])
        return list(found) if found else list(self.pools.get(resource_name, []))

    def claimed(self, res: ClaimResource) -> list[str]:
        key = normalize_device_id(res.device_name)[0]
        return list(self.aliases.get(key) or self.aliases.get(f"{res.driver_name}/{key}") or [""])

    def replicated(self, key: str, replica: str) -> bool:
        """Is this a replica of a device handed out several times? With the kubelet's
        allocatable list we count the advertised replicas (Intel's default `card0-0` is one
        device for one container); without it, any replica suffix counts as sharing."""
        if self.replicas is None or key not in self.replicas:
            return bool(replica)
        return self.replicas[key] > 1


def _device_plugin(holder: Holder, devs: ContainerDevices, index: _Index) -> list[Allocation]:
    out = []
    renamed_shared = devs.resource_name.endswith(".shared")
    for raw in devs.device_ids:
        key, replica = normalize_device_id(raw)
        found = index.aliases.get(key)
        pooled = not found and devs.resource_name in index.pools
        shared = renamed_shared or pooled or index.replicated(key, replica)
        for device_id in index.resolve(devs.resource_name, raw) or [""]:
            out.append(
                Allocation(
                    holder=holder,
                    resource_name=devs.resource_name,
                    raw_id=raw,
                    device_id=device_id,
                    replica=replica,
                    shared=shared,
                    numa_nodes=devs.numa_nodes,
                )
            )
    return out


def merged_pods(pods: Sequence[Pod]) -> tuple[Pod, ...]:
    """One pod per (namespace, name), one container per name within it: a List that names
    a pod twice (the same pod three times was seen) would otherwise give identical series
    twice, which is invalid exposition. What the copies hold is merged, each item once."""
    if len({(p.namespace, p.name) for p in pods}) == len(pods):
        return tuple(pods)  # the usual case: nothing to merge, nothing copied
    by_pod: dict[tuple[str, str], dict[str, Container]] = {}
    for pod in pods:
        containers = by_pod.setdefault((pod.namespace, pod.name), {})
        for c in pod.containers:
            have = containers.get(c.name)
            containers[c.name] = c if have is None else _merged_container(have, c)
    return tuple(
        Pod(name, namespace, tuple(containers.values()))
        for (namespace, name), containers in by_pod.items()
    )


def _merged_container(a: Container, b: Container) -> Container:
    return Container(
        a.name,
        devices=tuple(dict.fromkeys(a.devices + b.devices)),
        cpu_ids=tuple(sorted(set(a.cpu_ids + b.cpu_ids))),
        memory=tuple(dict.fromkeys(a.memory + b.memory)),
        dynamic_resources=tuple(dict.fromkeys(a.dynamic_resources + b.dynamic_resources)),
    )
