"""What this node's DRA pools can still give: devices per kind, shared counters left and
stranded, capacity left on shared devices. Pure.

Two ways a driver lets claims share hardware, both on by default in 1.36 (control-plane.md
facts 12, 13):

- **Partitions from counters** (KEP-4815, `DRAPartitionableDevices`): a slice of
  `sharedCounters` (one counter set per GPU) and devices that consume from it, whole GPUs
  and MIG profiles at placements (dra-driver-nvidia-gpu `cmd/gpu-kubelet-plugin/
  partitions.go`: one counter per capacity dimension and one `memory-slice-N` counter per
  memory slice; the whole GPU consumes them all, a placement its own slices). The scheduler
  allocates a device when what it consumes is still left once every allocated device's
  consumption is taken off.
- **Consumable capacity** (KEP-5075, `DRAConsumableCapacity`): a device with
  `allowMultipleAllocations` is allocated to several claims, each recording its
  `consumedCapacity` (rounded up to the device's request policy); a claim fits while the
  capacity minus the shares of the other claims covers it. An admin-access claim records a
  share the scheduler does not count (fact 14: one 80Gi device ended with 90Gi recorded).

"Held" here is what this node runs (PodResources, admin-access claims left out) and the
claims of those containers: a claim allocated to a pod that has not started here yet is not
seen, so right after an allocation the figures can be higher than the scheduler's for a
moment.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from exporter.dra.claims import Claim
from exporter.dra.identity import BLOCKING_EFFECTS, current_slices, device_kind, device_taints
from exporter.dra.slices import Slice, SliceDevice, TaintRule
from exporter.model import Allocation, AllocationKind

CounterKey = tuple[str, str, str, str]
"""(driver, pool, counter set, counter)."""
KindKey = tuple[str, str, str]
"""(driver, pool, kind)."""


@dataclass(frozen=True, slots=True)
class PoolState:
    free: dict[KindKey, int]
    """How many more devices of each kind fit side by side, every kind listed (0 included)."""
    left: dict[CounterKey, float]
    """Each shared counter less what held devices consume."""
    stranded: dict[CounterKey, float]
    """Of what is left of a counter, what no device that still fits would consume: counted
    whole when nothing that could be allocated now uses that counter (a memory slice between
    two held partitions that no free placement covers, the compute left when two 3g.90gb
    profiles took every memory slice of a B200)."""


def pool_state(
    slices: Iterable[Slice], held: Iterable[tuple[str, str, str]], rules: Iterable[TaintRule] = ()
) -> PoolState:
    """`held`: the (driver, pool, device) of every DRA device a container holds.

    A device can be allocated when no container holds it (or it allows multiple
    allocations), no NoSchedule/NoExecute taint is on it, and what it consumes is left.
    Per kind, devices are taken in the slices' order while their consumption is left, each
    taken one's consumption taken off (the scheduler's first fit, in the order it walks a
    pool's devices): for MIG placements, whose slices of one profile never overlap, that is
    the most that fit at once."""
    current = current_slices(list(slices))
    held_keys = set(held)
    left: dict[CounterKey, float] = {}
    for s in current:
        for counter_set, name, value in s.counters:
            key = (s.driver, s.pool, counter_set, name)
            left[key] = left.get(key, 0.0) + value
    devices = [d for s in current for d in s.devices]
    for d in devices:
        if d.key in held_keys:
            for key, amount in _consumes(d):
                left[key] = left.get(key, 0.0) - amount
    blocked = {d.key for d, t, _ in device_taints(devices, rules) if t.effect in BLOCKING_EFFECTS}
    open_devices = [
        d for d in devices if (d.key not in held_keys or d.multiple) and d.key not in blocked
    ]
    free: dict[KindKey, int] = {(d.driver, d.pool, device_kind(d)): 0 for d in devices}
    for kind in sorted(free):
        remaining = dict(left)
        for d in open_devices:
            if (d.driver, d.pool, device_kind(d)) == kind and _fits(d, remaining):
                free[kind] += 1
                for key, amount in _consumes(d):
                    remaining[key] = remaining.get(key, 0.0) - amount
    usable = {key for d in open_devices if _fits(d, left) for key, amount in _consumes(d) if amount}
    stranded = {
        key: (value if value > 0 and key not in usable else 0.0) for key, value in left.items()
    }
    return PoolState(dict(sorted(free.items())), dict(sorted(left.items())), stranded)


def _consumes(device: SliceDevice) -> list[tuple[CounterKey, float]]:
    return [
        ((device.driver, device.pool, cs, name), amount) for cs, name, amount in device.consumes
    ]


def _fits(device: SliceDevice, left: dict[CounterKey, float]) -> bool:
    return all(left.get(key, 0.0) >= amount for key, amount in _consumes(device))


def held_keys(allocations: Iterable[Allocation]) -> set[tuple[str, str, str]]:
    """The (driver, pool, device) of the DRA devices containers hold."""
    return {(a.driver, a.pool, a.raw_id) for a in allocations if a.kind is AllocationKind.DRA}


def free_devices(
    slices: Iterable[Slice], allocations: Iterable[Allocation], rules: Iterable[TaintRule] = ()
) -> dict[KindKey, int]:
    """(driver, pool, kind) -> how many more devices of that kind a new claim could get."""
    return pool_state(slices, held_keys(allocations), rules).free


@dataclass(frozen=True, slots=True)
class SharedCapacity:
    device: SliceDevice
    capacity: str
    """The capacity's qualified name (`gpu.nvidia.com/memory`)."""
    total: float
    free: float
    """What the scheduler still gives new shares: the total less every non-admin share."""


def shared_capacity(
    slice_devices: Iterable[SliceDevice], claims: Iterable[Claim]
) -> list[SharedCapacity]:
    """Each capacity of each device that allows multiple allocations, with what is left of it
    once the shares of `claims` (each claim once) are taken off."""
    used: dict[tuple[tuple[str, str, str], str], float] = {}
    for claim in {c.uid or f"{c.namespace}/{c.name}": c for c in claims}.values():
        for result in claim.results:
            if result.admin_access:
                continue  # recorded, never counted by the scheduler (fact 14)
            for name, amount in result.consumed:
                key = (result.key, name)
                used[key] = used.get(key, 0.0) + amount
    return [
        SharedCapacity(d, name, total, total - used.get((d.key, name), 0.0))
        for d in slice_devices
        if d.multiple
        for name, total in d.capacity
    ]
