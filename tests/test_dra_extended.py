"""Extended resources served by DRA (KEP-5004): the pod status the real 1.36 cluster wrote
(tests/test_real_cluster_dra_extended.py, docs/dra.md) parsed, the allocations of that claim
named by the resource the container asked for, and the simulated API server writing the
same status for a scenario's `dra: extended:` claim.

Tier: pure, and the simulated node's loopback API server.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from exporter.dra.claimhealth import read_pod_status
from exporter.dra.extended import parse_extended
from exporter.dra.view import DraView
from exporter.join import join
from exporter.kubeapi.pods import pod_meta
from exporter.model import Allocation, AllocationKind, ExtendedClaim, Holder, PodResourcesState
from simulator.dra import DraPart
from simulator.scenario import parse_scenario

CLAIM = "ext-a-extended-resources-nf5q2"
REAL_STATUS = {
    "requestMappings": [
        {"containerName": "c", "resourceName": "example.com/gpu",
         "requestName": "container-0-request-0"},
        {"containerName": "d", "resourceName": "example.com/gpu",
         "requestName": "container-1-request-0"},
    ],
    "resourceClaimName": CLAIM,
}  # fmt: skip
"""`status.extendedResourceClaimStatus` exactly as the real 1.36 cluster wrote it."""


def _pod(status: dict[str, Any], containers: tuple[str, ...] = ("c", "d")) -> dict[str, Any]:
    return {"metadata": {"name": "ext-a", "namespace": "ns", "uid": "u1"},
            "spec": {"containers": [{"name": c} for c in containers]},
            "status": {"extendedResourceClaimStatus": status}}  # fmt: skip


def test_the_real_status_parses_to_one_entry_per_container() -> None:
    assert parse_extended(_pod(REAL_STATUS)) == (
        ExtendedClaim(CLAIM, "c", "example.com/gpu", "container-0-request-0"),
        ExtendedClaim(CLAIM, "d", "example.com/gpu", "container-1-request-0"),
    )
    assert parse_extended({"metadata": {}, "status": {}}) == ()
    assert pod_meta(_pod(REAL_STATUS), read_pod_status).extended == parse_extended(
        _pod(REAL_STATUS)
    )


def _view(*pods: dict[str, Any]) -> DraView:
    watch = SimpleNamespace(pods={p["metadata"]["uid"]: pod_meta(p, read_pod_status) for p in pods})
    return DraView(pods=cast(Any, watch))


def _dra(container: str, claim: str, device: str, pod: str = "ext-a") -> Allocation:
    return Allocation(Holder("ns", pod, container), "ext.kde.test", device, f"GPU-{device}",
                      kind=AllocationKind.DRA, claim=f"ns/{claim}", driver="ext.kde.test",
                      pool="node-1")  # fmt: skip


def test_only_the_extended_claim_is_named_by_its_resource() -> None:
    two = {"requestMappings": [
        {"containerName": "c", "resourceName": "example.com/gpu", "requestName": "r0"},
        {"containerName": "c", "resourceName": "example.com/nic", "requestName": "r1"}],
        "resourceClaimName": "ext-b-extended-resources-aaaaa"}  # fmt: skip
    other = _pod(two, ("c",))
    other["metadata"] |= {"name": "ext-b", "uid": "u2"}
    view = _view(_pod(REAL_STATUS), other)
    plugin = Allocation(Holder("ns", "ext-a", "c"), "nvidia.com/gpu", "GPU-9", "GPU-9")
    given = [
        _dra("c", CLAIM, "gpu-0"),
        _dra("d", CLAIM, "gpu-1"),
        _dra("c", "ext-a-gpu-x1y2z", "gpu-2"),  # an ordinary claim of the same pod
        _dra("c", "ext-b-extended-resources-aaaaa", "gpu-3", pod="ext-b"),
        plugin,
    ]
    got = [(a.holder.container, a.raw_id, a.resource_name) for a in view.extended(given)]
    assert got == [
        ("c", "gpu-0", "example.com/gpu"),
        ("d", "gpu-1", "example.com/gpu"),
        ("c", "gpu-2", "ext.kde.test"),
        ("c", "gpu-3", "ext.kde.test"),  # two resources, one claim: which is which unknown
        ("c", "GPU-9", "nvidia.com/gpu"),
    ]
    # Kind, claim, pool, device and hw_id stay the DRA ones.
    first = view.extended(given)[0]
    assert (first.kind, first.claim, first.driver, first.pool, first.device_id) == (
        AllocationKind.DRA, f"ns/{CLAIM}", "ext.kde.test", "node-1", "GPU-gpu-0")  # fmt: skip
    assert DraView().extended(given) == given  # no pod watch: nothing known, nothing renamed


SCENARIO = """
node: sim-node
pods:
  - name: ext-a
    namespace: ns
    containers:
      - name: c
        claims:
          - {name: CLAIM, namespace: ns, resources: [{driver: ext.kde.test, pool: sim-node, device: gpu-0}, {driver: ext.kde.test, pool: sim-node, device: gpu-1}]}
      - name: d
        claims:
          - {name: CLAIM, namespace: ns, resources: [{driver: ext.kde.test, pool: sim-node, device: gpu-0}, {driver: ext.kde.test, pool: sim-node, device: gpu-1}]}
dra:
  extended:
    ns/CLAIM: example.com/gpu
""".replace("CLAIM", CLAIM)


def test_the_simulated_api_server_writes_what_the_real_one_did(tmp_path: Path) -> None:
    scenario = parse_scenario(SCENARIO, name="extended")
    part = DraPart(scenario, tmp_path)
    try:
        (timed,) = scenario.listed_at(0.0)
        obj = part._pod(timed, 0.0)
    finally:
        part.close()
    assert obj["status"]["extendedResourceClaimStatus"] == REAL_STATUS
    assert obj["spec"]["resourceClaims"] == [] and obj["status"]["resourceClaimStatuses"] == []
    assert [c.get("allocatedResourcesStatus") for c in obj["status"]["containerStatuses"]] == [
        None, None]  # fmt: skip
    assert obj["spec"]["containers"][0]["resources"] == {"limits": {"example.com/gpu": "2"}}

    # Through the join and the view: each container's two devices named example.com/gpu.
    state = PodResourcesState(pods=tuple(t.pod for t in scenario.listed_at(0.0)))
    ids = {("ext.kde.test", "sim-node", f"gpu-{i}"): f"GPU-{i}" for i in range(2)}
    joined = join([], state, dra=ids)
    named = _view(obj).extended(joined.allocations)
    assert sorted((a.holder.container, a.raw_id, a.resource_name, a.device_id) for a in named) == [
        (c, f"gpu-{i}", "example.com/gpu", f"GPU-{i}") for c in ("c", "d") for i in range(2)]  # fmt: skip
