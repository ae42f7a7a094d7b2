"""Extended resources served by DRA (KEP-5004, beta in 1.36, gate `DRAExtendedResource`)
on the real 1.36 cluster: a DeviceClass with `spec.extendedResourceName`, a pod that asks for
that name in `resources.limits` with no claim of its own, the real scheduler making the
special claim, the tests' own DRA driver (tests/realcluster/dradriver.py) preparing it.

What it answered (docs/dra.md): the pod's `status.extendedResourceClaimStatus` names the
claim (`<pod>-extended-resources-xxxxx`) and maps each container to `example.com/gpu` and its
request; PodResources List and Get carry the claim in `dynamic_resources` of every mapped
container, each with all of the claim's devices, and nothing names the resource; the kubelet
writes no `allocatedResourcesStatus` for it. The exporter names those allocations by the
resource, each container with only the device of its own request (from the claim's results
and the pod's mappings), joined to the NVML stand-in through the slice's `uuid`; an ordinary
claim of the same DeviceClass keeps the driver.

Tier: real cluster (the session's control plane and 1.36 kubelet).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from exporter._proto.podresources.v1 import api_pb2 as v1
from exporter._proto.podresources.v1 import api_pb2_grpc as v1_grpc
from tests.realcluster import rbac
from tests.realcluster.api import Api, ApiStatus, namespace
from tests.realcluster.controlplane import ControlPlane
from tests.realcluster.daemons import wait_for
from tests.realcluster.dradriver import DraDriver
from tests.realcluster.exporter import Metrics, on_node
from tests.realcluster.node import ClusterNode, pod_spec
from tests.realnode.nvml import StandInNvml

pytestmark = pytest.mark.peer

NS = "kde-dra-extended"
DRIVER = "ext.kde.test"
EXTENDED = "example.com/gpu"
CLASS = "kde-extended"
GPUS = tuple(f"GPU-5e0c4a1b-7d2e-4c3f-9a8b-{i:012x}" for i in range(3))
MIG_PARENT = "GPU-5e0c4a1b-7d2e-4c3f-9a8b-0000000000ff"
MIGS = ("MIG-5e0c4a1b-7d2e-4c3f-9a8b-000000000101",)


def _gpu(index: int) -> dict[str, Any]:
    return {"name": f"gpu-{index}",
            "attributes": {"type": {"string": "gpu"}, "uuid": {"string": GPUS[index]},
                           "index": {"int": index}}}  # fmt: skip


@dataclass
class Ext:
    admin: Api
    node: ClusterNode
    driver: DraDriver
    kubeconfig: Path
    nvml: StandInNvml
    tmp: Path


def _device_class() -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": CLASS},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}],
                     "extendedResourceName": EXTENDED}}  # fmt: skip


@pytest.fixture(scope="module")
def ext(control_plane: ControlPlane, cluster_node: ClusterNode,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ext]:  # fmt: skip
    admin = control_plane.admin()
    tmp = tmp_path_factory.mktemp("dra-extended")
    namespace(admin, NS)
    driver = DraDriver(DRIVER, cluster_node.name, cluster_node.kubelet.root_dir, admin,
                       [_gpu(i) for i in range(len(GPUS))]).start()  # fmt: skip
    nvml = StandInNvml(tmp, GPUS, MIG_PARENT, MIGS)
    klass = _device_class()
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "plain", "namespace": NS},
                "spec": {"spec": {"devices": {"requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": CLASS}}]}}}}  # fmt: skip
    try:
        wait_for(f"{DRIVER} registered", lambda: driver.registered == [(True, "")], 30,
                 interval=0.1)  # fmt: skip
        driver.publish()
        admin.apply(klass)
        admin.apply(template)
        token = rbac.install_kit(admin, dra=True)
        kubeconfig = control_plane.token_kubeconfig(tmp / "exporter.kubeconfig", token)
        yield Ext(admin, cluster_node, driver, kubeconfig, nvml, tmp)
    finally:
        admin.request("DELETE", f"/api/v1/namespaces/{NS}")
        wait_for("the pods gone", functools.partial(_gone, admin), 60, interval=0.5)
        admin.delete(driver.slice())
        driver.stop()
        admin.delete(klass)
        nvml.close()


def _gone(admin: Api) -> bool:
    try:
        admin.get(f"/api/v1/namespaces/{NS}")
    except ApiStatus as exc:
        return exc.code == 404
    return False


def _extended_pod(name: str) -> dict[str, Any]:
    """Two containers, each asking for one EXTENDED in its limits, and no claim."""
    spec = pod_spec(devices=0)
    (first,) = spec["containers"]
    first["resources"] = {"limits": {EXTENDED: "1"}}
    spec["containers"].append({**first, "name": "d"})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": spec}  # fmt: skip


def _claim_pod(name: str) -> dict[str, Any]:
    """An ordinary claim, from a template of the same DeviceClass."""
    spec = pod_spec(devices=0)
    spec["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "plain"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": spec}  # fmt: skip


def _running(admin: Api, name: str) -> dict[str, Any]:
    path = f"/api/v1/namespaces/{NS}/pods/{name}"
    wait_for(f"pod {name} Running", lambda: admin.get(path)["status"].get("phase") == "Running",
             90, interval=0.25)  # fmt: skip
    pod: dict[str, Any] = admin.get(path)
    return pod


def _listed(socket: Path) -> tuple[v1.ListPodResourcesResponse, v1.GetPodResourcesResponse]:
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = v1_grpc.PodResourcesListerStub(channel)
        listed = stub.List(v1.ListPodResourcesRequest(), timeout=5)
        got = stub.Get(v1.GetPodResourcesRequest(pod_name="ext-a", pod_namespace=NS), timeout=5)
    return listed, got


def _allocations(metrics: Metrics) -> set[tuple[str, ...]]:
    """(pod, container, kind, resource, claim, device, hw_id) of hw_allocation_info here."""
    keys = ("k8s_pod_name", "k8s_container_name", "hw_allocation_kind",
            "hw_allocation_resource", "hw_allocation_claim", "hw_allocation_device_id", "hw_id")  # fmt: skip
    return {tuple(dict(s).get(k, "") for k in keys) for s in metrics.series("hw_allocation_info")
            if dict(s).get("k8s_namespace_name") == NS}  # fmt: skip


def test_extended_resource_claim_is_named_by_the_resource(ext: Ext) -> None:
    admin = ext.admin
    admin.apply(_extended_pod("ext-a"))
    admin.apply(_claim_pod("plain"))
    pod = _running(admin, "ext-a")
    _running(admin, "plain")

    # The scheduler made the claim; the pod's status is the only place naming the resource.
    status = pod["status"]["extendedResourceClaimStatus"]
    claim = status["resourceClaimName"]
    assert (
        claim.startswith("ext-a-extended-resources-")
        and len(claim) == len("ext-a-extended-resources-") + 5
    )
    assert status["requestMappings"] == [
        {"containerName": "c", "resourceName": EXTENDED, "requestName": "container-0-request-0"},
        {"containerName": "d", "resourceName": EXTENDED, "requestName": "container-1-request-0"},
    ]
    assert "resourceClaims" not in pod["spec"] and "resourceClaimStatuses" not in pod["status"]
    obj = admin.get(f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/{claim}")
    assert obj["metadata"]["annotations"] == {
        "resource.kubernetes.io/extended-resource-claim": "true"
    }
    results = {r["request"]: r["device"] for r in obj["status"]["allocation"]["devices"]["results"]}
    assert sorted(results) == ["container-0-request-0", "container-1-request-0"]
    both = sorted(results.values())

    # PodResources: the whole claim under each container of the mappings (the kubelet's
    # GetContainerClaimInfos), no request names, nothing of EXTENDED; Get the same.
    listed, got = _listed(ext.node.socket)
    pods = {p.name: p for p in listed.pod_resources if p.namespace == NS}
    assert [c.name for c in pods["ext-a"].containers] == ["c", "d"]
    for container in pods["ext-a"].containers:
        assert list(container.devices) == []
        (dyn,) = container.dynamic_resources
        assert (dyn.claim_name, dyn.claim_namespace) == (claim, NS)
        assert sorted(r.device_name for r in dyn.claim_resources) == both
        assert {(r.driver_name, r.pool_name) for r in dyn.claim_resources} == {
            (DRIVER, ext.node.name)
        }
    assert got.pod_resources == pods["ext-a"]
    (plain,) = pods["plain"].containers[0].dynamic_resources
    plain_claim = plain.claim_name
    (other,) = {"gpu-0", "gpu-1", "gpu-2"} - set(both)
    assert [r.device_name for r in plain.claim_resources] == [other]

    uuid = {f"gpu-{i}": GPUS[i] for i in range(len(GPUS))}
    # The exporter reads the claim: each container holds the device of its own request.
    own = {"c": results["container-0-request-0"], "d": results["container-1-request-0"]}
    want = {("ext-a", c, "dra", EXTENDED, f"{NS}/{claim}", dev, uuid[dev])
            for c, dev in own.items()}  # fmt: skip
    want |= {("plain", "c", "dra", DRIVER, f"{NS}/{plain_claim}", other, uuid[other])}
    with on_node(ext.tmp, ext.node.socket, ext.node.name, ext.kubeconfig,
                 "--kubernetes.dra", env=ext.nvml.env()) as metrics:  # fmt: skip
        metrics.wait("the extended claim named by its resource",
                     lambda m: _allocations(m) == want, 60)  # fmt: skip
        # The device series keep the driver: they describe the device, not the holder.
        info = {(dict(s)["hw_allocation_resource"], dict(s)["hw_allocation_device_id"])
                for s in metrics.series("hw_dra_device_info")}  # fmt: skip
        assert info == {(DRIVER, f"gpu-{i}") for i in range(len(GPUS))}
        assert metrics.value("kube_device_exporter_dra_unidentified") == 0

        # Health: the kubelet writes none for the extended claim (its containers name no
        # claim in resources.claims), only for the ordinary one.
        for device in uuid:
            ext.driver.set_health(device, "Unhealthy", "XID 79")
        path = f"/api/v1/namespaces/{NS}/pods/"
        wait_for("the ordinary claim's health", lambda: admin.get(path + "plain")["status"][
            "containerStatuses"][0].get("allocatedResourcesStatus") == [
                {"name": "claim:gpu", "resources": [{
                    "resourceID": f"{DRIVER}/{ext.node.name}/{other}", "health": "Unhealthy",
                    "message": "XID 79"}]}], 30, interval=0.25)  # fmt: skip
        statuses = admin.get(path + "ext-a")["status"]["containerStatuses"]
        assert [s.get("allocatedResourcesStatus") for s in statuses] == [None, None]
        metrics.wait("the ordinary claim's health series", lambda m: {
            (dict(s)["k8s_pod_name"], dict(s)["hw_dra_health"])
            for s in m.series("hw_dra_allocation_health")
            if dict(s).get("k8s_namespace_name") == NS} == {("plain", "Unhealthy")}, 30)  # fmt: skip
