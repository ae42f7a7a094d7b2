"""The kubelet Pods API (KEP-4188, gate `PodsAPI`) of the real 1.36 kubelet, and the exporter
reading pods from it.

- What the kubelet answers: WatchPods streams ADDED for each of its pods, then
  INITIAL_SYNC_COMPLETE with no pod bytes; ListPods and GetPod hold the same pods, each
  `v1.Pod#Marshal()` bytes that proto/podsapi/corev1 decodes to the API server's own name,
  namespace, UID, labels and controller.
- Both sources agree: two exporters on the same node, one reading pods from the Pods API,
  one from the API server's pod watch (`--kubernetes.pods-api-socket ''`), publish the same
  `k8s_pod_workload_info` series for a Deployment, StatefulSet, DaemonSet and bare pod, equal
  to the oracle's; the Pods API one makes no pod list or watch on the API server (only the
  owner reads) and says `source="kubelet-pods-api"`.

Tier: real cluster (the session's 1.36 kubelet, its config with `PodsAPI: true`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from exporter._proto.podsapi.v1alpha1 import api_pb2 as pb
from exporter._proto.podsapi.v1alpha1 import api_pb2_grpc as pb_grpc
from exporter.kubeapi.podsapi import decode_pod
from tests.realcluster import oracle, rbac
from tests.realcluster.api import Api, namespace
from tests.realcluster.controlplane import ControlPlane
from tests.realcluster.daemons import wait_for
from tests.realcluster.exporter import Metrics, on_node
from tests.realcluster.node import ClusterNode
from tests.realcluster.workloads import NS
from tests.realcluster.workloads import objects as workload_objects

pytestmark = pytest.mark.peer

OUR_NS = "kde-podsapi"
INFO = "k8s_pod_workload_info"
SOURCE = "kube_device_exporter_kubernetes_pods_source"
RESTARTS = 3


def objects(node: str) -> list[dict[str, Any]]:
    """test_real_cluster_workloads.py's four workloads, in this file's namespace."""
    text = json.dumps(workload_objects(node)).replace(f'"{NS}"', f'"{OUR_NS}"')
    return list(json.loads(text))


def pods_api_socket(node: ClusterNode) -> Path:
    return node.kubelet.root_dir / "pods-api" / "pods-api.sock"


def node_pods(admin: Api, node: ClusterNode) -> dict[str, dict[str, Any]]:
    items = admin.get("/api/v1/pods", fieldSelector=f"spec.nodeName={node.name}")["items"]
    return {p["metadata"]["uid"]: p for p in items}


def running(admin: Api, node: ClusterNode) -> list[dict[str, Any]]:
    return [p for p in node_pods(admin, node).values()
            if p["metadata"]["namespace"] == OUR_NS and p["status"].get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")]  # fmt: skip


@pytest.fixture(scope="module")
def workloads(control_plane: ControlPlane, cluster_node: ClusterNode) -> Iterator[Api]:
    admin = control_plane.admin()
    namespace(admin, OUR_NS)
    for obj in objects(cluster_node.name):
        admin.apply(obj)
    try:
        wait_for("four workloads running", lambda: len(running(admin, cluster_node)) == 4, 90)
        yield admin
    finally:
        admin.request("DELETE", f"/api/v1/namespaces/{OUR_NS}")
        wait_for("the namespace's pods gone from the node",
                 lambda: not [p for p in node_pods(admin, cluster_node).values()
                              if p["metadata"]["namespace"] == OUR_NS], 60)  # fmt: skip


def test_what_the_kubelet_pods_api_answers(workloads: Api, cluster_node: ClusterNode) -> None:
    socket = pods_api_socket(cluster_node)
    assert socket.exists(), f"no Pods API socket at {socket} (gate PodsAPI on)"
    api_pods = node_pods(workloads, cluster_node)
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = pb_grpc.PodsStub(channel)
        listed = stub.ListPods(pb.ListPodsRequest(), timeout=5).pods
        watch = stub.WatchPods(pb.WatchPodsRequest(), timeout=5)
        events = []
        for event in watch:
            events.append(event)
            if event.type == pb.INITIAL_SYNC_COMPLETE:
                break
        watch.cancel()  # type: ignore[no-untyped-call]
        asked = next(p["metadata"]["uid"] for p in running(workloads, cluster_node))
        got = stub.GetPod(pb.GetPodRequest(podUID=asked), timeout=5).pod
        with pytest.raises(grpc.RpcError) as missing:
            stub.GetPod(pb.GetPodRequest(podUID="no-such-uid"), timeout=5)
    # The stream: ADDED per pod, then the sync marker with no pod.
    assert [e.type for e in events] == [pb.ADDED] * (len(events) - 1) + [pb.INITIAL_SYNC_COMPLETE]
    assert events[-1].pod == b""
    streamed = {decode_pod(e.pod).uid: decode_pod(e.pod) for e in events[:-1]}
    listed_meta = {decode_pod(b).uid: decode_pod(b) for b in listed}
    assert set(streamed) == set(listed_meta) == set(api_pods)
    # Each decodes to the API server's own metadata.
    for uid, meta in listed_meta.items():
        want = api_pods[uid]["metadata"]
        assert (meta.namespace, meta.name) == (want["namespace"], want["name"])
        assert dict(meta.labels) == (want.get("labels") or {})
        ref = oracle.controller(want)
        owner = (meta.owner.kind, meta.owner.name, meta.owner.uid) if meta.owner else None
        assert owner == ((ref["kind"], ref["name"], ref["uid"]) if ref else None)
    assert decode_pod(got).uid == asked
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    assert missing.value.details() == "pod with UID no-such-uid not found"
    print(f"\nPods API: {len(listed)} pods listed, sizes {sorted(len(b) for b in listed)} bytes;"
          f" stream {[pb.EventType.Name(e.type) for e in events]};"
          f" GetPod(unknown) -> {missing.value.code()} {missing.value.details()!r}")  # fmt: skip


@pytest.fixture(scope="module")
def two_exporters(
    workloads: Api, control_plane: ControlPlane, cluster_node: ClusterNode,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Metrics, Metrics]]:  # fmt: skip
    tmp = tmp_path_factory.mktemp("real-podsapi")
    kubeconfig = control_plane.token_kubeconfig(
        tmp / "exporter.kubeconfig", rbac.install_kit(workloads)
    )
    (tmp / "kubelet").mkdir()
    (tmp / "api").mkdir()
    socket = str(pods_api_socket(cluster_node))
    with (
        on_node(tmp / "kubelet", cluster_node.socket, cluster_node.name, kubeconfig,
                "--kubernetes.pod-labels", "team", "--kubernetes.pods-api-socket", socket) as kubelet,
        on_node(tmp / "api", cluster_node.socket, cluster_node.name, kubeconfig,
                "--kubernetes.pod-labels", "team", "--kubernetes.pods-api-socket", "") as api,
    ):  # fmt: skip
        yield kubelet, api


def test_both_sources_publish_the_same_workload_series(
    two_exporters: tuple[Metrics, Metrics], workloads: Api, cluster_node: ClusterNode
) -> None:
    kubelet, api = two_exporters

    def ours(metrics: Metrics) -> set[oracle.Series]:
        return {s for s in metrics.series(INFO) if ("k8s_namespace_name", OUR_NS) in s}

    def expected() -> set[oracle.Series]:
        return {oracle.info(workloads, p, cluster_node.name, ("team",))
                for p in running(workloads, cluster_node)}  # fmt: skip

    wait_for("both exporters name the four workloads as the oracle does",
             lambda: ours(kubelet) == ours(api) == expected() and len(expected()) == 4,
             60, [kubelet.daemon, api.daemon], interval=0.5)  # fmt: skip
    kinds = {dict(s)["k8s_workload_kind"] for s in ours(kubelet)}
    assert kinds == {"Deployment", "StatefulSet", "DaemonSet", "Pod"}
    assert kubelet.value(SOURCE, source="kubelet-pods-api") == 1
    assert api.value(SOURCE, source="kubernetes-api") == 1
    assert kubelet.value("kube_device_exporter_kubernetes_up") == 1

    def requests(metrics: Metrics) -> set[tuple[str, str]]:
        found = metrics.series("kube_device_exporter_kubernetes_requests_total")
        return {(dict(s)["verb"], dict(s)["resource"]) for s in found}

    assert requests(kubelet) <= {("get", "replicasets"), ("get", "jobs")}
    assert ("get", "replicasets") in requests(kubelet)  # the Deployment above the ReplicaSet
    assert {("list", "pods"), ("watch", "pods")} <= requests(api)


def first_sync(socket: Path, deadline: float) -> tuple[float, int]:
    """(seconds until the socket answered, pods ADDED before INITIAL_SYNC_COMPLETE) of the
    first WatchPods that answers."""
    started = time.monotonic()
    while time.monotonic() < started + deadline:
        try:
            with grpc.insecure_channel(f"unix://{socket}") as channel:
                watch = pb_grpc.PodsStub(channel).WatchPods(pb.WatchPodsRequest(), timeout=5)
                for added, event in enumerate(watch):
                    if event.type == pb.INITIAL_SYNC_COMPLETE:
                        watch.cancel()  # type: ignore[no-untyped-call]
                        return time.monotonic() - started, added
        except grpc.RpcError:
            time.sleep(0.05)  # the socket is not served yet; bounded by `deadline`
    raise AssertionError(f"no WatchPods answer at {socket} in {deadline} s")


def test_a_kubelet_restart_costs_the_pods_api_exporter_no_series(
    two_exporters: tuple[Metrics, Metrics], workloads: Api, cluster_node: ClusterNode
) -> None:
    kubelet, api = two_exporters

    def ours(metrics: Metrics = kubelet) -> set[oracle.Series]:
        return {s for s in metrics.series(INFO) if ("k8s_namespace_name", OUR_NS) in s}

    want = ours()
    assert len(want) == 4
    scrapes: list[set[oracle.Series]] = []
    api_scrapes: list[int] = []
    done = threading.Event()

    def scrape() -> None:  # every 0.2 s across the restart, until `done`
        while not done.wait(0.2):
            scrapes.append(ours())
            api_scrapes.append(len(ours(api)))

    scraper = threading.Thread(target=scrape, daemon=True)
    scraper.start()
    try:
        syncs = []
        for restart in range(1, RESTARTS + 1):
            cluster_node.kubelet.stop()
            cluster_node.kubelet.start()
            syncs.append(first_sync(pods_api_socket(cluster_node), 30))
            wait_for("the exporter back on the Pods API",
                     lambda n=restart: logged(kubelet, "answering again") == n, 60,  # type: ignore[misc]
                     [kubelet.daemon], interval=0.2)  # fmt: skip
            time.sleep(2)  # two more cycles of scrapes after the reconnect
    finally:
        done.set()
        scraper.join(5)
    print(f"\nafter each restart, WatchPods first answered (s, pods before "
          f"INITIAL_SYNC_COMPLETE): {[(round(w, 2), n) for w, n in syncs]}; {len(scrapes)} scrapes: {[len(s) for s in scrapes]}, the API "
          f"watch exporter's: {api_scrapes}")  # fmt: skip
    lost = [s for s in scrapes if s != want]
    assert not lost, f"{len(lost)} of {len(scrapes)} scrapes differ: {lost[:2]}"
    # One line when the stream breaks and one when it is back, per restart; no retry floods.
    assert logged(kubelet, "unavailable (") == logged(kubelet, "answering again") == RESTARTS
    assert kubelet.value("kube_device_exporter_kubernetes_up") == 1


def logged(metrics: Metrics, text: str) -> int:
    """Lines of the exporter's Pods API log holding `text`."""
    log = metrics.daemon.tail(100_000).splitlines()
    return sum(text in line for line in log if "exporter.kubeapi.podsapi" in line)
