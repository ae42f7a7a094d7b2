"""Per-process usage -> per (device, container) sums. Pure.

Every process is counted once, in its container's group or in the one group of no pod
(host processes, processes whose container is not named yet): the groups of a device sum
to the device's process total. Memory and utilization are sums over the group's processes
that have the reading; a group where none has it has no value (not 0).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence

from exporter.model import Allocation, ContainerUsage, Device, Owner, ProcessUsage

HolderKey = tuple[str, str, str]
"""(namespace, pod, container): a holder as a plain tuple, hashed and compared in C
(`Holder`'s and `Owner`'s hash and equality are Python code)."""
_OwnerKey = tuple[str, str, str, str, str]


def container_usage(
    processes: Iterable[ProcessUsage],
    owners: Mapping[int, Owner],
    allocations: Sequence[Allocation],
    devices: Sequence[Device],
    *,
    held: Callable[[], Mapping[str, set[HolderKey]]] | None = None,
) -> tuple[ContainerUsage, ...]:
    """`held`: device -> its holders' keys (`HeldIndex.held`), asked only when a process
    has an owner; by default worked out from `allocations` and `devices`. Processes are
    grouped by their owner's fields (what makes two owners equal), as plain tuples."""
    groups: dict[tuple[str, _OwnerKey | None], list[ProcessUsage]] = defaultdict(list)
    owner_of: dict[_OwnerKey | None, Owner | None] = {None: None}
    for proc in processes:
        o = owners.get(proc.pid)
        key = None if o is None else (o.namespace, o.pod, o.container, o.pod_uid, o.container_id)
        owner_of.setdefault(key, o)
        groups[(proc.device_id, key)].append(proc)
    if len(owner_of) == 1:
        held_by: Mapping[str, set[HolderKey]] = {}  # nobody's processes: nothing requested
    elif held is None:
        held_by = _held(allocations, devices)
    else:
        held_by = held()
    out = [
        ContainerUsage(
            device_id=device_id,
            owner=owner_of[key],
            processes=len(procs),
            memory_bytes=_sum(p.memory_bytes for p in procs),
            utilization=_sum(p.utilization for p in procs),
            requested=key is not None and key[:3] in held_by.get(device_id, ()),
        )
        for (device_id, key), procs in groups.items()
    ]
    out.sort(key=lambda u: (u.device_id, u.owner is not None, _key(u.owner)))
    return tuple(out)


class HeldIndex:
    """`_held`, worked out again only when the allocations or the devices changed (the
    poller's join keeps both from cycle to cycle while the node does not change)."""

    def __init__(self) -> None:
        self._last: tuple[object, dict[str, set[HolderKey]]] | None = None

    def held(
        self, allocations: Sequence[Allocation], devices: Sequence[Device]
    ) -> dict[str, set[HolderKey]]:
        key = (tuple(allocations), tuple(devices))
        if self._last is None or self._last[0] != key:
            self._last = (key, _held(allocations, devices))
        return self._last[1]


def _held(
    allocations: Sequence[Allocation], devices: Sequence[Device]
) -> dict[str, set[HolderKey]]:
    """Device -> the keys of the containers holding it, its parent or a slice of it (a
    process on an AMD GPU counts for the pod that holds one of its partitions, a process on
    a MIG slice for the pod holding the whole GPU)."""
    related: dict[str, set[str]] = defaultdict(set)
    for device in devices:
        related[device.id].add(device.id)
        if device.parent:
            related[device.id].add(device.parent)
            related[device.parent].add(device.id)
    held: dict[str, set[HolderKey]] = defaultdict(set)
    for alloc in allocations:
        if not alloc.device_id:
            continue
        h = alloc.holder
        for device_id in related.get(alloc.device_id, {alloc.device_id}):
            held[device_id].add((h.namespace, h.pod, h.container))
    return held


def _sum(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _key(owner: Owner | None) -> tuple[str, ...]:
    if owner is None:
        return ()
    return (owner.namespace, owner.pod, owner.container, owner.container_id)
