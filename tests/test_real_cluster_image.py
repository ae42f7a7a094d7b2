"""The image and the kit on the real 1.36 cluster, deployed as a user deploys them.

The Dockerfile built by Debian's docker.io (tests/image), loaded into the node's containerd
(`docker save | ctr -n k8s.io images import -`), then deployed as a user does, each with only
the overlay this cluster needs (tests/realcluster/image.py says which and why): deploy/base;
deploy/base + components/kubernetes-api (real kustomize), then the Helm chart with
`kubernetesApi.enabled` over it (Helm's library; applied as `helm template | kubectl apply`,
the objects the kit made adopted) and the kit again: two rolling updates of the one
DaemonSet, scraped every 0.25 s: one gap of a few seconds each (the host network's port is
the node's, so the old pod stops first). Each time: the DaemonSet's one pod becomes Ready,
its /metrics names the pods holding the test device plugin's devices (and, with the API, each one's workload), `doctor` passes inside the
running container (`ctr tasks exec`), and deleting what was applied leaves nothing: no
object, no container, no listener. The exporter's RSS in the pod is measured each time
(docs/kubernetes-api.md quotes it).

Skipped with one line where the cluster binaries, root or Docker are missing.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from simulator.nvml import STATE_ENV, library_dir
from simulator.ports import free_port
from tests.image import daemonset
from tests.realcluster import image
from tests.realcluster.api import Api, ApiStatus, namespace, path_of
from tests.realcluster.controlplane import ControlPlane
from tests.realcluster.daemons import wait_for
from tests.realcluster.node import DEVICES, RESOURCE, ClusterNode, pod_spec
from tests.realnode.nvml import StandInNvml
from tests.realnode.procs import pids_in_container

pytestmark = pytest.mark.peer

WORK_NS = "kde-image-work"
OPT_IN = "kube-device-exporter.io/enabled"
SELECTOR = "app.kubernetes.io/name=kube-device-exporter"
ORDER = ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
         "RoleBinding", "Service", "DaemonSet")  # fmt: skip
READY_WITHIN = 90.0
GAP_WITHIN = 8.0
"""Seconds a rollout may leave the node's port unanswered: measured 2.4-3.4 s here (the old
pod's stop, the scheduler placing the new one, its start; docs/deploy.md, section 5)."""
SETTLE = 40.0
"""Seconds after the apply at which the RSS is read: a few 10 s cycles past Ready."""
RSS: dict[str, int] = {}
"""Deployment -> the exporter's VmRSS in kB once Ready and settled (printed at the end)."""


def _workloads(node: str) -> list[dict[str, Any]]:
    labels = {"app": "train"}
    spec = pod_spec(devices=1) | {"nodeName": node}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "train", "namespace": WORK_NS},
        "spec": {"replicas": 2, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": spec}},
    }  # fmt: skip
    bare = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "debug", "namespace": WORK_NS}, "spec": spec}  # fmt: skip
    return [deployment, bare]


def _running(admin: Api) -> dict[str, dict[str, Any]]:
    pods = admin.get(f"/api/v1/namespaces/{WORK_NS}/pods")["items"]
    return {p["metadata"]["name"]: p for p in pods if p["status"].get("phase") == "Running"}


@pytest.fixture(scope="module")
def built(cluster_node: ClusterNode) -> Iterator[image.Built]:
    workdir = Path(tempfile.mkdtemp(prefix="kde-cluster-img-", dir="/tmp"))
    made = image.build(workdir)
    if isinstance(made, str):
        shutil.rmtree(workdir, ignore_errors=True)
        pytest.skip(f"cluster image: {made}")
    print(f"image build: {made.build_seconds:.1f} s")
    try:
        image.load(made, cluster_node)
        yield made
    finally:
        made.engine.run("rmi", "--force", made.tag, check=False)
        made.engine.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[image.Driver]:
    """The simulated NVML showing the device plugin's eight GPUs (and one MIG-split GPU the
    plugin does not hand out), as the toolkit would inject the real driver's library."""
    nvml = StandInNvml(tmp_path_factory.mktemp("cluster-image-nvml"), DEVICES,
                       "GPU-5d0a7c2e-6b1f-4e8a-9c3d-0000000000ff",
                       ("MIG-5d0a7c2e-6b1f-4e8a-9c3d-0000000000f0",))  # fmt: skip
    env = nvml.env()
    library = library_dir()
    state = Path(env[STATE_ENV])
    try:
        yield image.Driver((library, state.parent),
                           {"LD_LIBRARY_PATH": str(library), STATE_ENV: str(state)})  # fmt: skip
    finally:
        nvml.close()


@pytest.fixture(scope="module")
def scene(control_plane: ControlPlane, cluster_node: ClusterNode,
          built: image.Built) -> Iterator[Api]:  # fmt: skip
    """Three pods holding a device each, and the node labelled as README says for a node
    that no feature discovery labels (test_real_cluster_kit.py shows why it must be)."""
    admin = control_plane.admin()
    node_path = f"/api/v1/nodes/{cluster_node.name}"
    namespace(admin, WORK_NS)
    for obj in _workloads(cluster_node.name):
        admin.apply(obj)
    admin.request("PATCH", node_path, {"metadata": {"labels": {OPT_IN: "true"}}},
                  content_type="application/strategic-merge-patch+json")  # fmt: skip
    try:
        wait_for("three device pods running", lambda: len(_running(admin)) == 3, 90)
        yield admin
    finally:
        admin.request("PATCH", node_path, {"metadata": {"labels": {OPT_IN: None}}},
                      content_type="application/strategic-merge-patch+json")  # fmt: skip
        admin.request("DELETE", f"/api/v1/namespaces/{WORK_NS}")
        wait_for("the work namespace gone", lambda: _gone(admin, f"/api/v1/namespaces/{WORK_NS}"),
                 90)  # fmt: skip
    print("exporter VmRSS in the pod (kB): " + json.dumps(RSS))


def _gone(admin: Api, path: str) -> bool:
    try:
        admin.get(path)
    except ApiStatus as exc:
        if exc.code == 404:
            return True
        raise
    return False


def _series(port: int, name: str) -> list[dict[str, str]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return [dict(s.labels) for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == name]  # fmt: skip


def _value(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    (value,) = [s.value for f in text_string_to_metric_families(text)
                for s in f.samples if s.name == name]  # fmt: skip
    return float(value)


def _exporter_pod(admin: Api, ns: str) -> dict[str, Any] | None:
    pods = admin.get(f"/api/v1/namespaces/{ns}/pods", labelSelector=SELECTOR)["items"]
    assert len(pods) <= 1, [p["metadata"]["name"] for p in pods]
    return pods[0] if pods else None


def _ready(pod: dict[str, Any] | None) -> bool:
    conditions = (pod or {}).get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _vm_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def _ordered(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted((o for o in objects if o["kind"] in ORDER), key=lambda o: ORDER.index(o["kind"]))


def _namespace_of(objects: list[dict[str, Any]]) -> str:
    """The DaemonSet's namespace (the kit's and the chart's, where both are given)."""
    (ns,) = {o["metadata"]["namespace"] for o in objects if o["kind"] == "DaemonSet"}
    return str(ns)


def _apply(admin: Api, objects: list[dict[str, Any]]) -> float:
    """Every object (the namespace first where none comes with them and it is not there, as
    `helm install --create-namespace`); when it began."""
    began = time.monotonic()
    ns = _namespace_of(objects)
    if not any(o["kind"] == "Namespace" for o in objects) and _gone(
        admin, f"/api/v1/namespaces/{ns}"
    ):
        namespace(admin, ns)
    for obj in _ordered(objects):
        admin.apply(obj)
    return began


def _deploy_and_check(admin: Api, node: ClusterNode, built: image.Built, label: str,
                      objects: list[dict[str, Any]], *, port: int, api: bool) -> None:  # fmt: skip
    try:
        began = _apply(admin, objects)
        _check(admin, node, built, label, ns=_namespace_of(objects), began=began, port=port,
               api=api)  # fmt: skip
    finally:
        _delete(admin, node, built, label, objects, port=port)


def _check(admin: Api, node: ClusterNode, built: image.Built, label: str, *, ns: str,
           began: float, port: int, api: bool) -> None:  # fmt: skip
    wait_for(f"{label}: the exporter pod Ready",
             lambda: _ready(_exporter_pod(admin, ns)), READY_WITHIN)  # fmt: skip
    print(f"{label}: pod Ready {time.monotonic() - began:.1f} s after the apply")
    pod = _exporter_pod(admin, ns)
    assert pod is not None and pod["spec"]["nodeName"] == node.name
    (status,) = pod["status"]["containerStatuses"]
    assert status["image"].endswith(built.tag.rsplit("/", 1)[1]), status["image"]

    holders = set(_running(admin))

    def named() -> bool:
        pods = {s["k8s_pod_name"] for s in _series(port, "hw_allocation_info")}
        return pods == holders

    wait_for(f"{label}: /metrics naming {sorted(holders)}", named, 30)
    allocations = _series(port, "hw_allocation_info")
    assert {(a["k8s_namespace_name"], a["hw_allocation_resource"]) for a in allocations} \
        == {(WORK_NS, RESOURCE)}  # fmt: skip
    assert len({a["hw_allocation_device_id"] for a in allocations}) == 3
    # Joined to the driver's GPUs: each allocation names its device by UUID.
    assert {a["hw_id"] for a in allocations} == {a["hw_allocation_device_id"]
                                                 for a in allocations}  # fmt: skip
    if api:

        def owners() -> dict[str, tuple[str, str]]:
            return {s["k8s_pod_name"]: (s["k8s_workload_kind"], s["k8s_workload_name"])
                    for s in _series(port, "k8s_pod_workload_info")
                    if s["k8s_namespace_name"] == WORK_NS}  # fmt: skip

        want = {name: ("Deployment", "train") if name.startswith("train-") else ("Pod", name)
                for name in holders}  # fmt: skip
        wait_for(f"{label}: workloads named", lambda: owners() == want, 30)
        assert _value(port, "kube_device_exporter_kubernetes_up") == 1.0
    else:
        assert _series(port, "k8s_pod_workload_info") == []

    container_id = status["containerID"].removeprefix("containerd://")
    doctor = node.node.containerd.ctr(
        # Its stdio fifos in a folder both mount namespaces see (containerd's default,
        # /run/containerd/fifo, is the node's private one).
        "tasks", "exec", "--fifo-dir", str(node.node.workdir), "--exec-id",
        f"doctor-{label}", container_id,
        "kube-device-exporter", "doctor", check=False, timeout=120,
    )  # fmt: skip
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "every device the node advertises is seen" in doctor.stdout, doctor.stdout
    assert re.search(r"^OK\s+kubelet\s.*PodResources v1, \d+ pods \(3 holding devices\)",
                     doctor.stdout, re.M), doctor.stdout  # fmt: skip
    if api:
        assert re.search(r"^OK\s+Kubernetes API\s", doctor.stdout, re.M), doctor.stdout
    # RSS once the exporter has run a while past Ready (its cycles are every 10 s).
    settle = began + SETTLE - time.monotonic()
    if settle > 0:
        time.sleep(settle)
    pids = pids_in_container(container_id)
    assert pids, f"no process of container {container_id}"
    RSS[label] = max(_vm_rss_kb(p) for p in pids)


def _delete(admin: Api, node: ClusterNode, built: image.Built, label: str,
            objects: list[dict[str, Any]], *, port: int) -> None:  # fmt: skip
    """Deleting what was applied leaves nothing: no object, no container, no listener."""
    ns = _namespace_of(objects)
    for obj in reversed(_ordered(objects)):
        if obj["kind"] != "Namespace":
            admin.delete(obj)
    admin.request("DELETE", f"/api/v1/namespaces/{ns}")
    wait_for(f"{label}: namespace {ns} gone", lambda: _gone(admin, f"/api/v1/namespaces/{ns}"),
             90)  # fmt: skip
    for obj in objects:
        assert _gone(admin, path_of(obj)), path_of(obj)
    containers = node.node.containerd.ctr("containers", "ls").stdout
    assert built.tag not in containers, containers
    wait_for(f"{label}: port {port} free", lambda: not _listening(port), 30)


class Scrapes:
    """/metrics on `port` every 0.25 s in a thread, as Prometheus would over a rollout: each
    scrape's outcome and the answering process's start time."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.outcomes: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Scrapes:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            try:
                outcome = str(_value(self.port, "process_start_time_seconds"))
            except (OSError, ValueError) as exc:
                outcome = f"failed: {type(exc).__name__}"
            self.outcomes.append((time.monotonic(), outcome))

    @property
    def failed(self) -> list[str]:
        return [o for _, o in self.outcomes if o.startswith("failed")]

    def gaps(self) -> list[float]:
        """Each run of failed scrapes: seconds from the last answer before it to the first
        answer after it."""
        gaps: list[float] = []
        last_answer: float | None = None
        failing = False
        for at, outcome in self.outcomes:
            if outcome.startswith("failed"):
                failing = True
                continue
            if failing and last_answer is not None:
                gaps.append(round(at - last_answer, 2))
            failing, last_answer = False, at
        return gaps

    def processes(self) -> list[str]:
        """The start times that answered, in order of first answer."""
        return list(dict.fromkeys(o for _, o in self.outcomes if not o.startswith("failed")))


def _rolled(admin: Api, ns: str, generation: int) -> bool:
    """The DaemonSet's one pod is of template `generation` and Ready, the old one gone."""
    pods = admin.get(f"/api/v1/namespaces/{ns}/pods", labelSelector=SELECTOR)["items"]
    return len(pods) == 1 and _ready(pods[0]) and int(
        pods[0]["metadata"]["labels"].get("pod-template-generation", "0")) == generation  # fmt: skip


def test_the_kit_base_runs_its_image_on_the_cluster(
    scene: Api, cluster_node: ClusterNode, built: image.Built, driver: image.Driver
) -> None:
    port = free_port()
    objects = image.kit(built, cluster_node, port, server=None, driver=driver)
    _deploy_and_check(scene, cluster_node, built, "kit", objects, port=port, api=False)


def test_the_chart_takes_over_from_the_kit_with_one_short_gap_per_rollout(
    scene: Api,
    control_plane: ControlPlane,
    cluster_node: ClusterNode,
    built: image.Built,
    driver: image.Driver,
) -> None:
    """The kit with the API, then the chart over it (Helm's release name and namespace: the
    same objects, adopted as docs/deploy.md says) and back: each change is a rolling update
    of the one DaemonSet, scraped every 0.25 s. On the host network (all this cluster has)
    the port is the node's: the scheduler places no second pod on it, so the kit's
    host-network component and the chart's `hostNetwork` stop the old pod first
    (maxUnavailable: 1; a surge pod stayed Pending, "didn't have free ports", and the rollout
    never ended). Each rollout costs one gap, a few seconds long (docs/deploy.md, section 5,
    gives the figures); every other scrape answers, from each of the three pods in turn."""
    port = free_port()
    kit = image.kit(built, cluster_node, port, server=control_plane.server, driver=driver)
    chart = image.chart(built, cluster_node, port, "kube-device-exporter", "kube-device-exporter",
                        server=control_plane.server, driver=driver)  # fmt: skip
    ns = _namespace_of(kit)
    assert _namespace_of(chart) == ns
    for objects in (kit, chart):
        (ds,) = [o for o in objects if o["kind"] == "DaemonSet"]
        assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    ds_path = f"/apis/apps/v1/namespaces/{ns}/daemonsets/kube-device-exporter"
    try:
        began = _apply(scene, kit)
        _check(scene, cluster_node, built, "kit-api", ns=ns, began=began, port=port, api=True)
        rolls = []
        with Scrapes(port) as scrapes:
            wait_for("a first scrape", lambda: bool(scrapes.outcomes), 10)
            for label, objects in (("chart-api", chart), ("kit-api again", kit)):
                started = _apply(scene, objects)
                generation = int(scene.get(ds_path)["metadata"]["generation"])
                wait_for(f"{label}: rolled", lambda g=generation: _rolled(scene, ns, g),  # type: ignore[misc]
                         READY_WITHIN)  # fmt: skip
                rolls.append(round(time.monotonic() - started, 1))
                if label == "chart-api":
                    _check(scene, cluster_node, built, label, ns=ns, began=started, port=port,
                           api=True)  # fmt: skip
            time.sleep(1)
        gaps = scrapes.gaps()
        print(
            f"rollouts kit -> chart -> kit: {rolls} s; {len(scrapes.outcomes)} scrapes, "
            f"{len(scrapes.failed)} failed, gaps {gaps} s, "
            f"{len(scrapes.processes())} processes answered"
        )
        assert len(gaps) <= 2 and all(gap <= GAP_WITHIN for gap in gaps), gaps
        assert not scrapes.outcomes[-1][1].startswith("failed"), scrapes.outcomes[-5:]
        assert len(scrapes.processes()) == 3  # the kit's, the chart's, the kit's again
    finally:
        _delete(scene, cluster_node, built, "kit-and-chart", kit + chart, port=port)


API_WATCH_MIB = 14.0
"""What the API watch may add to the pod's RSS: measured +10.4 MiB (docs/kubernetes-api.md)."""


def test_memory_in_the_pod_with_and_without_the_api_watch(scene: Api) -> None:
    """Reads the RSS the three deployments above left in RSS (so it runs after them): each
    under the DaemonSet's memory request, and the API watch within its documented cost."""
    assert set(RSS) == {"kit", "kit-api", "chart-api"}, f"a deployment above failed: {RSS}"
    _, container = daemonset.load(image.DEPLOY / "base" / "daemonset.yaml")
    request_kib = int(container["resources"]["requests"]["memory"].removesuffix("Mi")) * 1024
    assert all(kib < request_kib for kib in RSS.values()), RSS
    added_mib = (RSS["kit-api"] - RSS["kit"]) / 1024
    assert 0 < added_mib < API_WATCH_MIB, RSS
    assert abs(RSS["chart-api"] - RSS["kit-api"]) / 1024 < 2.0, "the chart runs the same pod"
