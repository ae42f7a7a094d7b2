"""DRA identity, taints and free capacity from ResourceSlices (exporter/dra/identity.py), pure.

Slices are written as each driver publishes them (attribute names from the drivers' sources,
cited in exporter/dra/identity.py and docs/dra.md); source devices as the NVML, amdgpu and intel
sources describe them (ids and aliases).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from exporter.dra.identity import (
    device_kind,
    device_taints,
    identify,
    numa_nodes,
    unidentified,
)
from exporter.dra.pool import free_devices
from exporter.dra.slices import parse_slice, parse_taint_rule, quantity
from exporter.dra.view import DraView
from exporter.ids import normalize_device_id
from exporter.join import join
from exporter.model import (
    Allocation,
    AllocationKind,
    ClaimResource,
    Container,
    Device,
    DeviceReading,
    DynamicResource,
    Holder,
    Pod,
    PodResourcesState,
    SourceResult,
)

NODE = "node-a"
GPU0 = "GPU-6a3f1c2e-1b7d-4c1e-9a55-000000000000"
GPU1 = "GPU-6a3f1c2e-1b7d-4c1e-9a55-000000000001"
MIG = "MIG-0b6f4a21-7d3c-5e2a-8f10-000000000101"


def _aliases(*ids: str) -> frozenset[str]:
    return frozenset(normalize_device_id(i)[0] for i in ids)


NV0 = Device(GPU0, "gpu", "nvidia", "NVIDIA H100 80GB HBM3", "nvml",
             aliases=_aliases(GPU0, "nvidia0", "00000000:07:00.0", "gpu.nvidia.com/gpu-0"))  # fmt: skip
# GPU 1: index 1 but minor 3 (NVIDIA's DRA driver names devices gpu-<minor>)
NV1 = Device(GPU1, "gpu", "nvidia", "NVIDIA H100 80GB HBM3", "nvml",
             aliases=_aliases(GPU1, "nvidia3", "00000000:0f:00.0", "gpu.nvidia.com/gpu-3"))  # fmt: skip
NVMIG = Device(MIG, "gpu", "nvidia", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", "nvml", parent=GPU1,
               aliases=_aliases(MIG, f"MIG-{GPU1}/7/0", "nvidia3/gi7"))  # fmt: skip
AMD = Device("8f3a1c2e5b7d9e02", "gpu", "amd", "AMD Instinct MI300X OAM", "amdgpu",
             aliases=_aliases("0000:9d:00.0"))  # fmt: skip
INTEL = Device("0000:4d:00.0", "gpu", "intel", "Intel Data Center GPU Flex 170", "intel",
               aliases=_aliases("0000:4d:00.0", "card3"))  # fmt: skip
DEVICES = (NV0, NV1, NVMIG, AMD, INTEL)


def attr(**values: Any) -> dict[str, dict[str, Any]]:
    out = {}
    for name, value in values.items():
        name = name.replace("__", "/").replace("_dot_", ".")
        kind = "int" if isinstance(value, int) else "bool" if isinstance(value, bool) else "string"
        out[name] = {kind: value}
    return out


def rslice(name: str, driver: str, devices: list[dict[str, Any]], *, pool: str = NODE,
           generation: int = 1, counters: list[dict[str, Any]] | None = None) -> dict[str, Any]:  # fmt: skip
    """A resource.k8s.io/v1 ResourceSlice object."""
    spec: dict[str, Any] = {"driver": driver, "nodeName": NODE, "devices": devices,
                            "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1}}  # fmt: skip
    if counters:
        spec["sharedCounters"] = counters
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip


def nvidia_slice() -> dict[str, Any]:
    """As k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/deviceinfo.go publishes: gpu-<minor>,
    gpu-<minor>-mig-<profileId>-<start>-<size>; `pcieBusID` of a MIG device is its parent's."""
    return rslice("node-a-gpu.nvidia.com-x", "gpu.nvidia.com", [
        {"name": "gpu-0", "attributes": attr(type="gpu", uuid=GPU0, pcieBusID="0000:07:00.0",
                                             productName="NVIDIA H100 80GB HBM3"),
         "capacity": {"memory": {"value": "80Gi"}},
         "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory": {"value": "80Gi"}}}]},
        {"name": "gpu-3", "attributes": attr(type="gpu", uuid=GPU1, pcieBusID="0000:0f:00.0"),
         "consumesCounters": [{"counterSet": "gpu-3", "counters": {"memory": {"value": "80Gi"}}}]},
        {"name": "gpu-3-mig-19-0-1", "attributes": attr(type="mig", uuid=MIG, parentUUID=GPU1,
                                                        profile="1g.10gb", pcieBusID="0000:0f:00.0"),
         "consumesCounters": [{"counterSet": "gpu-3", "counters": {"memory": {"value": "10Gi"}}}]},
        {"name": "gpu-3-mig-19-1-1", "attributes": attr(type="mig", uuid="MIG-not-configured",
                                                        profile="1g.10gb", pcieBusID="0000:0f:00.0"),
         "consumesCounters": [{"counterSet": "gpu-3", "counters": {"memory": {"value": "10Gi"}}}]},
    ])  # fmt: skip


def nvidia_counters() -> dict[str, Any]:
    """The pool's shared counters, in a slice of their own: the real 1.36 API server refuses a
    slice with both `sharedCounters` and `devices` (422)."""
    return rslice("node-a-gpu.nvidia.com-c", "gpu.nvidia.com", [], counters=[
        {"name": "gpu-0", "counters": {"memory": {"value": "80Gi"}}},
        {"name": "gpu-3", "counters": {"memory": {"value": "80Gi"}}}])  # fmt: skip


def amd_slice() -> dict[str, Any]:
    """ROCm/k8s-gpu-dra-driver cmd/gpu-kubeletplugin/deviceinfo.go: gpu-<card>-<render>, the
    standard resource.kubernetes.io/pciBusID; no UUID."""
    return rslice("node-a-gpu.amd.com-x", "gpu.amd.com", [
        {"name": "gpu-2-130", "attributes": attr(type="amdgpu", productName="AMD Instinct MI300X OAM",
                                                 numaNode=1, resource_dot_kubernetes_dot_io__pciBusID="0000:9d:00.0")},
    ])  # fmt: skip


def intel_slice() -> dict[str, Any]:
    """intel-resource-drivers-for-kubernetes cmd/kubelet-gpu-plugin/node_state.go: the device
    UID as name, pciAddress and resource.kubernetes.io/pciBusID; a NoExecute health taint."""
    return rslice("node-a-gpu.intel.com-x", "gpu.intel.com", [
        {"name": "0000-4d-00-0-0x56c0", "attributes": attr(model="Flex 170", pciAddress="0000:4d:00.0",
                                                           resource_dot_kubernetes_dot_io__pciBusID="0000:4d:00.0"),
         "taints": [{"key": "HealthIssues-memorytemperature", "effect": "NoExecute",
                     "timeAdded": "2026-11-25T21:00:00Z"}]},
    ])  # fmt: skip


def slices() -> list[Any]:
    return [parse_slice(s) for s in (nvidia_counters(), nvidia_slice(), amd_slice(), intel_slice())]


def state(*claims: tuple[str, str, str, str, str]) -> PodResourcesState:
    """(pod, driver, pool, device, share_id) per container holding one claim."""
    pods = tuple(
        Pod(pod, "ml", (Container("main", dynamic_resources=(DynamicResource(
            f"{pod}-claim", "ml", (ClaimResource(driver, pool, device, (), share),)),)),))
        for pod, driver, pool, device, share in claims
    )  # fmt: skip
    return PodResourcesState(pods=pods)


def joined(st: PodResourcesState, dra: dict[tuple[str, str, str], str] | None) -> dict[str, str]:
    result = join([SourceResult("all", tuple(DeviceReading(d) for d in DEVICES))], st, dra=dra)
    return {a.holder.pod: a.device_id for a in result.allocations}


def identity_map() -> dict[tuple[str, str, str], str]:
    found = identify(slices(), DEVICES)
    return {**dict.fromkeys(found.unmatched, ""), **found.devices}


def test_each_vendor_is_identified_by_its_published_attributes() -> None:
    found = identify(slices(), DEVICES)
    assert found.devices == {
        ("gpu.nvidia.com", NODE, "gpu-0"): GPU0,
        ("gpu.nvidia.com", NODE, "gpu-3"): GPU1,  # by UUID, though its index is 1
        ("gpu.nvidia.com", NODE, "gpu-3-mig-19-0-1"): MIG,  # the MIG UUID, not the parent's bus
        ("gpu.amd.com", NODE, "gpu-2-130"): AMD.id,  # the standard pciBusID
        ("gpu.intel.com", NODE, "0000-4d-00-0-0x56c0"): INTEL.id,
    }
    # A MIG placement with no MIG device behind it: its only other value, the parent's bus
    # ID, is published by three devices and names none of them.
    assert found.unmatched == (("gpu.nvidia.com", NODE, "gpu-3-mig-19-1-1"),)


def test_claims_join_through_the_slices_where_names_alone_go_wrong() -> None:
    st = state(("a", "gpu.nvidia.com", NODE, "gpu-3", ""),
               ("b", "gpu.nvidia.com", NODE, "gpu-3-mig-19-0-1", ""),
               ("c", "gpu.amd.com", NODE, "gpu-2-130", ""),
               ("d", "gpu.intel.com", NODE, "0000-4d-00-0-0x56c0", ""))  # fmt: skip
    assert joined(st, identity_map()) == {"a": GPU1, "b": MIG, "c": AMD.id, "d": INTEL.id}
    # Without slices: the NVML source's gpu-<minor> name joins the whole GPU, nothing else.
    assert joined(st, None) == {"a": GPU1, "b": "", "c": "", "d": ""}


def test_a_device_the_slices_do_not_know_falls_back_to_its_name() -> None:
    st = state(("a", "gpu.nvidia.com", NODE, "gpu-0", ""))
    assert joined(st, {}) == {"a": GPU0}


def test_unmatched_slice_device_is_not_guessed() -> None:
    # gpu-3 is also the NVML source's name-based alias of GPU 1: the slice says that name
    # is something no source sees (another UUID), and its word wins over the guess.
    st = state(("a", "gpu.nvidia.com", NODE, "gpu-3", ""))
    assert joined(st, {("gpu.nvidia.com", NODE, "gpu-3"): ""}) == {"a": ""}


def test_share_id_holders_share_the_device() -> None:
    st = state(("a", "gpu.nvidia.com", NODE, "gpu-0", "5f1d-share-a"),
               ("b", "gpu.nvidia.com", NODE, "gpu-0", "93c2-share-b"))  # fmt: skip
    result = join([SourceResult("all", tuple(DeviceReading(d) for d in DEVICES))], st,
                  dra=identity_map())  # fmt: skip
    assert [(a.holder.pod, a.device_id, a.shared, a.replica) for a in result.allocations] == [
        ("a", GPU0, True, "5f1d-share-a"),
        ("b", GPU0, True, "93c2-share-b"),
    ]
    gpu0 = next(d for d in result.devices if d.reading.device.id == GPU0)
    assert (gpu0.holder, gpu0.holders) == (None, 2)  # no copied labels, two holders


def test_free_devices_per_kind_with_shared_counters_and_taints() -> None:
    held = [Allocation(Holder("ml", "b", "main"), "gpu.nvidia.com", "gpu-3-mig-19-0-1", MIG,
                       kind=AllocationKind.DRA, driver="gpu.nvidia.com", pool=NODE)]  # fmt: skip
    assert free_devices(slices(), held) == {
        ("gpu.amd.com", NODE, "amdgpu"): 1,
        ("gpu.intel.com", NODE, "device"): 0,  # tainted NoExecute
        # gpu-3 whole needs its 80Gi of memory slices; the MIG device holds 10Gi of them
        ("gpu.nvidia.com", NODE, "gpu"): 1,
        ("gpu.nvidia.com", NODE, "mig/1g.10gb"): 1,  # the other placement; the held one is not
    }
    assert free_devices(slices(), []) == {
        ("gpu.amd.com", NODE, "amdgpu"): 1,
        ("gpu.intel.com", NODE, "device"): 0,
        ("gpu.nvidia.com", NODE, "gpu"): 2,
        ("gpu.nvidia.com", NODE, "mig/1g.10gb"): 2,
    }


def test_only_the_newest_pool_generation_counts() -> None:
    old = parse_slice(rslice("old", "gpu.amd.com", [{"name": "gpu-9-200", "attributes": {}}],
                             generation=1))  # fmt: skip
    new = parse_slice(amd_slice() | {"metadata": {"name": "new"}})
    new = type(new)(new.name, new.driver, new.pool, 2, new.devices)
    assert [d.name for d in identify([old, new], DEVICES).slices] == ["gpu-2-130"]


def test_taints_from_slices_and_rules() -> None:
    rule = parse_taint_rule({"apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule",
                             "metadata": {"name": "drain-gpu-0"},
                             "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "device": "gpu-0"},
                                      "taint": {"key": "maintenance", "value": "drain", "effect": "NoSchedule"}}})  # fmt: skip
    devices = [d for s in slices() for d in s.devices]
    got = [(d.name, t.key, t.value, t.effect, src) for d, t, src in device_taints(devices, [rule])]
    assert got == [
        ("0000-4d-00-0-0x56c0", "HealthIssues-memorytemperature", "", "NoExecute", "slice"),
        ("gpu-0", "maintenance", "drain", "NoSchedule", "drain-gpu-0"),
    ]
    free = free_devices(slices(), [], [rule])
    assert free[("gpu.nvidia.com", NODE, "gpu")] == 1


@pytest.mark.parametrize(
    ("raw", "value"),
    [("80Gi", 80 * 2**30), ("1", 1.0), ("500m", 0.5), ("1e3", 1000.0), ("10G", 1e10)],
)
def test_quantities(raw: str, value: float) -> None:
    assert quantity(raw) == value


def test_kinds() -> None:
    kinds = sorted({device_kind(d) for s in slices() for d in s.devices})
    assert kinds == ["amdgpu", "device", "gpu", "mig/1g.10gb"]


def test_without_the_api_an_unidentified_device_is_counted_and_named_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    st = state(
        ("a", "gpu.amd.com", NODE, "gpu-2-130", ""), ("b", "gpu.nvidia.com", NODE, "gpu-0", "")
    )
    result = join([SourceResult("all", tuple(DeviceReading(d) for d in DEVICES))], st)
    assert unidentified(result.allocations) == (("gpu.amd.com", NODE, "gpu-2-130"),)
    view = DraView()
    with caplog.at_level(logging.INFO, logger="exporter.dra"):
        for _ in range(3):  # three cycles, one line
            view.observe(result.allocations)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1
    assert "gpu.amd.com/node-a/gpu-2-130" in lines[0] and "--kubernetes.dra" in lines[0]
    assert [(s.metric, s.value) for s in view.self_samples()] == [
        ("kube_device_exporter.dra.unidentified", 1.0)
    ]


def test_numa_placement_of_a_dra_claim_from_its_slice() -> None:
    """AMD publishes `numaNode` (ROCm/k8s-gpu-dra-driver deviceinfo.go): a container holding
    that GPU with exclusive CPUs on node 0 is placed on node 1 for its device, misaligned.
    NVIDIA's GPU devices publish no NUMA node (only pcieRoot): not placed."""
    found = identify(slices(), DEVICES)
    numa = numa_nodes(found.slices)
    assert numa == {("gpu.amd.com", NODE, "gpu-2-130"): 1}
    claim = DynamicResource("rocm", "ml", (ClaimResource("gpu.amd.com", NODE, "gpu-2-130"),))
    nv = DynamicResource("nv", "ml", (ClaimResource("gpu.nvidia.com", NODE, "gpu-0"),))
    pods = (
        Pod("rocm", "ml", (Container("main", cpu_ids=(0, 1), dynamic_resources=(claim,)),)),
        Pod("nv", "ml", (Container("main", cpu_ids=(0, 1), dynamic_resources=(nv,)),)),
    )
    result = join([SourceResult("all", tuple(DeviceReading(d) for d in DEVICES))],
                  PodResourcesState(pods=pods), cpu_nodes={0: 0, 1: 0}, dra_numa=numa)  # fmt: skip
    (placed,) = result.containers
    assert (placed.holder.pod, placed.devices, placed.cpus, placed.aligned) == (
        "rocm", (("gpu.amd.com", 1),), (0,), False)  # fmt: skip
