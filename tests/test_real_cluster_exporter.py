"""The exporter with `--kubernetes.api` against the real Kubernetes 1.36 API server, under
the kit's RBAC and a TokenRequest token: owners made by the real controllers (Deployment ->
ReplicaSet, StatefulSet, DaemonSet, CronJob -> Job, and a bare pod), named exactly on
`k8s_pod_workload_info`, with the pods' real UIDs.

The node here has no kubelet: its pods are bound by `spec.nodeName` (the DaemonSet's by the
real scheduler to a Node object whose status the test writes) and the exporter's PodResources
peer is the simulated kubelet listing the same pod names. The real kubelet's side is
tests/test_real_cluster_kubelet.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from exporter.kubeapi.client import ACCEPT_LIST, ACCEPT_OBJECT
from tests.realcluster import oracle, rbac
from tests.realcluster.api import Api, namespace
from tests.realcluster.controlplane import ControlPlane
from tests.realcluster.daemons import wait_for
from tests.realcluster.exporter import scenario, simulated_node

pytestmark = pytest.mark.peer

SIM_NODE = "kde-sim-node"
NS = "kde-wl"
INFO = "k8s_pod_workload_info"


def _pod_template(labels: dict[str, str], node: str | None = SIM_NODE) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox"}],
                            "tolerations": [{"operator": "Exists"}]}  # fmt: skip
    if node:
        spec["nodeName"] = node
    return {"metadata": {"labels": labels}, "spec": spec}


def workloads() -> list[dict[str, Any]]:
    def meta(name: str) -> dict[str, str]:
        return {"name": name, "namespace": NS}

    return [
        {"apiVersion": "v1", "kind": "Pod", "metadata": {**meta("debug"), "labels": {"team": "sre"}},
         **{k: v for k, v in _pod_template({}).items() if k == "spec"}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta("train"),
         "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "train"}},
                  "template": _pod_template({"app": "train", "team": "vision"})}},
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta("db"),
         "spec": {"replicas": 1, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                  "template": _pod_template({"app": "db"})}},
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": meta("agent"),
         "spec": {"selector": {"matchLabels": {"app": "agent"}},
                  "template": _pod_template({"app": "agent"}, node=None)}},
    ]  # fmt: skip


@dataclass
class Cluster:
    admin: Api
    kubeconfig: Path
    tmp: Path

    def pods(self) -> dict[str, dict[str, Any]]:
        items = self.admin.get("/api/v1/pods", fieldSelector=f"spec.nodeName={SIM_NODE}")["items"]
        return {p["metadata"]["name"]: p for p in items}


@pytest.fixture(scope="module")
def cluster(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    admin = control_plane.admin()
    tmp = tmp_path_factory.mktemp("workloads")
    token = rbac.install_kit(admin)
    admin.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": SIM_NODE}})
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    admin.request("PATCH", f"/api/v1/nodes/{SIM_NODE}/status", {"status": {
        "capacity": {"cpu": "4", "memory": "8Gi", "pods": "50"},
        "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "50"},
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "lastHeartbeatTime": now, "lastTransitionTime": now}],
    }}, content_type="application/strategic-merge-patch+json")  # fmt: skip
    namespace(admin, NS)
    for obj in workloads():
        admin.apply(obj)
    cronjob = admin.apply({
        "apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "nightly", "namespace": NS},
        "spec": {"schedule": "0 3 * * *", "suspend": True, "jobTemplate": {"spec": {
            "template": {**_pod_template({"app": "nightly"}),
                         "spec": {**_pod_template({})["spec"], "restartPolicy": "Never"}}}}},
    })  # fmt: skip
    admin.apply({  # `kubectl create job nightly-manual --from=cronjob/nightly`
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "nightly-manual", "namespace": NS, "ownerReferences": [
            {"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly",
             "uid": cronjob["metadata"]["uid"], "controller": True}]},
        "spec": cronjob["spec"]["jobTemplate"]["spec"],
    })  # fmt: skip
    kubeconfig = control_plane.token_kubeconfig(tmp / "exporter.kubeconfig", token)
    made = Cluster(admin, kubeconfig, tmp)
    wait_for("6 pods on the node", lambda: len(made.pods()) == 6, 30)
    yield made
    for obj in workloads():
        admin.delete(obj)
    admin.delete({"kind": "Node", "metadata": {"name": SIM_NODE}})


def expected_info(cluster: Cluster) -> set[oracle.Series]:
    """The series the docs promise, computed from the API's own objects (names, UIDs)."""
    return {oracle.info(cluster.admin, p, SIM_NODE, ("team",)) for p in cluster.pods().values()}


def test_the_api_server_answers_metadata_only(cluster: Cluster) -> None:
    """The exporter asks for PartialObjectMetadata (exporter/kubeapi/client.py): the real
    API server answers so, and no pod spec or status crosses the wire."""
    pods = cluster.admin.request("GET", "/api/v1/pods", params={
        "fieldSelector": f"spec.nodeName={SIM_NODE}"}, accept=ACCEPT_LIST)  # fmt: skip
    assert pods["kind"] == "PartialObjectMetadataList"
    assert pods["apiVersion"] == "meta.k8s.io/v1"
    assert len(pods["items"]) == 6
    assert all(set(item) == {"kind", "apiVersion", "metadata"} for item in pods["items"])
    train = next(p for p in pods["items"] if p["metadata"]["name"].startswith("train-"))
    assert train["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
    owner = train["metadata"]["ownerReferences"][0]["name"]
    rs = cluster.admin.request("GET", f"/apis/apps/v1/namespaces/{NS}/replicasets/{owner}",
                               accept=ACCEPT_OBJECT)  # fmt: skip
    assert (rs["kind"], set(rs)) == ("PartialObjectMetadata", {"kind", "apiVersion", "metadata"})


def test_every_owner_named_exactly(cluster: Cluster) -> None:
    pods = cluster.pods()
    assert sorted(p.split("-")[0] for p in pods) == [
        "agent", "db", "debug", "nightly", "train", "train"]  # fmt: skip
    holders = [(NS, name) for name in sorted(pods)]
    path = scenario(cluster.tmp / "node.yaml", SIM_NODE, holders)
    want = expected_info(cluster)
    with simulated_node(cluster.tmp, path, cluster.kubeconfig,
                        "--kubernetes.pod-labels", "team") as metrics:  # fmt: skip
        metrics.wait("an info series per pod", lambda m: len(m.series(INFO)) == 6)
        assert set(metrics.series(INFO)) == want
        assert all(v == 1 for v in metrics.series(INFO).values())
        assert metrics.value("kube_device_exporter_kubernetes_up") == 1
        assert metrics.value("kube_device_exporter_kubernetes_pods") == 6
        codes = {
            dict(s)["code"]
            for s in metrics.series("kube_device_exporter_kubernetes_requests_total")
        }
        assert codes == {"200"}
        # One line per request at INFO was the HTTP library's; the exporter's log has none.
        log = metrics.daemon.log.read_text()
        assert "watching the 6 pods of node kde-sim-node" in log
        assert "HTTP Request" not in log
        # A pod deleted from the API leaves the info series at once, though the (simulated)
        # kubelet still lists it: the series follows the API's pod, never a stale cache.
        cluster.admin.request("DELETE", f"/api/v1/namespaces/{NS}/pods/debug",
                              {"gracePeriodSeconds": 0})  # fmt: skip
        metrics.wait("debug's info gone", lambda m: len(m.series(INFO)) == 5)
        assert {dict(s)["k8s_pod_name"] for s in metrics.series(INFO)} == set(pods) - {"debug"}
        allocated = {dict(s)["k8s_pod_name"] for s in metrics.series("hw_allocation_info")}
        assert "debug" in allocated
