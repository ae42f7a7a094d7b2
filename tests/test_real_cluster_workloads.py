"""Workloads from the real controllers on a real 1.36 kubelet: Deployment -> ReplicaSet ->
Pod, CronJob -> Job -> Pod, StatefulSet, DaemonSet and a bare pod, each holding a device of
the tests' own device plugin. The exporter, run as the DaemonSet runs it (the kubelet's
PodResources socket, `--kubernetes.api` under the kit's RBAC with a TokenRequest token),
names each owner exactly on `k8s_pod_workload_info`, through a rollout, a job finishing and
deletions, and keeps no series of a pod that is gone.

Tier: real cluster (tests/realcluster: control plane + tests/realnode's containerd, images
and device plugin under the 1.36 kubelet).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.realcluster import oracle, rbac
from tests.realcluster.api import Api, namespace
from tests.realcluster.controlplane import ControlPlane
from tests.realcluster.daemons import wait_for
from tests.realcluster.exporter import Metrics, on_node
from tests.realcluster.node import RESOURCE, ClusterNode, pod_spec
from tests.realcluster.workloads import NS, objects, template

pytestmark = pytest.mark.peer

INFO = "k8s_pod_workload_info"
ALLOC = "hw_allocation_info"
LABELS = ("team",)


def _node_pods(admin: Api, node: ClusterNode) -> dict[str, dict[str, Any]]:
    """The test namespace's pods on the node, by name."""
    items = admin.get("/api/v1/pods", fieldSelector=f"spec.nodeName={node.name}")
    return {p["metadata"]["name"]: p for p in items["items"] if p["metadata"]["namespace"] == NS}


@dataclass
class Scene:
    admin: Api
    node: ClusterNode
    metrics: Metrics

    def pods(self) -> dict[str, dict[str, Any]]:
        return _node_pods(self.admin, self.node)

    def running(self) -> dict[str, dict[str, Any]]:
        return {n: p for n, p in self.pods().items()
                if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")}  # fmt: skip

    def expected(self) -> set[oracle.Series]:
        return {oracle.info(self.admin, p, self.node.name, LABELS) for p in self.running().values()}

    def info(self) -> set[oracle.Series]:
        return set(self.metrics.series(INFO))

    def holders(self) -> set[str]:
        return {dict(s)["k8s_pod_name"] for s in self.metrics.series(ALLOC)}

    def settle(self, what: str, running: set[str], timeout: float = 60.0) -> None:
        """Until exactly the pods whose name starts with one of `running` run, and the
        exporter's info and allocation series name exactly those pods, as the oracle says."""

        def done() -> bool:
            now = self.running()
            if {_stem(n) for n in now} != running or len(now) != len(running):
                return False
            return self.info() == self.expected() and self.holders() == set(now)

        try:
            wait_for(what, done, timeout, [self.metrics.daemon], interval=0.5)
        except TimeoutError as exc:
            raise AssertionError(
                f"{exc}\nrunning: {sorted(self.running())}\nseries: {sorted(dict(s)['k8s_pod_name'] for s in self.info())}\n"
                f"want - got: {self.expected() - self.info()}\ngot - want: {self.info() - self.expected()}"
            ) from None


def _stem(pod: str) -> str:
    return pod.split("-", maxsplit=1)[0]


@pytest.fixture(scope="module")
def scene(
    control_plane: ControlPlane, cluster_node: ClusterNode, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Scene]:
    admin = control_plane.admin()
    tmp = tmp_path_factory.mktemp("real-workloads")
    token = rbac.install_kit(admin)
    namespace(admin, NS)
    for obj in objects(cluster_node.name):
        admin.apply(obj)
    kubeconfig = control_plane.token_kubeconfig(tmp / "exporter.kubeconfig", token)
    try:
        with on_node(tmp, cluster_node.socket, cluster_node.name, kubeconfig,
                     "--kubernetes.pod-labels", "team") as metrics:  # fmt: skip
            yield Scene(admin, cluster_node, metrics)
    finally:
        admin.request("DELETE", f"/api/v1/namespaces/{NS}")
        wait_for(
            "the namespace's pods gone from the node",
            lambda: not _node_pods(admin, cluster_node),
            60,
        )


def test_1_each_owner_named_exactly(scene: Scene) -> None:
    scene.settle("four workloads running", {"debug", "train", "db", "agent"}, 90)
    by_pod = {dict(s)["k8s_pod_name"]: dict(s) for s in scene.info()}
    train = next(v for k, v in by_pod.items() if k.startswith("train-"))
    assert train["k8s_deployment_name"] == "train"
    assert train["k8s_workload_kind"] == "Deployment"
    assert train["k8s_pod_name"].startswith(train["k8s_replicaset_name"] + "-")
    assert by_pod["db-0"]["k8s_statefulset_name"] == "db"
    assert by_pod["debug"]["k8s_workload_kind"] == "Pod"
    assert by_pod["debug"]["k8s_pod_label_team"] == "sre"
    agent = next(v for k, v in by_pod.items() if k.startswith("agent-"))
    assert (agent["k8s_workload_kind"], agent["k8s_daemonset_name"]) == ("DaemonSet", "agent")
    # Each holds one device of the plugin, as PodResources gives it.
    allocations = scene.metrics.series(ALLOC)
    assert {dict(s)["hw_allocation_resource"] for s in allocations} == {RESOURCE}
    assert len({dict(s)["hw_allocation_device_id"] for s in allocations}) == 4
    assert scene.metrics.value("kube_device_exporter_kubernetes_up") == 1
    # Under the kit's RBAC: only the documented requests, none refused.
    requests = [
        dict(s) for s in scene.metrics.series("kube_device_exporter_kubernetes_requests_total")
    ]
    assert {(r["verb"], r["resource"]) for r in requests} <= {
        ("list", "pods"), ("watch", "pods"), ("get", "replicasets"), ("get", "jobs")}  # fmt: skip
    assert {r["code"] for r in requests} == {"200"}


def test_2_a_rollout_moves_the_series_to_the_new_replicaset(scene: Scene) -> None:
    before = {n for n in scene.running() if n.startswith("train-")}
    old_rs = {
        dict(s)["k8s_replicaset_name"] for s in scene.info() if dict(s)["k8s_pod_name"] in before
    }
    scene.admin.request("PATCH", f"/apis/apps/v1/namespaces/{NS}/deployments/train",
                        {"spec": {"template": {"metadata": {"annotations": {"kde/rev": "2"}}}}},
                        content_type="application/strategic-merge-patch+json")  # fmt: skip
    wait_for("the new ReplicaSet's pod running",
             lambda: bool({n for n in scene.running() if n.startswith("train-")} - before), 60)  # fmt: skip
    scene.settle("the rollout done", {"debug", "train", "db", "agent"}, 60)
    train = [dict(s) for s in scene.info() if dict(s)["k8s_pod_name"].startswith("train-")]
    assert len(train) == 1
    assert train[0]["k8s_replicaset_name"] not in old_rs
    assert train[0]["k8s_deployment_name"] == "train"
    assert not scene.holders() & before  # the old pod left every series


def test_3_a_cronjob_run_named_while_it_runs_and_gone_when_it_finished(scene: Scene) -> None:
    cronjob = scene.admin.apply({
        "apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "nightly", "namespace": NS},
        "spec": {"schedule": "0 3 * * *", "suspend": True, "jobTemplate": {"spec": {
            "backoffLimit": 0,
            "template": template("nightly") | {"spec": {
                **pod_spec(command=("sleep", "6"), restart="Never"), "nodeName": scene.node.name}},
        }}},
    })  # fmt: skip
    scene.admin.apply({  # `kubectl create job nightly-manual --from=cronjob/nightly`
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "nightly-manual", "namespace": NS, "ownerReferences": [
            {"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly",
             "uid": cronjob["metadata"]["uid"], "controller": True}]},
        "spec": cronjob["spec"]["jobTemplate"]["spec"],
    })  # fmt: skip
    scene.settle(
        "the job's pod running and named", {"debug", "train", "db", "agent", "nightly"}, 60
    )
    (job_pod,) = [dict(s) for s in scene.info() if dict(s)["k8s_pod_name"].startswith("nightly-")]
    assert (job_pod["k8s_job_name"], job_pod["k8s_cronjob_name"]) == ("nightly-manual", "nightly")
    assert job_pod["k8s_workload_kind"] == "CronJob"
    job = f"/apis/batch/v1/namespaces/{NS}/jobs/nightly-manual"
    wait_for("the Job complete", lambda: scene.admin.get(job)["status"].get("succeeded") == 1, 60)
    scene.settle("the finished job's series gone", {"debug", "train", "db", "agent"}, 30)
    assert job_pod["k8s_pod_name"] in scene.pods()  # the Succeeded pod is still there


def test_4_deleted_pods_leave_no_series(scene: Scene) -> None:
    scene.admin.delete({"kind": "Pod", "metadata": {"name": "debug", "namespace": NS}})
    scene.admin.delete({"kind": "StatefulSet", "metadata": {"name": "db", "namespace": NS}})
    scene.settle("debug and db gone", {"train", "agent"}, 60)
    wait_for("the pods gone from the API", lambda: not {"debug", "db-0"} & set(scene.pods()), 60)
    scene.settle("debug and db gone (after deletion)", {"train", "agent"}, 30)
    assert {_stem(n) for n in scene.holders()} == {"train", "agent"}
