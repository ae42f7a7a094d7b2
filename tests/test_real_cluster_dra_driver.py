"""DRA end to end on the real 1.36 cluster: a DRA driver of the tests' own
(tests/realcluster/dradriver.py) registers with the real kubelet and publishes its slice; the
real scheduler allocates from ResourceClaimTemplates, the kubelet prepares the claims through
the driver, the pods run on containerd, and the exporter (`--kubernetes.api
--kubernetes.dra`, the kit's DRA RBAC, the NVML stand-in) joins each claim the kubelet's
PodResources lists to a simulated NVML device: by `uuid` (a driver shaped like NVIDIA's) and
by `resource.kubernetes.io/pciBusID` (a driver naming its devices by PCI address), and a
shared device (`allowMultipleAllocations`) held by two pods, each with its share ID.

What the 1.36 kubelet answered is recorded in docs/dra.md ("On a real 1.36 kubelet"): the
simulated kubelet's List has the same shape (simulator/scenarios/dra.yaml); the simulated API
server named a claim's health by the ResourceClaim where the real kubelet names the pod's
reference (`claim:gpu`), and now does as the real one.

Tier: real cluster (the session's control plane and 1.36 kubelet).
"""

from __future__ import annotations

import functools
import time
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

NS = "kde-dra-driver"
GPU_DRIVER = "gpu.kde.test"
"""Shaped like NVIDIA's k8s-dra-driver-gpu: `gpu-<minor>` names, a `uuid` attribute."""
PCI_DRIVER = "pci.kde.test"
"""Names devices by PCI address, identity in `resource.kubernetes.io/pciBusID` only."""
GPUS = tuple(f"GPU-9a1d0e55-3c2b-4f6a-8e7d-{i:012x}" for i in range(3))
MIG_PARENT = "GPU-9a1d0e55-3c2b-4f6a-8e7d-0000000000ff"
MIGS = ("MIG-9a1d0e55-3c2b-4f6a-8e7d-000000000101",)
BUS = {uuid: f"0000:{0x10 + i:02x}:00.0" for i, uuid in enumerate(GPUS)}
"""The stand-in's PCI bus IDs (tests/realnode/nvml.py: 0000:10:00.0 onwards)."""


def _gpu(index: int, uuid: str, **extra: Any) -> dict[str, Any]:
    """A device as NVIDIA's driver publishes a whole GPU (deviceinfo.go `GpuInfo.GetDevice`)."""
    return {"name": f"gpu-{index}",
            "attributes": {"type": {"string": "gpu"}, "uuid": {"string": uuid},
                           "index": {"int": index}, "minor": {"int": index},
                           "productName": {"string": "NVIDIA H100 80GB HBM3"},
                           "architecture": {"string": "Hopper"},
                           "cudaComputeCapability": {"version": "9.0.0"},
                           "driverVersion": {"version": "580.95.5"},
                           "pcieBusID": {"string": BUS[uuid]}},
            **extra}  # fmt: skip


SHARED = {"allowMultipleAllocations": True,
          "capacity": {"memory": {"value": "80Gi",
                                  "requestPolicy": {"default": "20Gi",
                                                    "validRange": {"min": "1Gi"}}}}}  # fmt: skip
SHARE = {"requests": {"memory": "20Gi"}}
PCI_DEVICE = {"name": "0000-12-00-0",
              "attributes": {"resource.kubernetes.io/pciBusID": {"string": BUS[GPUS[2]]}}}  # fmt: skip


@dataclass
class Dra:
    admin: Api
    node: ClusterNode
    gpu: DraDriver
    pci: DraDriver
    kubeconfig: Path
    nvml: StandInNvml
    tmp: Path


def _objects() -> list[dict[str, Any]]:
    """Device classes (CEL on the driver and the `index` attribute) and one claim template
    each: a whole GPU, the shared GPU (20Gi of its memory), the PCI driver's device."""

    def klass(name: str, cel: str) -> dict[str, Any]:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": cel}}]}}  # fmt: skip

    def template(name: str, exactly: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": name, "namespace": NS},
                "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}}  # fmt: skip

    attr = f'device.attributes["{GPU_DRIVER}"].index'
    return [
        klass("kde-whole", f'device.driver == "{GPU_DRIVER}" && {attr} == 0'),
        klass("kde-shared", f'device.driver == "{GPU_DRIVER}" && {attr} == 1'),
        klass("kde-pci", f'device.driver == "{PCI_DRIVER}"'),
        template("whole", {"deviceClassName": "kde-whole"}),
        template("shared", {"deviceClassName": "kde-shared", "capacity": SHARE}),
        template("pci", {"deviceClassName": "kde-pci"}),
    ]


@pytest.fixture(scope="module")
def dra(control_plane: ControlPlane, cluster_node: ClusterNode,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dra]:  # fmt: skip
    admin = control_plane.admin()
    tmp = tmp_path_factory.mktemp("dra-driver")
    namespace(admin, NS)
    root = cluster_node.kubelet.root_dir
    gpu = DraDriver(GPU_DRIVER, cluster_node.name, root, admin,
                    [_gpu(0, GPUS[0]), _gpu(1, GPUS[1], **SHARED)]).start()  # fmt: skip
    pci = DraDriver(PCI_DRIVER, cluster_node.name, root, admin, [PCI_DEVICE]).start()
    objects = _objects()
    nvml = StandInNvml(tmp, GPUS, MIG_PARENT, MIGS)
    try:
        for driver in (gpu, pci):
            wait_for(f"{driver.name} registered", functools.partial(_registered, driver), 30,
                     interval=0.1)  # fmt: skip
            driver.publish()
        for obj in objects:
            admin.apply(obj)
        token = rbac.install_kit(admin, dra=True)
        kubeconfig = control_plane.token_kubeconfig(tmp / "exporter.kubeconfig", token)
        yield Dra(admin, cluster_node, gpu, pci, kubeconfig, nvml, tmp)
    finally:
        admin.request("DELETE", f"/api/v1/namespaces/{NS}")
        wait_for("the DRA pods unprepared", lambda: _gone(admin), 60, interval=0.5)
        for driver in (gpu, pci):
            admin.delete(driver.slice())
            driver.stop()
        for obj in objects:
            if obj["kind"] == "DeviceClass":
                admin.delete(obj)
        nvml.close()


def _registered(driver: DraDriver, times: int = 1) -> bool:
    """The kubelet called GetInfo, then NotifyRegistrationStatus with success, `times` times."""
    return driver.registered == [(True, "")] * times


def _gone(admin: Api) -> bool:
    try:
        admin.get(f"/api/v1/namespaces/{NS}")
    except ApiStatus as exc:
        return exc.code == 404
    return False


def _pod(name: str, template: str) -> dict[str, Any]:
    spec = pod_spec(devices=0)
    spec["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": spec}  # fmt: skip


def _running(admin: Api, name: str) -> dict[str, Any]:
    path = f"/api/v1/namespaces/{NS}/pods/{name}"
    wait_for(f"pod {name} Running", lambda: admin.get(path)["status"].get("phase") == "Running",
             90, interval=0.25)  # fmt: skip
    pod: dict[str, Any] = admin.get(path)
    return pod


def _claims(socket: Path) -> dict[str, list[v1.DynamicResource]]:
    """Pod name -> the DRA claims of its container `c`, from the kubelet's List."""
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        pods = v1_grpc.PodResourcesListerStub(channel).List(
            v1.ListPodResourcesRequest(), timeout=5).pod_resources  # fmt: skip
    return {p.name: list(c.dynamic_resources) for p in pods if p.namespace == NS
            for c in p.containers if c.name == "c"}  # fmt: skip


def _by_pod(metrics: Metrics) -> dict[str, str]:
    return {dict(s)["k8s_pod_name"]: dict(s).get("hw_id", "")
            for s in metrics.series("hw_allocation_info")
            if dict(s).get("k8s_namespace_name") == NS}  # fmt: skip


def _health(metrics: Metrics) -> dict[str, tuple[str, str, str]]:
    """Pod -> (claim, hw_id, health) of hw_dra_allocation_health in our namespace."""
    return {dict(s)["k8s_pod_name"]: (dict(s)["hw_allocation_claim"], dict(s)["hw_id"],
                                      dict(s)["hw_dra_health"])
            for s in metrics.series("hw_dra_allocation_health")
            if dict(s).get("k8s_namespace_name") == NS}  # fmt: skip


def test_claims_prepared_by_our_driver_are_joined_to_nvml(dra: Dra) -> None:
    admin = dra.admin
    pods = {"trainer": "whole", "transcoder": "pci", "infer-a": "shared", "infer-b": "shared"}
    for name, template in pods.items():
        admin.apply(_pod(name, template))
    claim = {}
    for name in pods:
        pod = _running(admin, name)
        (status,) = pod["status"]["resourceClaimStatuses"]
        claim[name] = status["resourceClaimName"]
        # The real scheduler allocated it; our driver prepared exactly that.
        obj = admin.get(f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/{claim[name]}")
        (result,) = obj["status"]["allocation"]["devices"]["results"]
        assert result["pool"] == dra.node.name
    shares = {}
    for name in ("infer-a", "infer-b"):
        obj = admin.get(f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/{claim[name]}")
        (result,) = obj["status"]["allocation"]["devices"]["results"]
        assert (result["device"], result["consumedCapacity"]) == ("gpu-1", {"memory": "20Gi"})
        shares[name] = result["shareID"]
    assert len(set(shares.values())) == 2

    # PodResources v1 List: the claim as the driver's prepare answer names it.
    got = _claims(dra.node.socket)
    want = {"trainer": (GPU_DRIVER, "gpu-0", None), "transcoder": (PCI_DRIVER, "0000-12-00-0", None),
            "infer-a": (GPU_DRIVER, "gpu-1", shares["infer-a"]),
            "infer-b": (GPU_DRIVER, "gpu-1", shares["infer-b"])}  # fmt: skip
    for name, (driver, device, share) in want.items():
        (dyn,) = got[name]
        assert (dyn.claim_name, dyn.claim_namespace) == (claim[name], NS)
        (res,) = dyn.claim_resources
        assert (res.driver_name, res.pool_name, res.device_name) == (driver, dra.node.name, device)
        assert list(res.cdi_devices) == []
        assert (res.share_id if res.HasField("share_id") else None) == share
    # Get answers the same for one pod.
    with grpc.insecure_channel(f"unix://{dra.node.socket}") as channel:
        one = v1_grpc.PodResourcesListerStub(channel).Get(
            v1.GetPodResourcesRequest(pod_name="infer-a", pod_namespace=NS), timeout=5)  # fmt: skip
    (container,) = one.pod_resources.containers
    assert list(container.dynamic_resources) == got["infer-a"]

    with on_node(dra.tmp, dra.node.socket, dra.node.name, dra.kubeconfig,
                 "--kubernetes.dra", env=dra.nvml.env()) as metrics:  # fmt: skip
        expected = {"trainer": GPUS[0], "transcoder": GPUS[2],
                    "infer-a": GPUS[1], "infer-b": GPUS[1]}  # fmt: skip
        metrics.wait("every claim joined to NVML", lambda m: _by_pod(m) == expected, 60)
        info = {dict(s)["hw_allocation_device_id"]: dict(s)["hw_id"]
                for s in metrics.series("hw_dra_device_info")}  # fmt: skip
        assert info == {"gpu-0": GPUS[0], "gpu-1": GPUS[1], "0000-12-00-0": GPUS[2]}
        assert metrics.value("kube_device_exporter_dra_unidentified") == 0

        # Health (dra-health v1alpha1): the kubelet writes it into the pod's status
        # (control-plane.md DRA 5), the exporter's pod watch reads it there.
        dra.gpu.set_health("gpu-0", "Unhealthy", "XID 79")
        want_status = [{"name": "claim:gpu",
                        "resources": [{"health": "Unhealthy", "message": "XID 79",
                                       "resourceID": f"{GPU_DRIVER}/{dra.node.name}/gpu-0"}]}]  # fmt: skip
        path = f"/api/v1/namespaces/{NS}/pods/trainer"
        wait_for("the pod's allocatedResourcesStatus Unhealthy",
                 lambda: admin.get(path)["status"]["containerStatuses"][0].get(
                     "allocatedResourcesStatus") == want_status, 30, interval=0.25)  # fmt: skip
        # The status names the pod's claim reference (`claim:gpu`), PodResources the
        # ResourceClaim made from the template (`trainer-gpu-xxxxx`): the exporter names
        # both series by the ResourceClaim, through the pod's resourceClaimStatuses.
        metrics.wait("the claim's health", lambda m: _health(m).get("trainer") == (
            claim["trainer"], GPUS[0], "Unhealthy"), 30)  # fmt: skip
        assert _health(metrics) == {
            "trainer": (claim["trainer"], GPUS[0], "Unhealthy"),
            "transcoder": (claim["transcoder"], GPUS[2], "Healthy"),
            "infer-a": (claim["infer-a"], GPUS[1], "Healthy"),
            "infer-b": (claim["infer-b"], GPUS[1], "Healthy"),
        }
        # hw_allocation_info names the same claim, namespace-qualified.
        claims = {dict(s)["k8s_pod_name"]: dict(s)["hw_allocation_claim"]
                  for s in metrics.series("hw_allocation_info")
                  if dict(s).get("k8s_namespace_name") == NS}  # fmt: skip
        assert claims == {pod: f"{NS}/{name}" for pod, name in claim.items()}


def _claim_of(admin: Api, pod: dict[str, Any]) -> dict[str, Any]:
    (status,) = pod["status"]["resourceClaimStatuses"]
    path = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/{status['resourceClaimName']}"
    claim: dict[str, Any] = admin.get(path)
    return claim


def _evicted(admin: Api, name: str) -> bool:
    try:
        pod = admin.get(f"/api/v1/namespaces/{NS}/pods/{name}")
    except ApiStatus as exc:
        return exc.code == 404
    return bool(pod["metadata"].get("deletionTimestamp"))


def test_a_no_execute_taint_in_the_slice_evicts_the_pod_and_unprepares_its_claim(
    dra: Dra,
) -> None:
    """control-plane.md DRA 8: NoExecute on a device in use evicts its pod (~1 s), and the
    kubelet unprepares the claim through the driver; the exporter shows the taint on the
    device joined to NVML."""
    admin = dra.admin
    admin.delete(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "trainer", "namespace": NS}}
    )
    admin.apply(_pod("victim", "whole"))
    claim = _claim_of(admin, _running(admin, "victim"))
    with on_node(dra.tmp, dra.node.socket, dra.node.name, dra.kubeconfig,
                 "--kubernetes.dra", env=dra.nvml.env()) as metrics:  # fmt: skip
        metrics.wait("the victim joined", lambda m: _by_pod(m).get("victim") == GPUS[0], 60)
        tainted = dra.gpu.slice()
        tainted["spec"]["devices"][0] = {**tainted["spec"]["devices"][0], "taints": [
            {"key": "kde.test/unhealthy", "value": "xid-79", "effect": "NoExecute"}]}  # fmt: skip
        admin.apply(tainted, manager=dra.gpu.name)
        began = time.monotonic()
        wait_for("the victim evicted", lambda: _evicted(admin, "victim"), 30, interval=0.1)
        evicted = time.monotonic() - began
        wait_for("its claim unprepared", lambda: claim["metadata"]["uid"] in dra.gpu.unprepared,
                 30, interval=0.1)  # fmt: skip
        metrics.wait("the taint on GPU 0", lambda m: {
            (dict(s)["hw_id"], dict(s)["hw_dra_taint_effect"], dict(s)["hw_dra_taint_source"])
            for s in m.series("hw_dra_device_taint")} == {(GPUS[0], "NoExecute", "slice")}, 30)  # fmt: skip
        events = admin.get(f"/api/v1/namespaces/{NS}/events")["items"]
        reasons = {e["reason"] for e in events if e["involvedObject"].get("name") == "victim"}
        assert "DeviceTaintManagerEviction" in reasons, reasons
        print(f"NoExecute taint to eviction: {evicted:.2f} s")
    dra.gpu.publish()  # untainted again


def _slices(admin: Api, node: str) -> set[str]:
    """The drivers with a ResourceSlice of `node`."""
    items = admin.get("/apis/resource.k8s.io/v1/resourceslices",
                      fieldSelector=f"spec.nodeName={node}")["items"]  # fmt: skip
    return {s["spec"]["driver"] for s in items}


def _health_of(admin: Api, name: str) -> list[str]:
    pod = admin.get(f"/api/v1/namespaces/{NS}/pods/{name}")
    statuses = pod["status"].get("containerStatuses") or [{}]
    return [r["health"] for e in statuses[0].get("allocatedResourcesStatus") or ()
            for r in e["resources"]]  # fmt: skip


def test_kubelet_restart_wipes_the_slices_and_a_driver_gone_loses_them(dra: Dra) -> None:
    """control-plane.md DRA 6 and 7: a restarted kubelet deletes every slice of its node at
    start and lists the prepared claims at once from its checkpoint (no new prepare); a
    driver gone turns its claims' health Unknown, and its slices are deleted after a while.
    The exporter meanwhile loses the slices' identity and says so, and joins again once the
    driver publishes."""
    admin, node = dra.admin, dra.node
    admin.apply(_pod("survivor", "shared"))
    _running(admin, "survivor")
    before = _claims(node.socket)["survivor"]
    prepared = len(dra.gpu.prepared)
    with on_node(dra.tmp, node.socket, node.name, dra.kubeconfig,
                 "--kubernetes.dra", env=dra.nvml.env()) as metrics:  # fmt: skip
        metrics.wait("the survivor joined", lambda m: _by_pod(m).get("survivor") == GPUS[1], 60)
        node.kubelet.stop()
        node.kubelet.start()
        began = time.monotonic()
        wait_for("the slices wiped", lambda: not _slices(admin, node.name), 30, interval=0.1)
        wiped = time.monotonic() - began
        # The drivers' registration sockets are still there: the new kubelet registers them.
        for driver in (dra.gpu, dra.pci):
            wait_for(f"{driver.name} registered again", functools.partial(_registered, driver, 2),
                     30, interval=0.1)  # fmt: skip
        wait_for("List back", lambda: _claims(node.socket).get("survivor") == before, 30)
        assert len(dra.gpu.prepared) == prepared  # from the checkpoint: no new prepare
        metrics.wait("the survivor unjoined", lambda m: _by_pod(m).get("survivor") == "", 30)
        assert (metrics.value("kube_device_exporter_dra_unidentified") or 0) >= 1
        dra.gpu.publish()
        dra.pci.publish()
        metrics.wait("joined again", lambda m: _by_pod(m).get("survivor") == GPUS[1], 30)

        # The driver gone: health Unknown soon, its slice deleted by the kubelet later.
        dra.gpu.stop()
        began = time.monotonic()
        wait_for("health Unknown", lambda: _health_of(admin, "survivor") == ["Unknown"], 30,
                 interval=0.2)  # fmt: skip
        unknown = time.monotonic() - began
        wait_for("the driver's slice deleted",
                 lambda: _slices(admin, node.name) == {PCI_DRIVER}, 60, interval=0.2)  # fmt: skip
        deleted = time.monotonic() - began
        assert _claims(node.socket)["survivor"] == before  # List unchanged (checkpoint)
        metrics.wait("the survivor unjoined again", lambda m: _by_pod(m).get("survivor") == "", 30)
    dra.gpu.start()
    wait_for("registered after its return", functools.partial(_registered, dra.gpu, 3), 30,
             interval=0.1)  # fmt: skip
    dra.gpu.publish()
    print(
        f"slices wiped {wiped:.2f} s after the kubelet's start; driver gone: health "
        f"Unknown after {unknown:.2f} s, slice deleted after {deleted:.2f} s"
    )


def test_a_claim_not_prepared_yet_is_listed_without_devices(dra: Dra) -> None:
    """control-plane.md DRA 4: while prepare fails, List already shows the container with
    the claim's name and no `claim_resources`; the exporter names no device for it; once
    prepare succeeds the pod runs and the claim gets its device."""
    admin, node = dra.admin, dra.node
    dra.pci.fail = "device busy (test)"
    admin.delete(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "transcoder", "namespace": NS}}
    )
    wait_for(
        "the transcoder gone", lambda: "transcoder" not in _claims(node.socket), 60, interval=0.2
    )
    try:
        admin.apply(_pod("pending", "pci"))
        seen: list[int] = []  # how many claims List gave the container, each time it changed

        def claim_listed() -> bool:
            got = _claims(node.socket).get("pending")
            if got is not None and (not seen or seen[-1] != len(got)):
                seen.append(len(got))
            return bool(got)

        # The pod is listed first with its container and no claim at all (seen here), then,
        # once the kubelet has tried to prepare it, with the claim and no devices.
        wait_for("the pending claim listed", claim_listed, 60, interval=0.05)
        print(f"claims listed for the pending pod, as they changed: {seen}")
        (dyn,) = _claims(node.socket)["pending"]
        assert (dyn.claim_name.startswith("pending-gpu-"), dyn.claim_namespace) == (True, NS)
        assert list(dyn.claim_resources) == []
        pod = admin.get(f"/api/v1/namespaces/{NS}/pods/pending")
        assert pod["status"]["phase"] == "Pending"
        with on_node(dra.tmp, node.socket, node.name, dra.kubeconfig,
                     "--kubernetes.dra", env=dra.nvml.env()) as metrics:  # fmt: skip
            metrics.wait("the PCI slice read", lambda m: m.value(
                "hw_dra_device_info", hw_allocation_device_id="0000-12-00-0") == 1, 60)  # fmt: skip
            cycles = metrics.value("kube_device_exporter_cycles_total") or 0.0
            metrics.wait("two more cycles",
                         lambda m: (m.value("kube_device_exporter_cycles_total") or 0) >= cycles + 2)  # fmt: skip
            assert "pending" not in _by_pod(metrics)
            dra.pci.fail = ""
            _running(admin, "pending")
            metrics.wait("the claim joined once prepared",
                         lambda m: _by_pod(m).get("pending") == GPUS[2], 60)  # fmt: skip
    finally:
        dra.pci.fail = ""
