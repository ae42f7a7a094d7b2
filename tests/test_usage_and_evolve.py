"""The cycle's cheap copies and groupings give what the plain ones give: `evolve` is
`dataclasses.replace`, `joined_device` is `JoinedDevice(...)`, and per-container usage
groups processes by their owner's fields and says `requested` from the held devices as the
holders change (a new pod, a process that moves, a device gone)."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import pytest

from exporter.attribution.usage import HeldIndex, container_usage
from exporter.join import JoinResult
from exporter.model import (
    Allocation,
    ContainerUsage,
    Device,
    DeviceReading,
    Holder,
    JoinedDevice,
    Owner,
    ProcessUsage,
    Sample,
    Snapshot,
    joined_device,
)
from exporter.runtime.evolve import evolve


def test_evolve_is_replace_for_every_field_of_the_snapshot() -> None:
    base = Snapshot(timestamp=1.0, node="n", cycles_total=3, attribution=False)
    for f in fields(Snapshot):
        value: Any = object()
        assert evolve(base, **{f.name: value}) == replace(base, **{f.name: value})
        assert getattr(evolve(base, **{f.name: value}), f.name) is value
    changed = evolve(base, attribution=True, owners={1: Owner("ns", "p", "c")})
    assert changed == replace(base, attribution=True, owners={1: Owner("ns", "p", "c")})
    assert base.attribution is False  # the original is left as it was
    joined = JoinResult(devices=(), allocations=())
    assert evolve(joined, unseen=(("r", 1),)) == replace(joined, unseen=(("r", 1),))


def test_evolve_refuses_what_replace_refuses() -> None:
    with pytest.raises(TypeError, match="no field 'nope'"):
        evolve(Snapshot(timestamp=1.0, node="n"), nope=1)
    with pytest.raises(TypeError):
        evolve(Sample("m", 1.0), value=2.0)  # a named tuple: not a slotted dataclass


def test_joined_device_is_the_dataclass_built_by_its_init() -> None:
    reading = DeviceReading(Device("GPU-0", "gpu", "nvidia", "H100", "nvml"), ())
    made = joined_device(reading, Holder("ns", "p", "c"), 1, True, "nvidia.com/gpu")
    assert made == JoinedDevice(reading, Holder("ns", "p", "c"), 1, True, "nvidia.com/gpu")
    assert hash(made) == hash(
        JoinedDevice(reading, Holder("ns", "p", "c"), 1, True, "nvidia.com/gpu")
    )


GPU = Device("GPU-0", "gpu", "nvidia", "H100", "nvml")
MIG = Device("MIG-0", "gpu", "nvidia", "H100 MIG", "nvml", parent="GPU-0")
OTHER = Device("GPU-1", "gpu", "nvidia", "H100", "nvml")


def _owner(pod: str, container_id: str = "") -> Owner:
    return Owner("ns", pod, "c", f"uid-{pod}", container_id or f"id-{pod}")


def _usage(
    processes: list[ProcessUsage],
    owners: dict[int, Owner],
    allocations: tuple[Allocation, ...],
    devices: tuple[Device, ...],
    index: HeldIndex,
) -> tuple[ContainerUsage, ...]:
    def held() -> dict[str, set[tuple[str, str, str]]]:
        return index.held(allocations, devices)

    cached = container_usage(processes, owners, allocations, devices, held=held)
    assert cached == container_usage(processes, owners, allocations, devices)  # no index
    return cached


def test_usage_groups_by_owner_and_says_requested_as_holders_change() -> None:
    index = HeldIndex()
    devices = (GPU, MIG, OTHER)
    allocs: tuple[Allocation, ...] = (
        Allocation(Holder("ns", "a", "c"), "nvidia.com/mig-1g.10gb", "MIG-0", "MIG-0"),
    )
    procs = [
        ProcessUsage("MIG-0", 1, memory_bytes=10.0, utilization=0.25),
        ProcessUsage("MIG-0", 2, memory_bytes=5.0, utilization=0.5),
        ProcessUsage("GPU-1", 3, memory_bytes=1.0),
        ProcessUsage("GPU-0", 4),
    ]
    # PIDs 1 and 2 are one container (equal owners, not the same object); 3 is nobody's.
    owners = {1: _owner("a"), 2: _owner("a"), 4: _owner("a")}
    got = _usage(procs, owners, allocs, devices, index)
    assert got == (
        ContainerUsage("GPU-0", _owner("a"), 1, None, None, requested=True),  # its parent
        ContainerUsage("GPU-1", None, 1, 1.0, None),
        ContainerUsage("MIG-0", _owner("a"), 2, 15.0, 0.75, requested=True),
    )
    # A new pod on the other GPU, holding it: requested; the process that moved off the
    # slice to GPU-1 is not (pod a holds no GPU-1).
    allocs += (Allocation(Holder("ns", "b", "c"), "nvidia.com/gpu", "GPU-1", "GPU-1"),)
    owners = {1: _owner("a"), 3: _owner("b")}
    procs = [ProcessUsage("GPU-1", 1, utilization=0.1), ProcessUsage("GPU-1", 3)]
    got = _usage(procs, owners, allocs, devices, index)
    assert got == (
        ContainerUsage("GPU-1", _owner("a"), 1, None, 0.1, requested=False),
        ContainerUsage("GPU-1", _owner("b"), 1, None, None, requested=True),
    )
    # The slice gone (MIG mode off): pod a's allocation names no seen device's family.
    got = _usage([ProcessUsage("GPU-0", 1)], {1: _owner("a")}, allocs, (GPU, OTHER), index)
    assert got == (ContainerUsage("GPU-0", _owner("a"), 1, requested=False),)
    # Two owners that differ in one field only (another container ID) are two groups.
    owners = {1: _owner("a"), 2: _owner("a", "id-restarted")}
    procs = [ProcessUsage("MIG-0", 1), ProcessUsage("MIG-0", 2)]
    got = _usage(procs, owners, allocs, devices, index)
    assert [u.owner for u in got] == [_owner("a"), _owner("a", "id-restarted")]
    assert all(u.requested for u in got)
