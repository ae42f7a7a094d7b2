"""Per-process usage -> per (device, container) sums. Pure.

Every process is counted once, in its container's group or in the one group of no pod
(host processes, processes whose container is not named yet): the groups of a device sum
to the device's process total. Memory and utilization are sums over the group's processes
that have the reading; a group where none has it has no value (not 0).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence

from exporter.model import Allocation, ContainerUsage, Device, Holder, Owner, ProcessUsage


def container_usage(
    processes: Iterable[ProcessUsage],
    owners: Mapping[int, Owner],
    allocations: Sequence[Allocation],
    devices: Sequence[Device],
    *,
    held: Callable[[], Mapping[str, set[Holder]]] | None = None,
) -> tuple[ContainerUsage, ...]:
    """`held`: device -> its holders (`HeldIndex.held`), asked only when a process has an
    owner; by default worked out from `allocations` and `devices`."""
    groups: dict[tuple[str, Owner | None], list[ProcessUsage]] = defaultdict(list)
    for proc in processes:
        groups[(proc.device_id, owners.get(proc.pid))].append(proc)
    if not any(owner is not None for _, owner in groups):
        held_by: Mapping[str, set[Holder]] = {}  # nobody's processes: nothing is requested
    elif held is None:
        held_by = _held(allocations, devices)
    else:
        held_by = held()
    out = [
        ContainerUsage(
            device_id=device_id,
            owner=owner,
            processes=len(procs),
            memory_bytes=_sum(p.memory_bytes for p in procs),
            utilization=_sum(p.utilization for p in procs),
            requested=owner is not None and owner.holder in held_by.get(device_id, ()),
        )
        for (device_id, owner), procs in groups.items()
    ]
    out.sort(key=lambda u: (u.device_id, u.owner is not None, _key(u.owner)))
    return tuple(out)


class HeldIndex:
    """`_held`, worked out again only when the allocations or the devices changed (the
    poller's join keeps both from cycle to cycle while the node does not change)."""

    def __init__(self) -> None:
        self._last: tuple[object, dict[str, set[Holder]]] | None = None

    def held(
        self, allocations: Sequence[Allocation], devices: Sequence[Device]
    ) -> dict[str, set[Holder]]:
        key = (tuple(allocations), tuple(devices))
        if self._last is None or self._last[0] != key:
            self._last = (key, _held(allocations, devices))
        return self._last[1]


def _held(allocations: Sequence[Allocation], devices: Sequence[Device]) -> dict[str, set[Holder]]:
    """Device -> containers holding it, its parent or a slice of it (a process on an AMD
    GPU counts for the pod that holds one of its partitions, a process on a MIG slice
    for the pod holding the whole GPU)."""
    related: dict[str, set[str]] = defaultdict(set)
    for device in devices:
        related[device.id].add(device.id)
        if device.parent:
            related[device.id].add(device.parent)
            related[device.parent].add(device.id)
    held: dict[str, set[Holder]] = defaultdict(set)
    for alloc in allocations:
        if not alloc.device_id:
            continue
        for device_id in related.get(alloc.device_id, {alloc.device_id}):
            held[device_id].add(alloc.holder)
    return held


def _sum(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _key(owner: Owner | None) -> tuple[str, ...]:
    if owner is None:
        return ()
    return (owner.namespace, owner.pod, owner.container, owner.container_id)
