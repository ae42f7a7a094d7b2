"""PodResources on the real 1.36 kubelet where it differs from the 1.32 one
(tests/test_real_kubelet.py, behaviours 6 and 13): a pod that failed leaves v1 `List` at
once, while v1alpha1 `List` on the same socket still shows it (its container, no devices).

Tier: real cluster (the session's 1.36 kubelet).
"""

from __future__ import annotations

import grpc
import pytest

from exporter._proto.podresources.v1 import api_pb2 as v1
from exporter._proto.podresources.v1 import api_pb2_grpc as v1_grpc
from exporter._proto.podresources.v1alpha1 import api_pb2 as v1alpha1
from exporter._proto.podresources.v1alpha1 import api_pb2_grpc as v1alpha1_grpc
from tests.realcluster.api import namespace
from tests.realcluster.controlplane import ControlPlane
from tests.realcluster.daemons import wait_for
from tests.realcluster.node import ClusterNode, pod_spec

pytestmark = pytest.mark.peer

NS = "kde-podresources"


def test_a_failed_pod_leaves_v1_list_and_stays_in_v1alpha1(
    control_plane: ControlPlane, cluster_node: ClusterNode
) -> None:
    admin = control_plane.admin()
    namespace(admin, NS)
    spec = {**pod_spec(command=("sh", "-c", "sleep 2; exit 3"), restart="Never"),
            "nodeName": cluster_node.name}  # fmt: skip
    admin.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "crash", "namespace": NS},
                 "spec": spec})  # fmt: skip
    path = f"/api/v1/namespaces/{NS}/pods/crash"
    with grpc.insecure_channel(f"unix://{cluster_node.socket}") as channel:
        new = v1_grpc.PodResourcesListerStub(channel)
        old = v1alpha1_grpc.PodResourcesListerStub(channel)

        def in_v1() -> dict[str, list[str]]:
            pods = new.List(v1.ListPodResourcesRequest(), timeout=2).pod_resources
            return {c.name: [i for d in c.devices for i in d.device_ids]
                    for p in pods if p.namespace == NS for c in p.containers}  # fmt: skip

        def in_v1alpha1() -> dict[str, list[str]]:
            pods = old.List(v1alpha1.ListPodResourcesRequest(), timeout=2).pod_resources
            return {c.name: [i for d in c.devices for i in d.device_ids]
                    for p in pods if p.namespace == NS for c in p.containers}  # fmt: skip

        try:
            wait_for("the pod holding its device", lambda: bool(in_v1().get("c")), 60)
            running = in_v1()
            assert running == in_v1alpha1()
            wait_for("the pod Failed",
                     lambda: admin.get(path)["status"].get("phase") == "Failed", 60)  # fmt: skip
            wait_for("the failed pod out of v1 List", lambda: in_v1() == {}, 10)
            assert in_v1alpha1() == {"c": []}  # still listed there, its device released
        finally:
            admin.request("DELETE", f"/api/v1/namespaces/{NS}")
