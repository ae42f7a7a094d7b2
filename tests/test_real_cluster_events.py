"""--kubernetes.events under the real API server and authorizer (Kubernetes 1.36).

The identity is applied exactly as the kit (deploy/base + components/kubernetes-events) and
the chart (`kubernetesEvents.enabled`) render it; the exporter's own poster
(exporter/sinks/k8sevents.py) creates the Event about a real Pod with a TokenRequest token. The
real apiserver's validation accepts the Event, `kubectl describe pod`'s query
(`fieldSelector=involvedObject.name=...,involvedObject.uid=...`) finds it, the rules review
grants exactly `create` on events beyond what every identity may do, and an identity
without the binding is refused (counted `failed`).

The control plane is the session's: what this module adds (the events roles and bindings,
its namespaces and Pod) is removed after it, so the RBAC and exporter tests that follow see
the cluster as they expect (the kit's ServiceAccount is shared and stays).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from exporter.derive.devicecodes import xid_code
from exporter.derive.events import DeviceEvent
from exporter.kubeapi.client import http_client, load_config
from exporter.model import Device, Holder
from exporter.sinks.k8sevents import KubeEventPoster, event_object
from tests import kustomize
from tests.realcluster import rbac
from tests.realcluster.api import namespace, path_of
from tests.realcluster.controlplane import ControlPlane

pytestmark = pytest.mark.peer

WORK_NS = "kde-events"
KIT_NS = "kube-device-exporter"
CHART_NS = "kde-events-chart"
GPU = "GPU-5e1f0a2b-7c3d-4e5f-8a9b-0000000000aa"


def _kit() -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="kde-kit-") as tmp:
        mine = Path(tmp)
        (mine / "kustomization.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": [os.path.relpath(rbac.DEPLOY / "base", mine)],
            "components": [os.path.relpath(rbac.DEPLOY / "components" / "kubernetes-events", mine)],
        }))  # fmt: skip
        return kustomize.build(mine)


def _chart() -> list[dict[str, Any]]:
    with helm.Chart.load(rbac.CHART) as chart:
        out = chart.render({"kubernetesEvents": {"enabled": True}}, name=CHART_NS,
                           namespace=CHART_NS, is_install=True)  # fmt: skip
    return [d for p, t in sorted(out.items()) if p.endswith(".yaml")
            for d in yaml.safe_load_all(t) if d]  # fmt: skip


class Setup:
    def __init__(self, plane: ControlPlane, tmp: Path) -> None:
        self.plane, self.tmp = plane, tmp
        admin = self.admin = plane.admin()
        kit = rbac.identity(_kit())
        for obj in kit:
            admin.apply(obj)
        admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": CHART_NS}})
        chart = rbac.identity(_chart())
        for obj in chart:
            admin.apply(obj)
        roles = ("ClusterRole", "ClusterRoleBinding")
        self.added = [o for o in (*kit, *chart) if o["kind"] in roles]
        namespace(admin, WORK_NS)
        admin.apply({"apiVersion": "v1", "kind": "ServiceAccount",
                     "metadata": {"name": "baseline", "namespace": WORK_NS}})  # fmt: skip
        self.pod = admin.create({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "trainer-a", "namespace": WORK_NS},
            # bound to no real node: no scheduler or kubelet of the session acts on it
            "spec": {"nodeName": "kde-events-nowhere",
                     "containers": [{"name": "pytorch", "image": "busybox"}]},
        })  # fmt: skip
        (chart_sa,) = [o["metadata"]["name"] for o in chart if o["kind"] == "ServiceAccount"]
        self.identities = {
            "kit": admin.as_token(rbac.token(admin, KIT_NS, "kube-device-exporter")),
            "chart": admin.as_token(rbac.token(admin, CHART_NS, chart_sa)),
            "baseline": admin.as_token(rbac.token(admin, WORK_NS, "baseline")),
        }

    def post(self, who: str) -> KubeEventPoster:
        """One Event about the Pod through the exporter's poster as `who`."""
        api = self.identities[who]
        assert api.token is not None
        kubeconfig = self.plane.token_kubeconfig(self.tmp / f"{who}.kubeconfig", api.token)
        device = Device(GPU, "gpu", "nvidia", "NVIDIA H100 80GB HBM3", "nvml")
        holder = Holder(WORK_NS, "trainer-a", "pytorch")
        uid = self.pod["metadata"]["uid"]
        event = DeviceEvent(device, "xid.79", xid_code(79), 1, (holder,),
                            ((WORK_NS, "trainer-a", uid),), 0.0, 79)  # fmt: skip
        obj = event_object(event, pod=(WORK_NS, "trainer-a"), containers=["pytorch"], uid=uid,
                           node="kde-rc-node", now=datetime.now(UTC))  # fmt: skip
        obj["metadata"]["name"] += f"-{who}"  # one per identity, same second

        async def run() -> KubeEventPoster:
            poster = KubeEventPoster(http_client(load_config(kubeconfig), 10.0), "kde-rc-node")
            try:
                await poster.post(obj)
            finally:
                await poster.client.aclose()
            return poster

        return asyncio.run(run())

    def remove(self) -> None:
        self.admin.request("DELETE", path_of(self.pod), {"gracePeriodSeconds": 0})
        for obj in self.added:
            self.admin.delete(obj)
        for name in (WORK_NS, CHART_NS):
            self.admin.delete({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


@pytest.fixture(scope="module")
def setup(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    made = Setup(control_plane, tmp_path_factory.mktemp("events"))
    try:
        yield made
    finally:
        made.remove()


def _results(poster: KubeEventPoster) -> dict[str, float]:
    return {dict(s.attributes)["result"]: s.value for s in poster.self_samples()}


@pytest.mark.parametrize("who", ["kit", "chart"])
def test_the_event_is_created_and_describe_finds_it(setup: Setup, who: str) -> None:
    assert _results(setup.post(who)) == {"created": 1.0}
    uid = setup.pod["metadata"]["uid"]
    found = setup.admin.get(
        f"/api/v1/namespaces/{WORK_NS}/events",
        fieldSelector=f"involvedObject.name=trainer-a,involvedObject.uid={uid}",
    )["items"]
    (event,) = [e for e in found if e["metadata"]["name"].endswith(f"-{who}")]
    assert event["reason"] == "DeviceXID"
    assert event["type"] == "Warning"
    assert event["involvedObject"]["kind"] == "Pod"
    assert event["source"] == {"component": "kube-device-exporter", "host": "kde-rc-node"}
    assert event["reportingComponent"] == "kube-device-exporter"
    assert "GPU has fallen off the bus" in event["message"]


@pytest.mark.parametrize("who", ["kit", "chart"])
def test_it_may_create_events_and_nothing_else(setup: Setup, who: str) -> None:
    base, base_urls, _ = rbac.granted(setup.identities["baseline"], WORK_NS)
    rules, urls, incomplete = rbac.granted(setup.identities[who], WORK_NS)
    assert not incomplete
    assert rules - base == {("", "events", "create")}
    assert urls == base_urls
    for verb in ("get", "list", "watch", "update", "patch", "delete"):
        assert not rbac.allowed(setup.identities[who], verb, "events", namespace=WORK_NS), verb


def test_without_the_binding_it_is_refused_and_counted(setup: Setup) -> None:
    assert _results(setup.post("baseline")) == {"failed": 1.0}
