"""Kubelet restarts on the real 1.36 kubelet (docs/testing.md; issue 34,
item 7): List answers successfully with no pods for about a second after a restart, while
the pods run on; and whether an exporter scraped across restarts keeps the running pods'
allocations (it does: the exporter holds them through the window).

Tier: real cluster (the session's 1.36 kubelet, restarted here; its pods keep running).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from exporter._proto.podresources.v1 import api_pb2 as v1
from exporter._proto.podresources.v1 import api_pb2_grpc as v1_grpc
from tests.realcluster import rbac
from tests.realcluster.api import Api, namespace
from tests.realcluster.controlplane import ControlPlane
from tests.realcluster.daemons import wait_for
from tests.realcluster.exporter import on_node
from tests.realcluster.node import ClusterNode, pod_spec

pytestmark = pytest.mark.peer

NS = "kde-restart"
PODS = ("hold-a", "hold-b")
RESTARTS = 3


@dataclass
class Held:
    admin: Api
    node: ClusterNode
    kubeconfig: Path
    tmp: Path
    devices: dict[str, set[str]] = field(default_factory=dict)
    """pod -> the device IDs List gave it before any restart."""


def listed(stub: v1_grpc.PodResourcesListerStub) -> dict[str, set[str]]:
    """Pods of NS in List -> their device IDs (raises grpc.RpcError while down)."""
    answer = stub.List(v1.ListPodResourcesRequest(), timeout=1)
    return {
        p.name: {i for c in p.containers for d in c.devices for i in d.device_ids}
        for p in answer.pod_resources
        if p.namespace == NS
    }


@pytest.fixture(scope="module")
def held(
    control_plane: ControlPlane, cluster_node: ClusterNode, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Held]:
    admin = control_plane.admin()
    tmp = tmp_path_factory.mktemp("restart")
    token = rbac.install_kit(admin)
    namespace(admin, NS)
    for name in PODS:
        admin.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
                     "spec": {**pod_spec(), "nodeName": cluster_node.name}})  # fmt: skip
    kubeconfig = control_plane.token_kubeconfig(tmp / "exporter.kubeconfig", token)
    made = Held(admin, cluster_node, kubeconfig, tmp)
    with grpc.insecure_channel(f"unix://{cluster_node.socket}") as channel:
        stub = v1_grpc.PodResourcesListerStub(channel)
        wait_for("both pods holding a device", lambda: all(listed(stub).get(p) for p in PODS), 60)
        made.devices = listed(stub)
    try:
        yield made
    finally:
        admin.request("DELETE", f"/api/v1/namespaces/{NS}")


def containers(held: Held) -> dict[str, tuple[str, int]]:
    """pod -> (its container's ID, restart count), once the kubelet reports them Ready."""
    out: dict[str, tuple[str, int]] = {}

    def reported() -> bool:
        for name in PODS:
            pod = held.admin.get(f"/api/v1/namespaces/{NS}/pods/{name}")
            statuses = pod["status"].get("containerStatuses") or []
            if not (statuses and statuses[0].get("ready") and statuses[0].get("containerID")):
                return False
            out[name] = (statuses[0]["containerID"], statuses[0]["restartCount"])
        return True

    wait_for("the pods' container statuses", reported, 60)
    return out


def restart(node: ClusterNode) -> float:
    """Stop the kubelet (SIGTERM, by PID) and start it again; the monotonic start time."""
    node.kubelet.stop()
    started = time.monotonic()
    node.kubelet.start()
    return started


def test_list_answers_no_pods_for_a_while_after_a_restart(held: Held) -> None:
    """Observed: after each restart, List first answers successfully with none of the
    running pods, then with them and their devices (checkpoint), no prepare needed."""
    channel = grpc.insecure_channel(
        f"unix://{held.node.socket}",
        options=[("grpc.initial_reconnect_backoff_ms", 10), ("grpc.min_reconnect_backoff_ms", 10),
                 ("grpc.max_reconnect_backoff_ms", 50)],
    )  # fmt: skip
    stub = v1_grpc.PodResourcesListerStub(channel)
    before = containers(held)
    windows = []
    try:
        for _ in range(RESTARTS):
            started = restart(held.node)
            first_empty = back = None
            deadline = started + 30
            while time.monotonic() < deadline:
                now = time.monotonic() - started
                try:
                    pods = listed(stub)
                except grpc.RpcError:
                    time.sleep(0.02)
                    continue
                if pods == held.devices:
                    back = now
                    break
                if first_empty is None and not pods:
                    first_empty = now
                time.sleep(0.02)
            assert back is not None, "the pods never came back in List"
            windows.append((first_empty, back))
            held.node.kubelet.wait_ready()
    finally:
        channel.close()
    print(f"List after restart (s since start: first empty answer, pods back): {windows}")
    # An empty answer came on every restart, and the pods came back within seconds.
    assert all(empty is not None for empty, _ in windows), windows
    assert all(b - e < 5 for e, b in windows if e is not None), windows
    # The pods ran throughout: once the kubelet has reported their status again (right
    # after a restart it rewrites it, for a moment without containerStatuses), the same
    # containers, never restarted.
    assert containers(held) == before, json.dumps(before)


def test_no_scrape_across_kubelet_restarts_loses_a_running_pods_allocations(held: Held) -> None:
    """The exporter at a 1 s cycle, scraped every 0.2 s across kubelet restarts: every scrape
    must show each running pod's devices. Before the exporter held allocations through the
    restart window (exporter/podresources/settle.py), 18 of 30 scrapes here lost them."""
    want = {(pod, dev) for pod, devs in held.devices.items() for dev in devs}
    scrapes: list[set[tuple[str, str]]] = []
    with on_node(held.tmp, held.node.socket, held.node.name, held.kubeconfig) as metrics:

        def allocations() -> set[tuple[str, str]]:
            return {
                (dict(s)["k8s_pod_name"], dict(s)["hw_allocation_device_id"])
                for s in metrics.series("hw_allocation_info")
                if dict(s)["k8s_namespace_name"] == NS
            }

        metrics.wait("the pods' allocations", lambda m: allocations() == want)
        stop = threading.Event()

        def scrape() -> None:
            while not stop.wait(0.2):
                scrapes.append(allocations())

        scraper = threading.Thread(target=scrape, daemon=True)
        scraper.start()
        try:
            for _ in range(RESTARTS):
                restart(held.node)
                held.node.kubelet.wait_ready()
                metrics.wait("the allocations after the restart", lambda m: allocations() == want)
                time.sleep(1)
        finally:
            stop.set()
            scraper.join(timeout=5)
    lost = [s for s in scrapes if s != want]
    print(f"{len(lost)} of {len(scrapes)} scrapes lost allocations across {RESTARTS} restarts")
    assert scrapes and not lost, f"{len(lost)} of {len(scrapes)} scrapes: {lost[:3]}"
