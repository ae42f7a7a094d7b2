"""DRA identity against the real Kubernetes 1.36 API server: ResourceSlices shaped as NVIDIA's,
AMD's and Intel's DRA drivers publish them (the `dra` scenario's, simulator/scenarios/
dra.yaml, with their sources cited there) are created through the real API server; the
exporter, under the kit's RBAC with the dra component and a TokenRequest token, watches them
(`fieldSelector=spec.nodeName`) and joins each claim the simulated kubelet lists to its
device by the slices' attributes.

The real API server validates and stores the slices (defaulting, a taint's `timeAdded`), the
real authorizer checks the watch, and a slice changed or deleted reaches the exporter through
the real watch. The driver side (a DRA driver of the tests' own, the kubelet's prepare and
health stream) is not here: PodResources is the simulated kubelet's.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator.scenario import load_scenario
from tests.realcluster import rbac
from tests.realcluster.api import Api
from tests.realcluster.controlplane import ControlPlane
from tests.realcluster.exporter import Metrics, simulated_node

pytestmark = pytest.mark.peer

NODE = "dra-node-1"
"""The dra scenario's node (and its pools' name)."""
OTHER = "dra-node-2"
GPU0 = "GPU-d7a0c1e2-0000-4000-8000-000000000000"
GPU1 = "GPU-d7a0c1e2-0000-4000-8000-000000000001"
GPU2 = "GPU-d7a0c1e2-0000-4000-8000-000000000002"
MIG = "MIG-d7a0c1e2-1111-4000-8000-000000000101"
AMD = "8f3a1c2e5b7d9e02"
INTEL = "0000:4d:00.0"


@dataclass
class Setup:
    admin: Api
    kubeconfig: Path
    scenario: Path
    slices: list[dict[str, Any]]
    tmp: Path


def _slices(doc: dict[str, Any], node: str) -> list[dict[str, Any]]:
    out = []
    for i, spec in enumerate(doc["dra"]["slices"]):
        spec = copy.deepcopy(spec) | {"nodeName": node}
        name = f"{node}-{spec['driver']}-{i}".replace(".", "-")
        out.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                    "metadata": {"name": name}, "spec": spec})  # fmt: skip
    return out


@pytest.fixture(scope="module")
def setup(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    admin = control_plane.admin()
    tmp = tmp_path_factory.mktemp("dra")
    token = rbac.install_kit(admin, dra=True)
    path = load_scenario("dra").path
    assert path is not None
    doc = yaml.safe_load(path.read_text())
    slices = _slices(doc, NODE)
    # Another node's slice of the same driver: the field selector must keep it out.
    other = _slices(doc, OTHER)[3]
    for obj in [*slices, other]:
        admin.apply(obj)
    # The node part only: PodResources, NVML and sysfs; the slices come from the real server.
    node_doc = {k: v for k, v in doc.items() if k != "dra"}
    scenario = tmp / "dra-real.yaml"
    scenario.write_text(yaml.safe_dump(node_doc))
    kubeconfig = control_plane.token_kubeconfig(tmp / "exporter.kubeconfig", token)
    yield Setup(admin, kubeconfig, scenario, slices, tmp)
    for obj in [*slices, other]:
        admin.delete(obj)


def _by_pod(metrics: Metrics) -> dict[str, str]:
    return {
        dict(s)["k8s_pod_name"]: dict(s).get("hw_id", "")
        for s in metrics.series("hw_allocation_info")
    }


def test_identity_taints_and_free_devices_from_real_slices(setup: Setup) -> None:
    stored = setup.admin.get(
        f"/apis/resource.k8s.io/v1/resourceslices/{setup.slices[1]['metadata']['name']}"
    )
    assert [d["name"] for d in stored["spec"]["devices"]] == [
        "gpu-0", "gpu-3", "gpu-3-mig-19-0-1", "gpu-3-mig-19-1-1", "gpu-2"]  # fmt: skip
    with simulated_node(setup.tmp, setup.scenario, setup.kubeconfig, "--kubernetes.dra") as metrics:
        # The scenario's claims are not in the real API server (404): each is joined as
        # PodResources lists it, the monitor's admin-access claim too (it is read nowhere).
        expected = {"trainer-0": GPU0, "notebook-a": MIG, "infer-a": GPU2, "infer-b": GPU2,
                    "rocm-train": AMD, "transcode-0": INTEL, "dcgm-0": GPU0}  # fmt: skip
        metrics.wait("every claim joined", lambda m: _by_pod(m) == expected)
        assert metrics.value("kube_device_exporter_dra_unidentified") == 0
        assert metrics.value("kube_device_exporter_dra_slices_up") == 1
        # Only this node's devices: the other node's AMD slice is not watched.
        info = {dict(s)["hw_allocation_device_id"]: dict(s)["hw_id"]
                for s in metrics.series("hw_dra_device_info")}  # fmt: skip
        assert info == {"gpu-0": GPU0, "gpu-3": GPU1, "gpu-3-mig-19-0-1": MIG,
                        "gpu-3-mig-19-1-1": "", "gpu-2": GPU2, "gpu-1-128": AMD,
                        "0000-4d-00-0-0x56c0": INTEL}  # fmt: skip
        free = {(dict(s)["hw_allocation_resource"], dict(s)["hw_dra_kind"]): v
                for s, v in metrics.series("hw_dra_free").items()}  # fmt: skip
        assert free == {("gpu.nvidia.com", "gpu"): 1, ("gpu.nvidia.com", "mig/1g.10gb"): 1,
                        ("gpu.amd.com", "amdgpu"): 0, ("gpu.intel.com", "device"): 0}  # fmt: skip
        assert metrics.series("hw_dra_device_taint") == {}
        # The driver taints GPU 2 in its slice: the real watch brings it.
        tainted = copy.deepcopy(setup.slices[1])
        gpu2 = next(d for d in tainted["spec"]["devices"] if d["name"] == "gpu-2")
        gpu2["taints"] = [
            {"key": "gpu.nvidia.com/unhealthy", "value": "xid-79", "effect": "NoExecute"}
        ]
        setup.admin.apply(tainted)
        metrics.wait("the taint", lambda m: len(m.series("hw_dra_device_taint")) == 1)
        (labels,) = metrics.series("hw_dra_device_taint")
        got = dict(labels)
        assert (got["hw_allocation_device_id"], got["hw_id"], got["hw_dra_taint_key"],
                got["hw_dra_taint_value"], got["hw_dra_taint_effect"], got["hw_dra_taint_source"]) == (
            "gpu-2", GPU2, "gpu.nvidia.com/unhealthy", "xid-79", "NoExecute", "slice")  # fmt: skip
        metrics.wait("no whole GPU free",
                     lambda m: m.value("hw_dra_free", hw_dra_kind="gpu") == 0)  # fmt: skip
        # The AMD slice deleted (its driver gone, or the kubelet's restart wipe): its claim
        # falls back to the name-only join, which cannot name it, and says so.
        setup.admin.delete(setup.slices[2])
        metrics.wait("AMD unidentified",
                     lambda m: m.value("kube_device_exporter_dra_unidentified") == 1)  # fmt: skip
        assert _by_pod(metrics)["rocm-train"] == ""
        requests = {(dict(s)["verb"], dict(s)["resource"], dict(s)["code"])
                    for s in metrics.series("kube_device_exporter_kubernetes_requests_total")}  # fmt: skip
        # The session's plane serves DeviceTaintRule (tests/realcluster/controlplane.py
        # FEATURE_GATES; a default 1.36 API server answers 404, control-plane.md DRA 8, which
        # test_slicewatch.py holds the exporter to); a claim not in the API is a 404.
        assert {("list", "resourceslices", "200"), ("watch", "resourceslices", "200"),
                ("list", "devicetaintrules", "200"), ("get", "resourceclaims", "404")} <= requests  # fmt: skip
        log = metrics.daemon.log.read_text()
        assert "gpu.amd.com/dra-node-1/gpu-1-128" in log
