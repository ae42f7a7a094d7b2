"""DRA's sharing models on the real 1.36 cluster (control-plane.md facts 12-15), end to end.

Two DRA drivers of the tests' own (tests/realcluster/dradriver.py) on the real kubelet, each
publishing what a real driver publishes:

- `nv.kde.test`, shaped like kubernetes-sigs/dra-driver-nvidia-gpu with partitionable devices
  (tests/realcluster/partitions.py): GPU 1 as a counter set in a slice of its own, its whole
  device and its 1g.10gb and 3g.40gb placements; at prepare the driver makes the MIG device
  of a placement in the NVML stand-in (no slice knows its UUID), and destroys it at
  unprepare. GPU 0 shared by capacity (`allowMultipleAllocations`, a memory request policy).
- `dra.net`, shaped like DRANET: a NIC with `dra.net/pciAddress` and `dra.net/ifName`; after
  prepare it writes the claim's `status.devices` (conditions, `networkData`).

The real scheduler allocates; the exporter (`--kubernetes.api --kubernetes.dra`, the kit's DRA
token, the NVML stand-in, a sysfs with the NIC and the GPUs' PCIe switch) runs once for the
module. Proven: each share as its claim's `consumedCapacity` and what is left equal to what
the scheduler still gives (a third claim that fits exactly runs, a fourth stays Pending);
the MIG device made at prepare joined to its pod and to its own series; the pool's free
count per profile equal to what the scheduler then allocates and refuses; an extended-
resource pod's containers each holding their own partition only; the kit's admin-access
component's claim allocated and prepared for every GPU of the node and its pod never a
holder; the NIC's interface, conditions, counters and PCIe placement; a DeviceTaintRule's
taint (the session's plane serves them: tests/realcluster/controlplane.py). What the
cluster did is in docs/dra.md ("DRA's sharing models on the real cluster").

Tier: real cluster (the session's control plane and 1.36 kubelet).
"""

from __future__ import annotations

import functools
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import kustomize
from tests.realcluster import partitions, rbac
from tests.realcluster.api import Api, ApiStatus, namespace
from tests.realcluster.controlplane import ControlPlane
from tests.realcluster.daemons import wait_for
from tests.realcluster.dradriver import DraDriver
from tests.realcluster.exporter import Metrics, on_node
from tests.realcluster.image import DEPLOY
from tests.realcluster.node import ClusterNode, pod_spec
from tests.realnode.images import BUSYBOX_IMAGE
from tests.realnode.nvml import StandInNvml
from tests.sysfs_support import make_tree

pytestmark = pytest.mark.peer

NS = "kde-dra-share"
KIT_NS = "kde-admin-kit"
GPU_DRIVER = "nv.kde.test"
NIC_DRIVER = "dra.net"
SHARED = "GPU-7c1e0b42-3d5a-4f6e-8b9c-000000000000"
"""GPU 0: shared by capacity (stand-in bus 0000:10:00.0, minor 0)."""
PARTED = "GPU-7c1e0b42-3d5a-4f6e-8b9c-0000000000ff"
"""GPU 1: partitioned at prepare (stand-in bus 0000:11:00.0, minor 1, MIG mode on)."""
NIC = "0000:12:00.1"
"""A VF of the PF at 0000:12:00.0: what DRANET hands a pod of an SR-IOV NIC."""
NIC_NAME = "kde-nic0"
GIB = 2**30
EXTENDED = "example.com/mig-1g"
RULE = "kde-maintenance"
OPT_IN = "kube-device-exporter.io/enabled"
SYSFS = f"""
node: fixture
sysfs:
  pci_tree:
    - host_bridge: "0000:00"
      numa: 0
      root_ports:
        - port: "0000:00:01.0"
          switch: "0000:0d:00.0"
          ports:
            - port: "0000:0e:00.0"
              devices: [{{pci: "0000:10:00.0", vendor: "0x10de", device_id: "0x2330", driver: nvidia}}]
            - port: "0000:0e:01.0"
              devices: [{{pci: "0000:11:00.0", vendor: "0x10de", device_id: "0x2330", driver: nvidia}}]
            - port: "0000:0e:02.0"
              devices: ["0000:12:00.0", "{NIC}"]
  sriov:
    - {{pf: kde-pf0, pci: "0000:12:00.0", vfs: [{{pci: "{NIC}", ifname: {NIC_NAME}, rx_gbps: 10, tx_gbps: 9}}]}}
"""
"""Both GPUs and the NIC (a VF of an SR-IOV PF, its netdev still in the host's namespace)
below one PCIe switch (PIX), as the stand-in numbers the GPUs."""


def _attrs(minor: int, uuid: str, bus: str) -> dict[str, Any]:
    """NVIDIA's whole-GPU attributes (deviceinfo.go `GpuInfo`)."""
    return {"type": {"string": "gpu"}, "uuid": {"string": uuid}, "index": {"int": minor},
            "minor": {"int": minor}, "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "architecture": {"string": "Hopper"}, "driverVersion": {"version": "580.95.5"},
            "pcieBusID": {"string": bus}}  # fmt: skip


def _gpu_devices() -> list[dict[str, Any]]:
    shared = {"name": "gpu-0", "attributes": _attrs(0, SHARED, "0000:10:00.0"),
              "allowMultipleAllocations": True,
              "capacity": {"memory": {"value": "80Gi", "requestPolicy": {
                  "default": "10Gi", "validRange": {"min": "10Gi", "step": "10Gi"}}}}}  # fmt: skip
    return [shared, *partitions.devices(1, PARTED, _attrs(1, PARTED, "0000:11:00.0"))]


NIC_DEVICE_NAME = "pci-0000-12-00-1"
NIC_DEVICE: dict[str, Any] = {"name": NIC_DEVICE_NAME,
              "attributes": {"dra.net/pciAddress": {"string": NIC},
                             "dra.net/ifName": {"string": NIC_NAME},
                             "dra.net/mac": {"string": "0c:42:a1:00:00:12"},
                             "dra.net/type": {"string": "device"},
                             "dra.net/rdma": {"bool": False}}}  # fmt: skip
"""As DRANET's inventory publishes a PCI NIC (pkg/inventory/db.go, pkg/apis/attributes.go)."""


def _cel(*terms: str) -> str:
    return " && ".join(terms)


GPU_IS = f'device.driver == "{GPU_DRIVER}"'
ATTR = f'device.attributes["{GPU_DRIVER}"]'


def _classes() -> list[dict[str, Any]]:
    def klass(name: str, cel: str, **spec: Any) -> dict[str, Any]:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": cel}}], **spec}}  # fmt: skip

    mig = (GPU_IS, f'{ATTR}.type == "mig"')
    return [
        klass("kde-share", _cel(GPU_IS, f'{ATTR}.type == "gpu"', f"{ATTR}.minor == 0")),
        klass("kde-mig-1g", _cel(*mig, f'{ATTR}.profile == "1g.10gb"')),
        klass("kde-mig-3g", _cel(*mig, f'{ATTR}.profile == "3g.40gb"')),
        klass(
            "kde-mig-1g-ext",
            _cel(*mig, f'{ATTR}.profile == "1g.10gb"'),
            extendedResourceName=EXTENDED,
        ),
        klass("kde-nic", f'device.driver == "{NIC_DRIVER}"'),
        # The class components/dra-admin-access names: NVIDIA's, here selecting our GPUs.
        klass("gpu.nvidia.com", _cel(GPU_IS, f'{ATTR}.type == "gpu"')),
    ]


def _template(name: str, klass: str, **exactly: Any) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "dev", "exactly": {"deviceClassName": klass, **exactly}}]}}}}  # fmt: skip


def _templates() -> list[dict[str, Any]]:
    share = {f"share-{n}": {"capacity": {"requests": {"memory": f"{n}Gi"}}} for n in (10, 20, 30)}
    return [*(_template(name, "kde-share", **extra) for name, extra in share.items()),
            _template("mig-1g", "kde-mig-1g"), _template("mig-3g", "kde-mig-3g"),
            _template("nic", "kde-nic")]  # fmt: skip


def _rule() -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule",
            "metadata": {"name": RULE},
            "spec": {"deviceSelector": {"driver": GPU_DRIVER, "device": "gpu-0"},
                     "taint": {"key": "example.com/maintenance", "value": "planned",
                               "effect": "None"}}}  # fmt: skip


def _pod(name: str, *claims: str, containers: int = 1) -> dict[str, Any]:
    """Containers c (and d) holding the claims made from `claims` (templates)."""
    spec = pod_spec(devices=0)
    spec["containers"] = [dict(spec["containers"][0], name=n) for n in ("c", "d")[:containers]]
    if claims:
        spec["containers"][0]["resources"] = {"claims": [{"name": t} for t in claims]}
        spec["resourceClaims"] = [{"name": t, "resourceClaimTemplateName": t} for t in claims]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": spec}  # fmt: skip


def _ext_pod() -> dict[str, Any]:
    pod = _pod("ext", containers=2)
    for c in pod["spec"]["containers"]:
        c["resources"] = {"limits": {EXTENDED: "1"}}
    return pod


@dataclass
class Migs:
    """The GPU driver's MIG devices in the stand-in: made at prepare, gone at unprepare."""

    nvml: StandInNvml
    made: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Claim UID -> the stand-in's `mig:` entries made for it."""
    serial: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    at: dict[str, float] = field(default_factory=dict)
    """MIG UUID -> when it was made (monotonic)."""

    def prepare(self, claim: dict[str, Any], devices: list[Any]) -> None:
        uid = claim["metadata"]["uid"]
        with self.lock:
            if uid in self.made:
                return  # prepared again (the kubelet retries): the same slices
            made = []
            for d in devices:
                self.serial += 1
                mig = partitions.mig_of(d.device_name, self.serial)
                if mig is not None:
                    made.append(mig)
                    self.at[mig["uuid"]] = time.monotonic()
            self.made[uid] = made
            self._show()

    def unprepare(self, uid: str) -> None:
        with self.lock:
            if self.made.pop(uid, None):
                self._show()

    def _show(self) -> None:
        self.nvml.set_migs([m for ms in self.made.values() for m in ms])

    def of(self, claim_uid: str) -> list[str]:
        return [m["uuid"] for m in self.made.get(claim_uid, [])]


@dataclass
class Share:
    admin: Api
    node: ClusterNode
    gpu: DraDriver
    nic: DraDriver
    migs: Migs
    metrics: Metrics
    began: float


def _nic_status(driver: DraDriver, claim: dict[str, Any], devices: list[Any]) -> None:
    """What DRANET writes once the NIC is in the pod (nri_hooks.go `RunPodSandbox`)."""
    driver.write_status(claim, [{
        "driver": NIC_DRIVER, "pool": d.pool_name, "device": d.device_name,
        "conditions": [{"type": "Ready", "status": "True", "reason": "NetworkDeviceReady",
                        "message": "", "lastTransitionTime": "2026-11-28T00:00:00Z"}],
        "networkData": {"interfaceName": "eth1", "hardwareAddress": "0c:42:a1:00:00:12",
                        "ips": ["192.0.2.10/24"]},
    } for d in devices])  # fmt: skip


@pytest.fixture(scope="module")
def share(control_plane: ControlPlane, cluster_node: ClusterNode,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Share]:  # fmt: skip
    began = time.monotonic()
    admin = control_plane.admin()
    tmp = tmp_path_factory.mktemp("dra-sharing")
    namespace(admin, NS)
    root = cluster_node.kubelet.root_dir
    nvml = StandInNvml(tmp, (SHARED,), PARTED, ())
    migs = Migs(nvml)
    gpu = DraDriver(GPU_DRIVER, cluster_node.name, root, admin, _gpu_devices(),
                    counters=partitions.shared_counters(1))  # fmt: skip
    gpu.on_prepare, gpu.on_unprepare = migs.prepare, migs.unprepare
    nic = DraDriver(NIC_DRIVER, cluster_node.name, root, admin, [NIC_DEVICE])
    nic.on_prepare = functools.partial(_nic_status, nic)
    objects = [*_classes(), *_templates()]
    sysfs = make_tree(tmp / "node", SYSFS)
    try:
        for driver in (gpu, nic):
            driver.start()
            wait_for(f"{driver.name} registered", functools.partial(_registered, driver), 30,
                     interval=0.1)  # fmt: skip
            driver.publish()
        for obj in [*objects, _rule()]:
            admin.apply(obj)
        for pod in (_pod("share-a", "share-20"), _pod("share-b", "share-30")):
            admin.apply(pod)
        for name in ("share-a", "share-b"):
            _running(admin, name)
        token = rbac.install_kit(admin, dra=True)
        kubeconfig = control_plane.token_kubeconfig(tmp / "exporter.kubeconfig", token)
        with on_node(tmp, cluster_node.socket, cluster_node.name, kubeconfig, "--kubernetes.dra",
                     env=nvml.env(), sysfs=sysfs.root) as metrics:  # fmt: skip
            yield Share(admin, cluster_node, gpu, nic, migs, metrics, began)
    finally:
        admin.delete(_rule())
        admin.request("DELETE", f"/api/v1/namespaces/{NS}")
        wait_for("the pods unprepared", functools.partial(_gone, admin, NS), 90, interval=0.5)
        for driver in (gpu, nic):
            for s in driver.slices():
                admin.delete(s)
            driver.stop()
        for obj in objects:
            if obj["kind"] == "DeviceClass":
                admin.delete(obj)
        nvml.close()


def _registered(driver: DraDriver) -> bool:
    return driver.registered == [(True, "")]


def _gone(admin: Api, name: str) -> bool:
    try:
        admin.get(f"/api/v1/namespaces/{name}")
    except ApiStatus as exc:
        return exc.code == 404
    return False


def _pod_of(admin: Api, name: str, ns: str = NS) -> dict[str, Any]:
    pod: dict[str, Any] = admin.get(f"/api/v1/namespaces/{ns}/pods/{name}")
    return pod


def _running(admin: Api, name: str, ns: str = NS) -> dict[str, Any]:
    wait_for(f"pod {name} Running",
             lambda: _pod_of(admin, name, ns)["status"].get("phase") == "Running", 90,
             interval=0.25)  # fmt: skip
    return _pod_of(admin, name, ns)


def _unschedulable(admin: Api, name: str, ns: str = NS) -> str:
    """The scheduler's message once it has given up on `name` for now ("" before)."""
    for c in _pod_of(admin, name, ns)["status"].get("conditions") or ():
        if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable":
            return str(c.get("message", ""))
    return ""


def _claims_of(admin: Api, pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The pod's claim references -> its ResourceClaims."""
    ns = pod["metadata"]["namespace"]
    out = {}
    for status in pod["status"].get("resourceClaimStatuses") or ():
        path = (
            f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{status['resourceClaimName']}"
        )
        out[status["name"]] = admin.get(path)
    ext = pod["status"].get("extendedResourceClaimStatus")
    if ext:
        path = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{ext['resourceClaimName']}"
        out["extended"] = admin.get(path)
    return out


def _results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    return list(claim["status"]["allocation"]["devices"]["results"])


def _labels(
    metrics: Metrics, family: str, *names: str, **match: str
) -> dict[tuple[str, ...], float]:
    """Series of `family` whose labels include `match`, keyed by the values of `names`."""
    return {tuple(dict(s).get(n, "") for n in names): v
            for s, v in metrics.series(family).items()
            if set(match.items()) <= s}  # fmt: skip


def _admin_kit(node: ClusterNode) -> list[dict[str, Any]]:
    """deploy/base + host-network, kubernetes-api, dra and dra-admin-access as kustomize renders
    them into a namespace of their own; of them the Namespace, ServiceAccount, claim template
    and DaemonSet (the cluster-wide RBAC is the kit's, installed by rbac.install_kit), the
    DaemonSet running busybox in place of the exporter's image (built by
    test_real_cluster_image.py, minutes) without its probes, its PodResources mount at this
    node's kubelet root."""
    with tempfile.TemporaryDirectory(prefix="kde-admin-kit-") as tmp:
        mine = Path(tmp)
        parts = ["host-network", "kubernetes-api", "dra", "dra-admin-access"]
        doc = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
               "namespace": KIT_NS, "resources": [os.path.relpath(DEPLOY / "base", mine)],
               "components": [os.path.relpath(DEPLOY / "components" / c, mine) for c in parts]}  # fmt: skip
        (mine / "kustomization.yaml").write_text(yaml.safe_dump(doc))
        objects = [o for o in kustomize.build(mine)
                   if o["kind"] in ("Namespace", "ServiceAccount", "ResourceClaimTemplate",
                                    "DaemonSet")]  # fmt: skip
    ds = next(o for o in objects if o["kind"] == "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        container.pop(probe)
    container |= {"image": BUSYBOX_IMAGE, "imagePullPolicy": "Never", "command": ["sleep", "3600"]}
    (volume,) = [v for v in spec["volumes"] if v["name"] == "pod-resources"]
    volume["hostPath"]["path"] = str(node.kubelet.root_dir / "pod-resources")
    spec["terminationGracePeriodSeconds"] = 1
    return objects


def _label_node(admin: Api, node: str, value: str | None) -> None:
    admin.request("PATCH", f"/api/v1/nodes/{node}", {"metadata": {"labels": {OPT_IN: value}}},
                  content_type="application/merge-patch+json")  # fmt: skip


def test_the_kits_admin_access_claim_gets_every_gpu_and_is_no_holder(share: Share) -> None:
    """Fact 14 and components/dra-admin-access: the DaemonSet's claim (adminAccess,
    allocationMode All, class gpu.nvidia.com) is allocated every GPU of the node although
    workloads hold them, the driver prepares it, PodResources lists it like any claim, and
    the exporter lists its pod as no holder. Run first: with a partition of GPU 1 held, or
    GPU 0's capacity used up, the claim cannot be allocated (docs/dra.md)."""
    admin, metrics, node = share.admin, share.metrics, share.node
    objects = _admin_kit(node)
    _label_node(admin, node.name, "true")
    try:
        for obj in objects:
            admin.apply(obj)
        pods = f"/api/v1/namespaces/{KIT_NS}/pods"
        wait_for("the DaemonSet's pod", lambda: bool(admin.get(pods)["items"]), 30, interval=0.25)
        name = admin.get(pods)["items"][0]["metadata"]["name"]
        wait_for("its pod Running or refused", lambda: _pod_of(admin, name, KIT_NS)["status"].get(
            "phase") == "Running" or bool(_unschedulable(admin, name, KIT_NS)), 60, interval=0.25)  # fmt: skip
        pod = _pod_of(admin, name, KIT_NS)
        assert pod["status"]["phase"] == "Running", _unschedulable(admin, name, KIT_NS)
        (claim,) = _claims_of(admin, pod).values()
        results = _results(claim)
        gpus = {d["name"] for d in _gpu_devices() if d["attributes"]["type"] == {"string": "gpu"}}
        assert {r["device"] for r in results} == gpus
        assert all(r["adminAccess"] is True for r in results)
        # On the shared GPU the admin claim records a share of the policy's default.
        (on_shared,) = [r for r in results if r["device"] == "gpu-0"]
        assert on_shared["consumedCapacity"] == {"memory": "10Gi"} and on_shared["shareID"]
        uid = claim["metadata"]["uid"]
        (prepared,) = [p for p in share.gpu.prepared if p["uid"] == uid]
        assert {device for _, device, _ in prepared["devices"]} == gpus
        metrics.wait("the monitor seen, as no holder", lambda m: _labels(
            m, "hw_dra_admin_access_info", "hw_allocation_device_id", "hw_id",
            k8s_pod_name=name) == {("gpu-0", SHARED): 1.0, ("gpu-1", PARTED): 1.0}, 30)  # fmt: skip
        held = {dict(s).get("k8s_pod_name") for s in metrics.series("hw_allocation_info")}
        assert name not in held
        # gpu-0's holders are the workloads' shares only, and the admin claim's recorded
        # share (the policy's default) is not counted: the scheduler's 30Gi are still free.
        holders = _labels(metrics, "hw_allocation_info", "k8s_pod_name", hw_id=SHARED)
        assert {p for (p,) in holders} == {"share-a", "share-b"}
        free = _labels(metrics, "hw_dra_device_capacity_free", "hw_id",
                       hw_allocation_device_id="gpu-0")  # fmt: skip
        assert free == {(SHARED,): 30 * GIB}
        # A partition of the GPU the admin claim holds whole.
        admin.apply(_pod("probe", "mig-1g"))
        wait_for("the partition's answer", lambda: _pod_of(admin, "probe")["status"].get(
            "phase") == "Running" or bool(_unschedulable(admin, "probe")), 30, interval=0.25)  # fmt: skip
        # The admin claim holds no counters: the partition is allocated all the same.
        assert _pod_of(admin, "probe")["status"]["phase"] == "Running"
        admin.delete(_pod("probe"))
    finally:
        for obj in reversed(objects):
            admin.delete(obj)
        _label_node(admin, node.name, None)
        wait_for("the admin kit gone", functools.partial(_gone, admin, KIT_NS), 60, interval=0.5)


def test_capacity_shares_and_what_the_scheduler_still_gives(share: Share) -> None:
    """Fact 12: each share is its claim's consumedCapacity (bytes), the device's free memory
    what the scheduler still gives: a third claim of exactly that runs, a fourth waits."""
    admin, metrics = share.admin, share.metrics
    recorded = {}
    for name, template in (("share-a", "share-20"), ("share-b", "share-30")):
        (result,) = _results(_claims_of(admin, _pod_of(admin, name))[template])
        recorded[name] = (result["shareID"], result["consumedCapacity"]["memory"])
    assert {n: m for n, (_, m) in recorded.items()} == {"share-a": "20Gi", "share-b": "30Gi"}
    want = {(name, sid, SHARED): float(gib) * GIB
            for (name, (sid, _)), gib in zip(recorded.items(), (20, 30), strict=True)}  # fmt: skip
    metrics.wait("the two shares", lambda m: _labels(
        m, "hw_dra_allocation_capacity", "k8s_pod_name", "hw_allocation_replica", "hw_id",
        hw_dra_capacity="memory") == want, 60)  # fmt: skip
    free = _labels(metrics, "hw_dra_device_capacity_free", "hw_id", hw_allocation_device_id="gpu-0")
    assert free == {(SHARED,): 30 * GIB}
    # What is left fits a third claim of exactly 30Gi; a fourth of the smallest step does not.
    admin.apply(_pod("share-c", "share-30"))
    admin.apply(_pod("share-d", "share-10"))
    _running(admin, "share-c")
    wait_for("share-d refused", lambda: bool(_unschedulable(admin, "share-d")), 30, interval=0.25)
    print(f"share-d: {_unschedulable(admin, 'share-d')}")
    metrics.wait("nothing left", lambda m: _labels(
        m, "hw_dra_device_capacity_free", "hw_id", hw_allocation_device_id="gpu-0") == {
        (SHARED,): 0.0}, 30)  # fmt: skip
    admin.delete(_pod("share-d"))


def _allocations(metrics: Metrics, pod: str) -> dict[tuple[str, str], str]:
    """(container, device name) -> hw_id of the pod's hw_allocation_info series."""
    return {
        (dict(s)["k8s_container_name"], dict(s)["hw_allocation_device_id"]): dict(s).get(
            "hw_id", ""
        )
        for s in metrics.series("hw_allocation_info")
        if dict(s).get("k8s_pod_name") == pod and dict(s).get("k8s_namespace_name") == NS
    }


def test_a_partition_made_at_prepare_is_joined_to_its_mig_device(share: Share) -> None:
    """Fact 13: the scheduler picks a placement from the counters, the driver makes the MIG
    device when it prepares the claim (no slice knows its UUID); the exporter finds it by
    parent GPU, GI profile and placement start and joins the pod to its own series."""
    admin, metrics = share.admin, share.metrics
    admin.apply(_pod("train", "mig-1g", "nic"))
    admin.apply(_ext_pod())
    for name in ("train", "ext"):
        _running(admin, name)
    pod = _pod_of(admin, "train")
    claims = _claims_of(admin, pod)
    (result,) = _results(claims["mig-1g"])
    (mig,) = share.migs.of(claims["mig-1g"]["metadata"]["uid"])
    assert result["device"].startswith("gpu-1-mig-1g10gb-19-")
    assert "shareID" not in result and "consumedCapacity" not in result
    metrics.wait("the partition joined to the MIG device",
                 lambda m: _allocations(m, "train").get(("c", result["device"])) == mig, 60)  # fmt: skip
    seen = time.monotonic() - share.migs.at[mig]
    print(f"MIG device made at prepare -> joined by the exporter: {seen:.1f} s after")
    assert metrics.value("hw_gpu_memory_limit_bytes", hw_id=mig) == 10 * GIB * 39 // 40
    assert metrics.value("hw_gpu_memory_usage_bytes", hw_id=mig) is not None
    info = _labels(metrics, "hw_dra_device_info", "hw_allocation_device_id", "hw_id",
                   hw_allocation_resource=GPU_DRIVER)  # fmt: skip
    assert info[(result["device"], mig)] == 1
    assert metrics.value("kube_device_exporter_dra_unidentified") == 0


def test_extended_resource_containers_hold_only_their_own_partition(share: Share) -> None:
    """KEP-5004: PodResources lists the scheduler's claim, both partitions, under each
    container; the claim's results and the pod's request mappings give each its own."""
    admin, metrics = share.admin, share.metrics
    pod = _pod_of(admin, "ext")
    claim = _claims_of(admin, pod)["extended"]
    mappings = {m["requestName"]: m["containerName"]
                for m in pod["status"]["extendedResourceClaimStatus"]["requestMappings"]}  # fmt: skip
    uid = claim["metadata"]["uid"]
    by_device = dict(zip((r["device"] for r in _results(claim)), share.migs.of(uid), strict=True))
    want = {(mappings[r["request"]], r["device"]): by_device[r["device"]] for r in _results(claim)}
    assert sorted(c for c, _ in want) == ["c", "d"]
    metrics.wait("each container its own partition", lambda m: _allocations(m, "ext") == want, 60)
    resources = _labels(metrics, "hw_allocation_info", "k8s_container_name",
                        "hw_allocation_resource", k8s_pod_name="ext")  # fmt: skip
    assert resources == {("c", EXTENDED): 1, ("d", EXTENDED): 1}


def test_free_partitions_per_profile_are_what_the_scheduler_gives(share: Share) -> None:
    """The pool's free count per profile, from its counters and the devices held: that many
    3g.40gb claims are allocated, one more is refused."""
    admin, metrics = share.admin, share.metrics
    held = {r["device"] for name in ("train", "ext")
            for claim in _claims_of(admin, _pod_of(admin, name)).values()
            for r in _results(claim) if r["driver"] == GPU_DRIVER}  # fmt: skip
    starts = {int(d.rsplit("-", 1)[1]) for d in held}
    expected_3g = sum(1 for s in (0, 4) if not starts & set(range(s, s + 4)))
    free = _labels(metrics, "hw_dra_free", "hw_dra_kind", hw_allocation_resource=GPU_DRIVER)
    assert free == {("gpu",): 1.0, ("mig/1g.10gb",): 7.0 - len(held),
                    ("mig/3g.40gb",): float(expected_3g)}  # fmt: skip
    names = [f"big-{i}" for i in range(expected_3g + 1)]
    for name in names:
        admin.apply(_pod(name, "mig-3g"))
    wait_for("the scheduler's answer", lambda: all(
        _pod_of(admin, n)["status"].get("phase") == "Running" or bool(_unschedulable(admin, n))
        for n in names), 60, interval=0.25)  # fmt: skip
    running = [n for n in names if _pod_of(admin, n)["status"].get("phase") == "Running"]
    assert len(running) == expected_3g, (running, [_unschedulable(admin, n) for n in names])
    metrics.wait("no 3g.40gb left", lambda m: _labels(
        m, "hw_dra_free", "hw_dra_kind", hw_allocation_resource=GPU_DRIVER).get(
        ("mig/3g.40gb",)) == 0, 30)  # fmt: skip
    stranded = _labels(metrics, "hw_dra_counter_stranded", "hw_dra_counter",
                       hw_allocation_resource=GPU_DRIVER)  # fmt: skip
    left = _labels(metrics, "hw_dra_counter_free", "hw_dra_counter",
                   hw_allocation_resource=GPU_DRIVER)  # fmt: skip
    print(f"held {sorted(held)}; free {free}; counters left: {left}; stranded: {stranded}")
    for name in names:
        admin.delete(_pod(name))


def test_a_nic_claim_carries_its_interface_conditions_counters_and_placement(
    share: Share,
) -> None:
    """Fact 15: the driver's `status.devices` reaches the exporter only through the claim;
    the NIC is joined to the netdev source by its PCI address (and interface name), so its
    counters and its PCIe path to the pod's GPU partition are the pod's."""
    admin, metrics = share.admin, share.metrics
    claims = _claims_of(admin, _pod_of(admin, "train"))
    status = claims["nic"]["status"]["devices"]
    assert [d["networkData"]["interfaceName"] for d in status] == ["eth1"]
    metrics.wait("the NIC joined", lambda m: _allocations(m, "train").get(
        ("c", NIC_DEVICE_NAME)) == NIC, 60)  # fmt: skip
    metrics.wait("its network data", lambda m: _labels(
        m, "hw_dra_allocation_network_info", "hw_id", "hw_network_name", "hw_network_mac",
        "hw_network_ips", k8s_pod_name="train") == {
        (NIC, "eth1", "0c:42:a1:00:00:12", "192.0.2.10/24"): 1.0}, 30)  # fmt: skip
    conditions = _labels(metrics, "hw_dra_allocation_condition", "hw_dra_condition",
                         "hw_dra_condition_status", "hw_dra_condition_reason", k8s_pod_name="train")  # fmt: skip
    assert conditions == {("Ready", "True", "NetworkDeviceReady"): 1.0}
    assert metrics.value("hw_network_io_bytes_total", hw_id=NIC) is not None
    (mig,) = share.migs.of(claims["mig-1g"]["metadata"]["uid"])
    placement = _labels(metrics, "hw_container_pcie_placement", "hw_gpu_id", "hw_network_id",
                        "hw_pcie_placement", k8s_pod_name="train")  # fmt: skip
    assert placement == {(mig, NIC, "PIX"): 1.0}


def test_a_device_taint_rule_reaches_the_device(share: Share) -> None:
    """Control-plane.md DRA 8, with the gate on and v1beta2 served (the session's plane)."""
    taints = _labels(share.metrics, "hw_dra_device_taint", "hw_allocation_device_id", "hw_id",
                     "hw_dra_taint_key", "hw_dra_taint_effect", "hw_dra_taint_source")  # fmt: skip
    assert taints == {("gpu-0", SHARED, "example.com/maintenance", "None", RULE): 1.0}
