"""The join, table-tested: every device-ID form, sharing modes, pools, DRA, allocatable."""

from __future__ import annotations

from dataclasses import replace

import pytest

from exporter.ids import ResourceMatcher, normalize_device_id, pci_address
from exporter.join import join
from exporter.model import (
    AllocationKind,
    ClaimResource,
    Container,
    ContainerDevices,
    Device,
    DeviceReading,
    DynamicResource,
    Holder,
    Pod,
    PodResourcesState,
    SourceResult,
)

GPU0 = "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"
GPU1 = "GPU-11111111-2222-3333-4444-555555555555"
MIG = "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"


@pytest.mark.parametrize(
    ("raw", "key", "replica"),
    [
        (GPU0, GPU0, ""),
        (f"{GPU0}::3", GPU0, "3"),
        (f"{MIG}::0", MIG, "0"),
        (f"MIG-{GPU0}/1/0", f"MIG-{GPU0}/1/0", ""),
        ("nvidia0", "nvidia0", ""),
        ("nvidia3/vgpu2", "nvidia3", "2"),
        ("nvidia0/gi7", "nvidia0/gi7", ""),
        ("nvidia0/gi3/vgpu1", "nvidia0/gi3", "1"),
        ("card1-4", "card1", "4"),
        ("0000:19:00.0", "0000:19:00.0", ""),
        ("0000:AF:00.1", "0000:af:00.1", ""),
        ("00000000:07:00.0", "0000:07:00.0", ""),
        ("3b:00.0", "0000:3b:00.0", ""),
        ("amdgpu_xcp_30", "amdgpu_xcp_30", ""),
        ("0", "0", ""),
        ("mlx5_core.sf.4", "mlx5_core.sf.4", ""),
    ],
)
def test_normalize(raw: str, key: str, replica: str) -> None:
    assert normalize_device_id(raw) == (key, replica)


def test_pci_address_rejects_non_addresses() -> None:
    assert pci_address("GPU-1") is None
    assert pci_address("0000:19:00.9") is None


def dev(id_: str, *aliases: str, parent: str = "", pools: tuple[str, ...] = ()) -> Device:
    return Device(
        id=id_, type="gpu", vendor="nvidia", model="H100", source="t", parent=parent,
        aliases=frozenset(aliases), pools=frozenset(pools),
    )  # fmt: skip


DEVICES = (
    dev(GPU0, "nvidia0", "0000:07:00.0"),
    dev(MIG, f"MIG-{GPU0}/1/0", "nvidia0/gi1", parent=GPU0),
    dev(GPU1, "nvidia1"),
    dev("mlx5_0/1", "0000:3b:00.0", pools=("rdma/hca_a",)),
    dev("mlx5_1/1", "0000:3c:00.0", pools=("rdma/hca_a",)),
)
RESULT = SourceResult("t", tuple(DeviceReading(d) for d in DEVICES))


def container(name: str, resource: str, *ids: str) -> Container:
    return Container(name, (ContainerDevices(resource, ids, (0,)),))


def holders_of(result, device_id: str) -> list[tuple[str, str, bool]]:  # type: ignore[no-untyped-def]
    return [
        (a.holder.pod, a.raw_id, a.shared) for a in result.allocations if a.device_id == device_id
    ]


def run(*pods: Pod, allocatable: tuple[ContainerDevices, ...] = ()):  # type: ignore[no-untyped-def]
    return join([RESULT], PodResourcesState(pods=pods, allocatable=allocatable))


def joined(result, device_id: str):  # type: ignore[no-untyped-def]
    return next(j for j in result.devices if j.reading.device.id == device_id)


def test_exclusive_gpu_gets_its_holder() -> None:
    result = run(Pod("train", "ml", (container("main", "nvidia.com/gpu", GPU1),)))
    assert joined(result, GPU1).holder == Holder("ml", "train", "main")
    assert holders_of(result, GPU1) == [("train", GPU1, False)]


@pytest.mark.parametrize("raw", [MIG, f"MIG-{GPU0}/1/0", "nvidia0/gi1", f"{MIG}::0"])
def test_mig_slice_by_every_id_form(raw: str) -> None:
    result = run(Pod("nb", "r", (container("c", "nvidia.com/mig-1g.10gb", raw),)))
    assert joined(result, MIG).holder == Holder("r", "nb", "c")
    assert joined(result, GPU0).holder is None  # the parent GPU is nobody's


@pytest.mark.parametrize("raw", ["nvidia1", "nvidia1/vgpu0", f"{GPU1}::0"])
def test_gke_and_replica_forms(raw: str) -> None:
    result = run(Pod("p", "n", (container("c", "nvidia.com/gpu", raw),)))
    assert joined(result, GPU1).holder == Holder("n", "p", "c")


def test_time_sliced_gpu_has_no_single_holder_and_one_allocation_each() -> None:
    result = run(
        Pod("a", "b", (container("w", "nvidia.com/gpu", f"{GPU1}::0"),)),
        Pod("b", "b", (container("w", "nvidia.com/gpu", f"{GPU1}::1"),)),
    )
    device = joined(result, GPU1)
    assert device.holder is None
    assert device.holders == 2
    assert sorted(holders_of(result, GPU1)) == [
        ("a", f"{GPU1}::0", True),
        ("b", f"{GPU1}::1", True),
    ]
    assert {a.replica for a in result.allocations} == {"0", "1"}


def test_renamed_shared_resource_is_marked_shared_even_with_one_holder() -> None:
    result = run(Pod("a", "b", (container("w", "nvidia.com/gpu.shared", f"{GPU1}::0"),)))
    assert joined(result, GPU1).holder == Holder("b", "a", "w")
    assert holders_of(result, GPU1) == [("a", f"{GPU1}::0", True)]


def test_two_containers_holding_one_device_without_replicas_are_shared() -> None:
    result = run(
        Pod(
            "a",
            "n",
            (container("x", "nvidia.com/gpu", GPU1), container("y", "nvidia.com/gpu", GPU1)),
        )
    )
    assert joined(result, GPU1).holder is None
    assert all(shared for _, _, shared in holders_of(result, GPU1))


def test_rdma_shared_pool_ids_map_to_every_pool_device() -> None:
    result = run(Pod("mpi", "hpc", (container("rank0", "rdma/hca_a", "0"),)))
    assert holders_of(result, "mlx5_0/1") == [("mpi", "0", True)]
    assert holders_of(result, "mlx5_1/1") == [("mpi", "0", True)]


def test_pci_address_in_other_case_and_domain_width() -> None:
    result = run(Pod("p", "n", (container("c", "intel.com/sriov", "0000:3B:00.0"),)))
    assert joined(result, "mlx5_0/1").holder == Holder("n", "p", "c")


def test_unknown_device_keeps_an_allocation_with_empty_device() -> None:
    result = run(Pod("p", "n", (container("c", "nvidia.com/gpu", "GPU-unknown"),)))
    (alloc,) = result.allocations
    assert (alloc.device_id, alloc.raw_id) == ("", "GPU-unknown")


def test_resources_outside_the_patterns_are_ignored() -> None:
    pod = Pod("p", "n", (container("c", "example.com/fpga", GPU1),))
    assert join([RESULT], PodResourcesState(pods=(pod,))).allocations == ()
    matcher = ResourceMatcher(["example.com/*"])
    assert len(join([RESULT], PodResourcesState(pods=(pod,)), matcher).allocations) == 1


def test_allocatable_devices_are_marked() -> None:
    result = run(allocatable=(ContainerDevices("nvidia.com/gpu", (f"{GPU1}::0", f"{GPU1}::1")),))
    assert joined(result, GPU1).allocatable
    assert not joined(result, GPU0).allocatable


def test_dra_claims_are_parsed_and_joined_by_device_name() -> None:
    claimed = Device(
        GPU1, "gpu", "nvidia", "H100", "t", aliases=frozenset({"gpu.nvidia.com/gpu-1"})
    )
    pod = Pod(
        "p", "n",
        (Container("c", dynamic_resources=(DynamicResource("claim", "n", (
            ClaimResource("gpu.nvidia.com", "node-a", "gpu-1", ("nvidia.com/gpu=gpu-1",)),
            ClaimResource("gpu.nvidia.com", "node-a", "gpu-9"),
        )),)),),
    )  # fmt: skip
    result = join([SourceResult("t", (DeviceReading(claimed),))], PodResourcesState(pods=(pod,)))
    found, missing = sorted(result.allocations, key=lambda a: a.raw_id)
    assert (found.kind, found.device_id, found.claim, found.pool) == (
        AllocationKind.DRA,
        GPU1,
        "n/claim",
        "node-a",
    )
    assert missing.device_id == ""
    assert joined(result, GPU1).holder == Holder("n", "p", "c")


def test_no_kubelet_still_lists_every_device() -> None:
    result = join([RESULT], None)
    assert len(result.devices) == len(DEVICES)
    assert result.allocations == ()


def intel(resource_ids: tuple[str, ...], held: str) -> bool:
    card = Device("0000:03:00.0", "gpu", "intel", "Arc", "t", aliases=frozenset({"card0"}))
    state = PodResourcesState(
        pods=(Pod("p", "n", (container("c", "gpu.intel.com/i915", held),)),),
        allocatable=(ContainerDevices("gpu.intel.com/i915", resource_ids),),
        allocatable_known=True,
    )
    (alloc,) = join([SourceResult("t", (DeviceReading(card),))], state).allocations
    assert alloc.device_id == "0000:03:00.0"
    return alloc.shared


def test_intel_card_with_one_slot_is_not_shared() -> None:
    assert not intel(("card0-0",), "card0-0")  # the plugin's default -shared-dev-num 1
    assert intel(("card0-0", "card0-1", "card0-2"), "card0-1")


def test_an_id_claimed_by_two_sources_resolves_to_both() -> None:
    """A RoCE VF is a NIC VF (netdev source) and an RDMA port (rdma source)."""
    vf = "0000:3b:02.1"
    nic = Device(vf, "network", "intel", "E810 VF", "netdev")
    port = Device("mlx5_4/1", "network", "mellanox", "CX7 VF", "rdma", aliases=frozenset({vf}))
    state = PodResourcesState(pods=(Pod("p", "n", (container("c", "intel.com/sriov", vf),)),))
    result = join([SourceResult("t", (DeviceReading(nic), DeviceReading(port)))], state)
    assert sorted(a.device_id for a in result.allocations) == ["0000:3b:02.1", "mlx5_4/1"]
    assert all(j.holder == Holder("n", "p", "c") for j in result.devices)


def test_allocatable_outside_the_patterns_is_left_out() -> None:
    state = PodResourcesState(
        allocatable=(
            ContainerDevices("nvidia.com/gpu", (GPU1,)),
            ContainerDevices("cpu/x", ("1",)),
        ),
        allocatable_known=True,
    )
    result = join([RESULT], state)
    assert [d.resource_name for d in result.allocatable] == ["nvidia.com/gpu"]


def test_a_resource_with_nothing_allocatable_is_a_plugin_gone_not_unhealthy_devices() -> None:
    """Real kubelet, behaviour 10 (docs/podresources.md): a device plugin that stops takes
    all its devices out of GetAllocatableResources at once. Its devices then have no
    resource (no hw_device_allocatable series), while a device that leaves a resource whose
    other devices stay listed is not allocatable (its plugin said unhealthy)."""
    held = Pod("p", "n", (container("c", "nvidia.com/gpu", GPU1),))
    gone = PodResourcesState(
        pods=(held,),
        allocatable=(ContainerDevices("example.com/nic", ("mlx5_0/1",)),),
        allocatable_known=True,
    )
    result = join([RESULT], gone, known_resources={GPU1: "nvidia.com/gpu", GPU0: "nvidia.com/gpu"})
    assert (joined(result, GPU1).resource, joined(result, GPU0).resource) == ("", "")
    assert len(result.allocations) == 1  # the holder keeps its allocation
    unhealthy = PodResourcesState(
        pods=(held,),
        allocatable=(ContainerDevices("nvidia.com/gpu", (GPU0,)),),  # GPU1 left it alone
        allocatable_known=True,
    )
    result = join([RESULT], unhealthy, known_resources={GPU1: "nvidia.com/gpu"})
    assert (joined(result, GPU1).resource, joined(result, GPU1).allocatable) == (
        "nvidia.com/gpu",
        False,
    )


def registered(state: PodResourcesState, **known: str) -> dict[str, bool]:
    return dict(join([RESULT], state, known_resources=known).registered)


def gpus(*ids: str) -> tuple[ContainerDevices, ...]:
    return (ContainerDevices("nvidia.com/gpu", ids),) if ids else ()


def test_a_plugin_gone_is_not_registered_and_its_devices_have_no_allocatable_series() -> None:
    """hw_allocation_resource_registered: the resource reads 0 (not registered) once the
    kubelet lists none of its devices, though it listed them to this process before;
    its devices then have no resource (no hw_device_allocatable series, not 0)."""
    listed = frozenset({"nvidia.com/gpu"})
    before = PodResourcesState(allocatable=gpus(GPU0, GPU1), allocatable_known=True)
    assert registered(before) == {"nvidia.com/gpu": True}
    gone = PodResourcesState(allocatable_known=True, resources_listed=listed)
    result = join([RESULT], gone, known_resources={GPU0: "nvidia.com/gpu"})
    assert dict(result.registered) == {"nvidia.com/gpu": False}
    assert [j.resource for j in result.devices if j.resource] == []
    back = PodResourcesState(allocatable=gpus(GPU0, GPU1), allocatable_known=True)
    assert registered(replace(back, resources_listed=listed)) == {"nvidia.com/gpu": True}


def test_a_container_holding_devices_of_a_resource_never_listed_reads_not_registered() -> None:
    """An exporter started while the plugin is down has no memory of it; a container that
    holds its devices says the resource exists. A resource nobody holds and this process
    never saw listed has no series (nothing says it ever existed on this node)."""
    held = Pod("p", "n", (container("c", "nvidia.com/gpu", GPU1),))
    state = PodResourcesState(pods=(held,), allocatable_known=True)
    assert registered(state) == {"nvidia.com/gpu": False}
    assert registered(PodResourcesState(allocatable_known=True)) == {}


def test_one_device_unhealthy_is_that_device_not_allocatable_the_resource_registered() -> None:
    state = PodResourcesState(
        allocatable=gpus(GPU0),
        allocatable_known=True,
        resources_listed=frozenset({"nvidia.com/gpu"}),
    )
    result = join([RESULT], state, known_resources={GPU1: "nvidia.com/gpu"})
    assert dict(result.registered) == {"nvidia.com/gpu": True}
    assert (joined(result, GPU1).resource, joined(result, GPU1).allocatable) == (
        "nvidia.com/gpu",
        False,
    )
    assert joined(result, GPU0).allocatable


def test_a_one_device_resource_whose_device_turns_unhealthy_reads_not_registered() -> None:
    """The kubelet's answer is the same as for a plugin gone (the help text says so); the
    device comes back and so does the resource."""
    mig = ContainerDevices("nvidia.com/mig-1g.10gb", (MIG,))
    listed = frozenset({"nvidia.com/gpu", "nvidia.com/mig-1g.10gb"})
    healthy = PodResourcesState(
        allocatable=(*gpus(GPU0), mig), allocatable_known=True, resources_listed=listed
    )
    assert registered(healthy) == {"nvidia.com/gpu": True, "nvidia.com/mig-1g.10gb": True}
    unhealthy = replace(healthy, allocatable=gpus(GPU0))
    assert registered(unhealthy) == {"nvidia.com/gpu": True, "nvidia.com/mig-1g.10gb": False}
    assert registered(healthy) == {"nvidia.com/gpu": True, "nvidia.com/mig-1g.10gb": True}


def test_no_registered_series_while_the_allocatable_list_is_unknown() -> None:
    """v1alpha1 or the gate off: a container's holdings say nothing about the plugin."""
    held = Pod("p", "n", (container("c", "nvidia.com/gpu", GPU1),))
    state = PodResourcesState(pods=(held,), resources_listed=frozenset({"nvidia.com/gpu"}))
    assert registered(state, **{GPU1: "nvidia.com/gpu"}) == {}


def test_resources_outside_the_patterns_have_no_registered_series() -> None:
    state = PodResourcesState(
        allocatable_known=True, resources_listed=frozenset({"cpu/x", "nvidia.com/gpu"})
    )
    assert registered(state) == {"nvidia.com/gpu": False}
