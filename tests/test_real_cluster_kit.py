"""The kit's objects as the real Kubernetes 1.36 API server admits them: the Namespace,
ServiceAccount, RBAC, DaemonSet and Service of deploy/base with components/kubernetes-api,
applied as `kubectl apply --server-side` does. Admission (PodSecurity among it) answers
without a warning, so a user's every apply is quiet.
"""

from __future__ import annotations

from typing import Any

from tests.realcluster import rbac
from tests.realcluster.controlplane import ControlPlane

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
