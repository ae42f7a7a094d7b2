"""The kit's objects as the real Kubernetes 1.36 API server admits them: the Namespace,
ServiceAccount, RBAC, DaemonSet and Service of deploy/base with components/kubernetes-api,
applied as `kubectl apply --server-side` does. Admission (PodSecurity among it) answers
without a warning, so a user's every apply is quiet; and the real DaemonSet controller
shows which nodes the DaemonSet selects.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests import kustomize
from tests.realcluster import rbac
from tests.realcluster.controlplane import ControlPlane
from tests.realcluster.daemons import wait_for
from tests.realcluster.node import ClusterNode

pytestmark = pytest.mark.peer

ROOT = Path(__file__).resolve().parent.parent
OPT_IN = "kube-device-exporter.io/enabled"

ORDER = ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service",
         "DaemonSet")  # fmt: skip


def _kit() -> list[dict[str, Any]]:
    objects = [o for o in rbac.kit_objects() if o["kind"] in ORDER]
    return sorted(objects, key=lambda o: ORDER.index(o["kind"]))


def test_the_kit_applies_without_a_warning(control_plane: ControlPlane) -> None:
    admin = control_plane.admin()
    objects = _kit()
    assert [o["kind"] for o in objects] == list(ORDER)
    warned = {}
    for obj in objects:
        admin.apply(obj)
        if admin.warnings:
            warned[obj["kind"]] = admin.warnings
    assert warned == {}
    # Applied again (what every `kubectl apply` of an upgrade does): still quiet.
    daemonset = objects[-1]
    admin.apply(daemonset)
    assert admin.warnings == []


def test_a_node_without_an_expected_label_gets_no_exporter_and_the_opt_in_label_fixes_it(
    control_plane: ControlPlane, cluster_node: ClusterNode
) -> None:
    """The kit's DaemonSet selects nodes by device labels (GPU feature discovery, NFD, cloud
    labels): a node with a device plugin but none of them gets no exporter, and nothing says
    so (DESIRED 0, no event). README ("Why are my metrics missing?") names the opt-in label;
    the real DaemonSet controller shows both."""
    admin = control_plane.admin()
    objects = _kit()
    for obj in objects:
        admin.apply(obj)
    meta = objects[-1]["metadata"]
    path = f"/apis/apps/v1/namespaces/{meta['namespace']}/daemonsets/{meta['name']}"
    node_path = f"/api/v1/nodes/{cluster_node.name}"
    assert admin.get(node_path)["status"]["allocatable"]["nvidia.com/gpu"] == "8"

    def desired() -> int | None:
        status = admin.get(path).get("status") or {}
        if status.get("observedGeneration") != admin.get(path)["metadata"]["generation"]:
            return None
        return int(status.get("desiredNumberScheduled", 0))

    try:
        wait_for("the DaemonSet's status", lambda: desired() is not None, 20)
        assert desired() == 0
        events = admin.get(f"/api/v1/namespaces/{meta['namespace']}/events")["items"]
        assert [e for e in events if e["involvedObject"].get("name") == meta["name"]] == []
        # docs/deploy.md's check by hand (real kubectl) names the node and its devices.
        assert _unselected(control_plane) == [[cluster_node.name, "8"]]
        admin.request("PATCH", node_path, {"metadata": {"labels": {OPT_IN: "true"}}},
                      content_type="application/strategic-merge-patch+json")  # fmt: skip
        wait_for("the labelled node selected", lambda: desired() == 1, 20)
    finally:
        admin.delete(objects[-1])
        admin.request("PATCH", node_path, {"metadata": {"labels": {OPT_IN: None}}},
                      content_type="application/strategic-merge-patch+json")  # fmt: skip
    assert OPT_IN in (ROOT / "README.md").read_text()
    assert _unselected(control_plane) == [[cluster_node.name, "8"]]


def _unselected(control_plane: ControlPlane) -> list[list[str]]:
    """The rows of docs/deploy.md's `kubectl get nodes -l '!...'` (label contract)."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    match = re.search(r"^  (kubectl get nodes -l .*?\\\n.*?)$", text, re.M | re.S)
    assert match, "docs/deploy.md has no `kubectl get nodes -l` check"
    argv = shlex.split(match.group(1).replace("\\\n", " "))
    done = subprocess.run(
        [kustomize.kubectl(), *argv[1:], "--no-headers",
         f"--kubeconfig={control_plane.dir / 'admin.kubeconfig'}"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [line.split() for line in done.stdout.splitlines()]
