"""The GPU Operator's driver upgrade, as its driver manager drives it, against the real
Kubernetes 1.36 DaemonSet controller: the kit's gpu-operator overlay steps aside and comes back.

What the driver manager does (NVIDIA/k8s-driver-manager v0.12.0, cmd/driver-manager/main.go;
docs/deploy.md cites the lines): before unloading the kernel modules it sets every
`nvidia.com/gpu.deploy.*` label it found on the node to `paused-for-driver-upgrade`
(evictAllGPUOperatorComponents, maybeSetPaused), among them `nvidia.com/gpu.deploy.client`
that the GPU Operator (v26.7.0, controllers/state_manager.go) puts on every GPU node for
third-party GPU clients; it then waits until no pod on the node that a DaemonSet controls has
that key in its spec.nodeSelector (internal/kubernetes/client.go WaitForPodsWithNodeSelector),
unloads, and sets the label back to `true` (maybeSetTrue). This test plays the driver
manager's part with the same label values and the same wait predicate.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import kustomize
from tests.realcluster.controlplane import ControlPlane
from tests.realcluster.daemons import wait_for
from tests.realcluster.node import ClusterNode

pytestmark = pytest.mark.peer

ROOT = Path(__file__).resolve().parent.parent
CLIENT = "nvidia.com/gpu.deploy.client"
PAUSED = "paused-for-driver-upgrade"
MERGE = "application/strategic-merge-patch+json"
NAMESPACE = "kde-driver-upgrade"
"""Its own namespace: the kit's other tests look for events of the kit's DaemonSet."""


def _overlay() -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="kde-kit-") as tmp:
        mine = Path(tmp)
        doc = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [os.path.relpath(ROOT / "deploy" / "base", mine)],
            "components": [
                os.path.relpath(ROOT / "deploy" / "components" / c, mine)
                for c in ("nvidia-runtime-class", "gpu-operator-driver-upgrades")
            ],
        }
        (mine / "kustomization.yaml").write_text(yaml.safe_dump(doc))
        wanted = ("Namespace", "ServiceAccount", "DaemonSet")
        objects = [o for o in kustomize.build(mine) if o["kind"] in wanted]
    for obj in objects:
        if obj["kind"] == "Namespace":
            obj["metadata"]["name"] = NAMESPACE
        else:
            obj["metadata"]["namespace"] = NAMESPACE
    return sorted(objects, key=lambda o: wanted.index(o["kind"]))


def _clients_on(admin: Any, node: str) -> list[str]:
    """WaitForPodsWithNodeSelector's count: pods on the node whose controller is a DaemonSet
    and whose spec.nodeSelector has the key."""
    pods = admin.get("/api/v1/pods", fieldSelector=f"spec.nodeName={node}")["items"]
    return [
        p["metadata"]["name"] for p in pods
        if any(o.get("controller") and o["kind"] == "DaemonSet"
               for o in p["metadata"].get("ownerReferences", []))
        and CLIENT in (p["spec"].get("nodeSelector") or {})
    ]  # fmt: skip


def test_the_gpu_operator_overlay_leaves_for_a_driver_upgrade_and_comes_back(
    control_plane: ControlPlane, cluster_node: ClusterNode
) -> None:
    admin = control_plane.admin()
    objects = _overlay()
    daemonset = objects[-1]
    assert daemonset["spec"]["template"]["spec"]["nodeSelector"] == {CLIENT: "true"}
    # The GPU Operator creates the `nvidia` RuntimeClass; here its handler is plain runc.
    runtime_class = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                     "metadata": {"name": "nvidia"}, "handler": "runc"}  # fmt: skip
    node_path = f"/api/v1/nodes/{cluster_node.name}"
    labels = {"nvidia.com/gpu.present": "true", CLIENT: "true"}  # what the operator sets

    def label(value: str | None) -> None:
        patch = {"metadata": {"labels": {CLIENT: value}}}
        admin.request("PATCH", node_path, patch, content_type=MERGE)

    try:
        admin.apply(runtime_class)
        for obj in objects:
            admin.apply(obj)
        admin.request("PATCH", node_path, {"metadata": {"labels": labels}}, content_type=MERGE)
        wait_for("the exporter's pod on the GPU node",
                 lambda: len(_clients_on(admin, cluster_node.name)) == 1, 30)  # fmt: skip
        label(PAUSED)  # evictAllGPUOperatorComponents
        wait_for("no GPU client left for the driver manager to wait on",
                 lambda: _clients_on(admin, cluster_node.name) == [], 60)  # fmt: skip
        label("true")  # after the new driver is loaded: maybeSetTrue
        wait_for("the exporter back after the upgrade",
                 lambda: len(_clients_on(admin, cluster_node.name)) == 1, 30)  # fmt: skip
    finally:
        admin.delete(daemonset)
        admin.delete(objects[0])
        admin.delete(runtime_class)
        admin.request("PATCH", node_path, {"metadata": {"labels": dict.fromkeys(labels)}},
                      content_type=MERGE)  # fmt: skip
