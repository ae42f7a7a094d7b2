"""The real-cluster tier's control plane (tests/realcluster): Kubernetes 1.36 from the
binaries named by KDE_E2E_HYPERKUBE/KDE_E2E_ETCD, up in well under 30 s, with the real
Node,RBAC authorizer and working controllers; torn down by PID with its folder removed, also
when the test using it fails."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from tests.realcluster import binaries
from tests.realcluster.api import Api, ApiStatus
from tests.realcluster.controlplane import ControlPlane, running
from tests.realcluster.daemons import alive, wait_for

pytestmark = pytest.mark.peer

NAMESPACE = "kde-cp"


def test_up_quickly_with_every_component(control_plane: ControlPlane) -> None:
    assert control_plane.timings["controllers"] < 20, control_plane.timings
    api = control_plane.admin()
    # The binary's own version (v1.36.2 for the shared one; any of the line may be named).
    assert binaries.kubernetes_version() == f"Kubernetes {api.get('/version')['gitVersion']}"
    assert api.get("/version")["minor"] == "36"
    assert [d.name for d in control_plane.daemons] == [
        "etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager"
    ]  # fmt: skip
    assert all(alive(pid) for pid in control_plane.pids())
    # The API server runs the real authorizers, in the order the flag gives.
    argv = control_plane.daemons[1].argv
    assert "--authorization-mode=Node,RBAC" in argv


def test_controller_manager_acts_and_the_authorizer_denies(control_plane: ControlPlane) -> None:
    api = control_plane.admin()
    api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    api.apply({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": "nobody", "namespace": NAMESPACE}})  # fmt: skip
    # The ServiceAccount controller makes `default` and the root CA ConfigMap in a new namespace.
    sa = f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default"
    cm = f"/api/v1/namespaces/{NAMESPACE}/configmaps/kube-root-ca.crt"
    wait_for("the default ServiceAccount", lambda: _exists(api, sa), 20)
    wait_for("the root CA ConfigMap", lambda: _exists(api, cm), 20)
    ca = api.get(cm)
    assert ca["data"]["ca.crt"] == control_plane.pki.ca.read_text()
    # A ServiceAccount bound to nothing is authenticated but may not list pods.
    token = _token(api, NAMESPACE, "nobody")
    nobody = api.as_token(token)
    review = nobody.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                            {"apiVersion": "authentication.k8s.io/v1",
                             "kind": "SelfSubjectReview"})  # fmt: skip
    assert review["status"]["userInfo"]["username"] == f"system:serviceaccount:{NAMESPACE}:nobody"
    with pytest.raises(ApiStatus) as denied:
        nobody.get("/api/v1/pods")
    assert denied.value.code == 403
    assert 'cannot list resource "pods"' in str(denied.value)


def test_scheduler_binds_a_pod_to_a_node(control_plane: ControlPlane) -> None:
    """A Node object (no kubelet here) that is schedulable: the real scheduler binds a pod."""
    api = control_plane.admin()
    api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "kde-cp-sched"},
            "spec": {}}  # fmt: skip
    api.apply(node)
    api.request("PATCH", "/api/v1/nodes/kde-cp-sched/status", {"status": {
        "capacity": {"cpu": "2", "memory": "4Gi", "pods": "10"},
        "allocatable": {"cpu": "2", "memory": "4Gi", "pods": "10"},
        "conditions": [{"type": "Ready", "status": "True", "reason": "Test",
                        "lastHeartbeatTime": _now(), "lastTransitionTime": _now()}],
    }}, content_type="application/strategic-merge-patch+json")  # fmt: skip
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "scheduled", "namespace": NAMESPACE},
           "spec": {"containers": [{"name": "c", "image": "busybox"}],
                    "tolerations": [{"operator": "Exists"}]}}  # fmt: skip
    api.create(pod)
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/scheduled"
    try:
        wait_for("the pod bound", lambda: api.get(path)["spec"].get("nodeName") is not None, 20)
        assert api.get(path)["spec"]["nodeName"] == "kde-cp-sched"
    finally:
        api.delete(pod)
        api.delete(node)


def test_torn_down_by_pid_also_when_a_test_fails(tmp_path: Path) -> None:
    """A second control plane, with a failure inside its block: every process it started
    is gone, its ports are free again and its folder is removed."""
    if (why := binaries.missing()) is not None:
        pytest.skip(f"real cluster: {why}")
    workdir = tmp_path / "second"
    seen: dict[str, object] = {}
    with pytest.raises(ZeroDivisionError), running(workdir) as plane:
        seen["pids"] = plane.pids()
        seen["port"] = plane.api_port
        assert plane.admin().get("/readyz") == "ok"
        _ = 1 / 0
    pids = seen["pids"]
    assert isinstance(pids, list) and len(pids) == 4
    assert [pid for pid in pids if alive(pid)] == []
    assert not workdir.exists()
    with socket.socket() as s:
        s.bind(("127.0.0.1", int(str(seen["port"]))))  # free again


def _exists(api: Api, path: str) -> bool:
    try:
        api.get(path)
    except ApiStatus as exc:
        if exc.code == 404:
            return False
        raise
    return True


def _token(api: Api, namespace: str, account: str, seconds: int = 3600) -> str:
    """A bound token from the TokenRequest API (what kubelet projects into a pod)."""
    answer = api.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
         "spec": {"expirationSeconds": seconds}},
    )  # fmt: skip
    return str(answer["status"]["token"])


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
