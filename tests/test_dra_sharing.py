"""DRA's sharing models, pure (exporter/dra/claims.py, holders.py, pool.py, identity.py):
claims as the real 1.36 cluster wrote them (control-plane.md facts 12-15), who holds what once
they are read, what the pools can still give, and the identities of partitions made at
prepare and of DRANET's NICs. The real cluster's answers: test_real_cluster_dra_sharing.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from exporter.dra.claims import MAX_CONDITIONS, parse_claim
from exporter.dra.holders import narrow
from exporter.dra.identity import identify
from exporter.dra.pool import pool_state, shared_capacity
from exporter.dra.slices import parse_slice
from exporter.ids import interface_key, mig_placement_key, normalize_device_id
from exporter.model import (
    ClaimResource,
    Container,
    Device,
    DynamicResource,
    ExtendedClaim,
    Holder,
    Pod,
    PodResourcesState,
)

NODE = "node-a"
DRIVER = "gpu.nvidia.com"
GIB = 2**30
PARENT = "GPU-6a3f1c2e-1b7d-4c1e-9a55-000000000001"


def claim(name: str, results: list[dict[str, Any]], devices: list[dict[str, Any]] | None = None,
          namespace: str = "ml") -> dict[str, Any]:  # fmt: skip
    """A ResourceClaim as the API server returns it."""
    status: dict[str, Any] = {"allocation": {"devices": {"results": results}}}
    if devices is not None:
        status["devices"] = devices
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
            "spec": {"devices": {"requests": [{"name": "gpu"}]}}, "status": status}  # fmt: skip


def result(device: str, request: str = "gpu", **extra: Any) -> dict[str, Any]:
    return {"request": request, "driver": DRIVER, "pool": NODE, "device": device, **extra}


def test_the_real_shapes_parse() -> None:
    """Fact 12's result, fact 14's admin result, fact 15's device status."""
    share = parse_claim(claim("a", [result("gpu-0", consumedCapacity={"memory": "20Gi"},
                                           shareID="886e2808-6f8d-466d-8a33-4bfc00ce6de2")]))  # fmt: skip
    (r,) = share.results
    assert (r.key, r.share_id, r.consumed, r.admin_access) == (
        (DRIVER, NODE, "gpu-0"), "886e2808-6f8d-466d-8a33-4bfc00ce6de2",
        ((f"{DRIVER}/memory", 20 * GIB),), False)  # fmt: skip
    assert parse_claim(claim("m", [result("gpu-0", adminAccess=True)])).results[0].admin_access
    status = {"driver": "dra.net", "pool": NODE, "device": "pci-0000-3b-00-1",
              "conditions": [{"type": f"T{i}", "status": "True", "reason": "R"} for i in range(20)],
              "networkData": {"interfaceName": "eth1", "hardwareAddress": "0c:42:a1:00:00:12",
                              "ips": ["192.0.2.10/24", "2001:db8::10/64"]}}  # fmt: skip
    (d,) = parse_claim(claim("n", [], [status])).devices
    assert (d.interface, d.mac, d.ips) == ("eth1", "0c:42:a1:00:00:12",
                                           ("192.0.2.10/24", "2001:db8::10/64"))  # fmt: skip
    assert len(d.conditions) == MAX_CONDITIONS  # bounded: the API caps them at 8 too
    pending = parse_claim({"metadata": {"name": "p", "namespace": "ml"}, "status": {}})
    assert (pending.allocated, pending.results) == (False, ())
    with pytest.raises(ValueError):
        parse_claim(claim("bad", [result("gpu-0", consumedCapacity={"memory": "lots"})]))


def container(name: str, *claims: tuple[str, list[tuple[str, str]]]) -> Container:
    """`claims`: (claim name, [(device, share ID)])."""
    return Container(name, dynamic_resources=tuple(
        DynamicResource(c, "ml", tuple(ClaimResource(DRIVER, NODE, d, share_id=s) for d, s in devs))
        for c, devs in claims))  # fmt: skip


def devices_of(state: PodResourcesState) -> dict[tuple[str, str], list[str]]:
    return {(p.name, c.name): [r.device_name for d in c.dynamic_resources
                               for r in d.claim_resources]
            for p in state.pods for c in p.containers}  # fmt: skip


def test_admin_access_is_no_holder_and_each_container_keeps_its_own_request() -> None:
    """Fact 14 (PodResources lists an admin claim like any) and KEP-5004 (the whole
    extended-resource claim under each container of its mappings, docs/dra.md)."""
    ext = "ext-extended-resources-nf5q2"
    state = PodResourcesState(pods=(
        Pod("train", "ml", (container("c", ("train-gpu", [("gpu-0", "")])),)),
        Pod("dcgm", "ml", (container("dcgm", ("dcgm-gpus", [("gpu-0", ""), ("gpu-1", "")])),)),
        Pod("ext", "ml", (container("c", (ext, [("gpu-2", ""), ("gpu-3", "")])),
                          container("d", (ext, [("gpu-2", ""), ("gpu-3", "")])))),
        Pod("new", "ml", (container("c", ("new-gpu", [("gpu-4", "")])),)),
        Pod("plain", "ml", (Container("c"),)),
    ))  # fmt: skip
    claims = {
        ("ml", "train-gpu"): parse_claim(claim("train-gpu", [result("gpu-0")])),
        ("ml", "dcgm-gpus"): parse_claim(claim("dcgm-gpus", [
            result("gpu-0", adminAccess=True), result("gpu-1", adminAccess=True)])),
        ("ml", ext): parse_claim(claim(ext, [result("gpu-2", "container-0-request-0"),
                                             result("gpu-3", "container-1-request-0")])),
    }  # fmt: skip
    mappings = {("ml", "ext"): (ExtendedClaim(ext, "c", "example.com/gpu", "container-0-request-0"),
                                ExtendedClaim(ext, "d", "example.com/gpu", "container-1-request-0"))}  # fmt: skip
    pending = {("ml", "new-gpu")}
    got = narrow(state, claims, pending.__contains__, mappings)
    assert devices_of(got.state) == {
        ("train", "c"): ["gpu-0"], ("dcgm", "dcgm"): [],
        ("ext", "c"): ["gpu-2"], ("ext", "d"): ["gpu-3"],
        ("new", "c"): [],  # not read yet: held back a moment (an admin claim must not flash)
        ("plain", "c"): [],
    }  # fmt: skip
    assert [(h.holder, h.claim, h.resource.device_name) for h in got.admin] == [
        (Holder("ml", "dcgm", "dcgm"), "ml/dcgm-gpus", "gpu-0"),
        (Holder("ml", "dcgm", "dcgm"), "ml/dcgm-gpus", "gpu-1"),
    ]
    assert got.holders is not None and got.holders[("ml", ext)] == (
        Holder("ml", "ext", "c"), Holder("ml", "ext", "d"))  # fmt: skip
    # Once the hold is over (or reads are denied) PodResources' word stands.
    assert devices_of(narrow(state, claims, lambda _: False, mappings).state)[("new", "c")] == [
        "gpu-4"]  # fmt: skip
    # Nothing read, nothing pending: the answer is PodResources' own, the same object.
    assert narrow(state, {}, lambda _: False, {}).state is state


def counters_slice(minor: int = 1) -> dict[str, Any]:
    counters = {"multiprocessors": {"value": "132"}, "memory": {"value": "80Gi"},
                **{f"memory-slice-{i}": {"value": "1"} for i in range(8)}}  # fmt: skip
    return {"metadata": {"name": "counters"},
            "spec": {"driver": DRIVER, "nodeName": NODE,
                     "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 2},
                     "sharedCounters": [{"name": f"gpu-{minor}-counter-set", "counters": counters}]}}  # fmt: skip


def placements(profiles: dict[str, tuple[int, int, int, int, tuple[int, ...]]],
               minor: int = 1) -> dict[str, Any]:  # fmt: skip
    """NVIDIA's placements (partitions.go): profile -> (ID, slices, SMs, GiB, starts)."""
    devices = []
    for name, (pid, size, sms, gib, starts) in profiles.items():
        for start in starts:
            counters = {"multiprocessors": {"value": str(sms)}, "memory": {"value": f"{gib}Gi"},
                        **{f"memory-slice-{i}": {"value": "1"} for i in range(start, start + size)}}  # fmt: skip
            devices.append({
                "name": f"gpu-{minor}-mig-{name.replace('.', '')}-{pid}-{start}",
                "attributes": {"type": {"string": "mig"}, "profile": {"string": name},
                               "parentUUID": {"string": PARENT}},
                "consumesCounters": [{"counterSet": f"gpu-{minor}-counter-set",
                                      "counters": counters}]})  # fmt: skip
    return {"metadata": {"name": "devices"},
            "spec": {"driver": DRIVER, "nodeName": NODE,
                     "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 2},
                     "devices": devices}}  # fmt: skip


H100 = {"1g.10gb": (19, 1, 16, 10, (0, 1, 2, 3, 4, 5, 6)), "2g.20gb": (14, 2, 32, 20, (0, 2, 4)),
        "3g.40gb": (9, 4, 60, 40, (0, 4))}  # fmt: skip


def test_free_partitions_per_profile_and_stranded_slices() -> None:
    slices = [parse_slice(counters_slice()), parse_slice(placements(H100))]
    held = {(DRIVER, NODE, "gpu-1-mig-1g10gb-19-0"), (DRIVER, NODE, "gpu-1-mig-1g10gb-19-4")}
    state = pool_state(slices, held)
    assert state.free == {
        (DRIVER, NODE, "mig/1g.10gb"): 5,  # starts 1, 2, 3, 5, 6
        (DRIVER, NODE, "mig/2g.20gb"): 1,  # at 2 (slices 2-3): 0 and 4 overlap held ones
        (DRIVER, NODE, "mig/3g.40gb"): 0,  # both placements cross a held slice
    }
    left = {k[3]: v for k, v in state.left.items()}
    assert (left["multiprocessors"], left["memory"], left["memory-slice-0"]) == (100, 60 * GIB, 0)
    # Slice 7 is free, and no 1g placement reaches it (starts 0-6): stranded.
    stranded = {k[3]: v for k, v in state.stranded.items() if v}
    assert stranded == {"memory-slice-7": 1.0}


def test_a_b200_with_two_3g_profiles_strands_its_last_compute() -> None:
    """partitions.go's own example: on a B200 3g.90gb takes 4 of 8 memory slices but 3 of 7
    compute slices; two of them leave compute no profile can use."""
    b200 = {"3g.90gb": (9, 4, 60, 90, (0, 4)), "1g.23gb": (19, 1, 20, 23, (0, 1, 2, 3, 4, 5, 6))}
    slices = [parse_slice(counters_slice()), parse_slice(placements(b200))]
    held = {(DRIVER, NODE, "gpu-1-mig-3g90gb-9-0"), (DRIVER, NODE, "gpu-1-mig-3g90gb-9-4")}
    state = pool_state(slices, held)
    assert set(state.free.values()) == {0}
    stranded = {k[3]: v for k, v in state.stranded.items() if v}
    assert stranded == {"multiprocessors": 12.0}  # 132 - 2 x 60, no device left to take it


def test_shared_capacity_counts_each_share_once_and_no_admin_share() -> None:
    """Fact 12's device; fact 14: an admin claim's recorded share is not the scheduler's."""
    device = parse_slice({"metadata": {"name": "s"}, "spec": {
        "driver": DRIVER, "nodeName": NODE, "pool": {"name": NODE, "generation": 1},
        "devices": [{"name": "gpu-0", "allowMultipleAllocations": True,
                     "capacity": {"memory": {"value": "80Gi", "requestPolicy": {
                         "default": "10Gi", "validRange": {"min": "10Gi", "step": "10Gi"}}}}},
                    {"name": "gpu-1", "capacity": {"memory": {"value": "80Gi"}}}]}}).devices  # fmt: skip
    claims = [parse_claim(claim("a", [result("gpu-0", consumedCapacity={"memory": "20Gi"})])),
              parse_claim(claim("b", [result("gpu-0", consumedCapacity={"memory": "30Gi"})])),
              parse_claim(claim("m", [result("gpu-0", adminAccess=True,
                                             consumedCapacity={"memory": "40Gi"})]))]  # fmt: skip
    got = shared_capacity(device, [*claims, claims[0]])
    assert [(c.device.name, c.capacity, c.total, c.free) for c in got] == [
        ("gpu-0", f"{DRIVER}/memory", 80 * GIB, 30 * GIB)]  # fmt: skip


def _aliases(*ids: str) -> frozenset[str]:
    return frozenset(normalize_device_id(i)[0] for i in ids)


def test_a_partition_made_at_prepare_joins_by_parent_profile_and_placement() -> None:
    """No UUID in the slice: the MIG device whose GPU instance the NVML source read at that
    profile and placement (discovery.py); one at another placement, or one whose placement
    NVML denied, joins nothing."""
    gpu = Device(PARENT, "gpu", "nvidia", "H100", "nvml", aliases=_aliases(PARENT, "0000:2a:00.0"))
    made = Device("MIG-0b6f4a21-7d3c-5e2a-8f10-000000000102", "gpu", "nvidia", "H100 MIG 1g.10gb",
                  "nvml", parent=PARENT,
                  aliases=_aliases("MIG-0b6f4a21-7d3c-5e2a-8f10-000000000102",
                                   mig_placement_key(PARENT, 19, 2)))  # fmt: skip
    denied = Device("MIG-0b6f4a21-7d3c-5e2a-8f10-000000000103", "gpu", "nvidia",
                    "H100 MIG 3g.40gb", "nvml", parent=PARENT)  # fmt: skip
    slices = [parse_slice(counters_slice()), parse_slice(placements(H100))]
    found = identify(slices, [gpu, made, denied])
    assert {k[2]: v for k, v in found.devices.items()} == {
        "gpu-1-mig-1g10gb-19-2": made.id}  # fmt: skip
    assert len(found.unmatched) == 11


def test_dranet_nics_join_by_pci_address_or_interface_name() -> None:
    """DRANET's attributes (pkg/apis/attributes.go): a VF by `dra.net/pciAddress`, though its
    RDMA port carries the same address (the port is the VF's child); a device with only its
    host-side `dra.net/ifName`, by the netdev source's interface alias."""
    vf = Device("0000:3b:00.2", "network", "mellanox", "ConnectX-7 VF", "netdev",
                parent="0000:3b:00.0", aliases=_aliases("0000:3b:00.2") | {interface_key("ens1f0v0")})  # fmt: skip
    port = Device("mlx5_3/1", "network", "mellanox", "ConnectX-7", "rdma", parent="0000:3b:00.2",
                  aliases=_aliases("0000:3b:00.2"))  # fmt: skip
    pf = Device("0000:5e:00.0", "network", "intel", "E810", "netdev",
                aliases=_aliases("0000:5e:00.0") | {interface_key("ens2f0")})  # fmt: skip
    nics = parse_slice({"metadata": {"name": "n"}, "spec": {
        "driver": "dra.net", "nodeName": NODE, "pool": {"name": NODE, "generation": 1},
        "devices": [
            {"name": "pci-0000-3b-00-2", "attributes": {
                "dra.net/pciAddress": {"string": "0000:3b:00.2"},
                "dra.net/ifName": {"string": "ens1f0v0"}}},
            {"name": "ens2f0", "attributes": {"dra.net/ifName": {"string": "ens2f0"}}}]}})  # fmt: skip
    found = identify([nics], [vf, port, pf])
    assert {k[2]: v for k, v in found.devices.items()} == {
        "pci-0000-3b-00-2": vf.id, "ens2f0": pf.id}  # fmt: skip
