"""Fresh answers on the real 1.36 kubelet (issue 42): how late a pod's allocation series
follows what PodResources lists, with and without a pod feed.

Three exporters run on the session's node at 2 s cycles with the default 30 s poll interval
(`kube-device-exporter` as the DaemonSet runs it): `pods-api` reads pods from the kubelet's
Pods API, `api-watch` from the API server's pod watch, `none` has no pod feed
(`--kubernetes.api` off; its poll interval is 6 s here, not 30 s, to keep the test short).
While a thread lists PodResources every 50 ms (the kubelet's own truth) and another scrapes
every exporter every 0.2 s, the test

1. creates a pod holding a device and running nothing on it: with a pod feed its allocation
   is on /metrics within 5 s of the create (acceptance), without one at the next poll;
2. deletes a pod holding a device: with a pod feed its series leave within 5 s of the
   kubelet dropping it from List (acceptance);
3. restarts the kubelet with a pod created while it was down: every exporter labels it
   within 2 cycles of List showing it (acceptance), the new socket being the trigger.

The delays are printed (docs/podresources.md quotes them). `FRESH_QUIET_SECONDS=60` adds, 25 s
after the last change, a minute with nothing changing and prints each exporter's List calls
in it: the schedule's own rate, which a pod feed must not raise.
"""

from __future__ import annotations

import os
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
from tests.realcluster.exporter import Metrics, on_node
from tests.realcluster.node import ClusterNode, pod_spec

pytestmark = pytest.mark.peer

NS = "kde-fresh"
CYCLE = 2.0
COMMON = ("--collect-interval", "2s", "--kubernetes.poll-interval", "30s")
FEEDS = {
    "pods-api": ("--kubernetes.pods-api-socket", "{pods_api}"),
    "api-watch": ("--kubernetes.pods-api-socket", ""),
    "none": ("--kubernetes.api", "false", "--kubernetes.poll-interval", "6s"),
}
QUIET = float(os.environ.get("FRESH_QUIET_SECONDS", "0"))
SETTLE = 25.0
"""Before the quiet minute: a started pod's kubelet updates its status once more 11-16 s
later (seen on the 1.36 kubelet), a pod event like any other."""


@dataclass
class Seen:
    """When each (namespace NS) pod's allocation first showed and last went, per watcher."""

    shown: dict[str, dict[str, float]] = field(default_factory=dict)
    gone: dict[str, dict[str, float]] = field(default_factory=dict)
    last: dict[str, set[str]] = field(default_factory=dict)

    def note(self, who: str, pods: set[str], at: float) -> None:
        before = self.last.get(who, set())
        for pod in pods - before:
            self.shown.setdefault(who, {}).setdefault(pod, at)
        for pod in before - pods:
            self.gone.setdefault(who, {})[pod] = at
        self.last[who] = pods


def pod(name: str, node: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {**pod_spec(), "nodeName": node}}  # fmt: skip


def listed(stub: v1_grpc.PodResourcesListerStub) -> set[str]:
    """NS's pods List gives a device."""
    answer = stub.List(v1.ListPodResourcesRequest(), timeout=1)
    return {p.name for p in answer.pod_resources if p.namespace == NS
            and any(d.device_ids for c in p.containers for d in c.devices)}  # fmt: skip


def allocated(metrics: Metrics) -> set[str]:
    return {dict(s)["k8s_pod_name"] for s in metrics.series("hw_allocation_info")
            if dict(s)["k8s_namespace_name"] == NS}  # fmt: skip


def list_calls(metrics: Metrics) -> float:
    return metrics.value("kube_device_exporter_podresources_requests_total", method="List") or 0


@pytest.fixture(scope="module")
def exporters(
    control_plane: ControlPlane, cluster_node: ClusterNode, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Api, dict[str, Metrics]]]:
    admin = control_plane.admin()
    tmp = tmp_path_factory.mktemp("fresh")
    token = rbac.install_kit(admin)
    namespace(admin, NS)
    admin.apply(pod("old", cluster_node.name))
    kubeconfig = control_plane.token_kubeconfig(tmp / "exporter.kubeconfig", token)
    pods_api = str(cluster_node.kubelet.root_dir / "pods-api" / "pods-api.sock")
    try:
        with (
            _exporter(tmp, cluster_node, kubeconfig, "pods-api", pods_api) as a,
            _exporter(tmp, cluster_node, kubeconfig, "api-watch", pods_api) as b,
            _exporter(tmp, cluster_node, kubeconfig, "none", pods_api) as c,
        ):
            running = {"pods-api": a, "api-watch": b, "none": c}
            for metrics in running.values():
                metrics.wait("old's allocation", lambda m: allocated(m) == {"old"}, 60)
            yield admin, running
    finally:
        admin.request("DELETE", f"/api/v1/namespaces/{NS}")


def _exporter(tmp: Path, node: ClusterNode, kubeconfig: Path, feed: str, pods_api: str):  # type: ignore[no-untyped-def]
    (tmp / feed).mkdir()
    flags = [f.format(pods_api=pods_api) for f in FEEDS[feed]]
    return on_node(tmp / feed, node.socket, node.name, kubeconfig, *COMMON, *flags)


def test_pod_events_and_a_new_socket_label_at_once(
    exporters: tuple[Api, dict[str, Metrics]], cluster_node: ClusterNode
) -> None:
    admin, running = exporters
    seen = Seen()
    stop = threading.Event()
    began = time.monotonic()

    def at() -> float:
        return time.monotonic() - began

    def kubelet_truth() -> None:
        channel = grpc.insecure_channel(
            f"unix://{cluster_node.socket}",
            options=[("grpc.initial_reconnect_backoff_ms", 20),
                     ("grpc.max_reconnect_backoff_ms", 100)],
        )  # fmt: skip
        stub = v1_grpc.PodResourcesListerStub(channel)
        while not stop.wait(0.05):
            try:
                seen.note("kubelet", listed(stub), at())
            except grpc.RpcError:
                continue  # the kubelet restarting
        channel.close()

    def scrapes() -> None:
        while not stop.wait(0.2):
            for who, metrics in running.items():
                try:
                    seen.note(who, allocated(metrics), at())
                except OSError:
                    continue

    threads = [threading.Thread(target=f, daemon=True) for f in (kubelet_truth, scrapes)]
    for thread in threads:
        thread.start()
    calls_before = {who: list_calls(m) for who, m in running.items()}
    daemons = [m.daemon for m in running.values()]

    def everyone(
        what: str, done: dict[str, dict[str, float]], pod_name: str, timeout: float
    ) -> None:
        wait_for(what, lambda: all(pod_name in done.get(w, {}) for w in running), timeout,
                 daemons)  # fmt: skip

    try:
        created = at()
        admin.apply(pod("new", cluster_node.name))
        everyone("new labelled everywhere", seen.shown, "new", 20)
        deleted = at()
        admin.request("DELETE", f"/api/v1/namespaces/{NS}/pods/old")
        everyone("old gone everywhere", seen.gone, "old", 30)
        cluster_node.kubelet.stop()
        admin.apply(pod("late", cluster_node.name))
        restarted = at()
        cluster_node.kubelet.start()
        cluster_node.kubelet.wait_ready()
        everyone("late labelled everywhere", seen.shown, "late", 30)
        if QUIET:
            time.sleep(SETTLE)  # the pods' own late status updates, the restart's window
            settled = {who: list_calls(m) for who, m in running.items()}
            time.sleep(QUIET)
            quiet = {w: list_calls(m) - settled[w] for w, m in running.items()}
            print(f"\nList calls in {QUIET:.0f} s with nothing changing: {quiet}")
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
    truth = seen.shown["kubelet"]
    dropped = seen.gone["kubelet"]["old"]
    delays = {
        who: {
            "new (from create)": seen.shown[who]["new"] - created,
            "new (from List)": seen.shown[who]["new"] - truth["new"],
            "deleted (from delete)": seen.gone[who]["old"] - deleted,
            "deleted (from List)": seen.gone[who]["old"] - dropped,
            "restart (from kubelet start)": seen.shown[who]["late"] - restarted,
            "restart (from List)": seen.shown[who]["late"] - truth["late"],
        }
        for who in running
    }
    calls = {who: list_calls(m) - calls_before[who] for who, m in running.items()}
    print(f"\nkubelet: new listed {truth['new'] - created:.2f} s after the create, old dropped "
          f"{dropped - deleted:.2f} s after the delete, late listed "
          f"{truth['late'] - restarted:.2f} s after the kubelet's start")  # fmt: skip
    for who, row in delays.items():
        print(f"{who}: " + ", ".join(f"{k} {v:.2f} s" for k, v in row.items())
              + f"; List calls {calls[who]:.0f} in {at():.0f} s")  # fmt: skip
    for who in ("pods-api", "api-watch"):
        assert delays[who]["new (from create)"] <= 5.0, delays
        assert delays[who]["deleted (from List)"] <= 5.0, delays
    for who in running:
        assert delays[who]["restart (from List)"] <= 2 * CYCLE + 0.3, delays  # a scrape's step
    # Without a pod feed the pod waits for the poll interval (6 s here): the test can fail.
    assert delays["none"]["new (from create)"] > delays["pods-api"]["new (from create)"]
