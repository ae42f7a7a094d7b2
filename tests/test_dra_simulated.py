"""The `dra` scenario end to end: the exporter (`simulate dra`: fake NVML, simulated sysfs, the
simulated kubelet's DRA claims, ResourceSlices/DeviceTaintRules/pods from the loopback API
server) scraped by a real Prometheus that loads the kit's rule file.

Identity comes from the slices' attributes only: GPU 1's DRA name gpu-3 (its minor) is no
NVML index, AMD and Intel devices have no name the sources give; each claim must land on its
device's utilization with the scenario's exact value. Then: the ShareID device with two
holders, free devices per (driver, pool, kind), the driver's NoExecute taint at 20 s and the
Unhealthy `allocatedResourcesStatus`, each making its alert pending in Prometheus.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from simulator.scenario import load_scenario
from tests import kit
from tests.peers import PrometheusServer, scraped_simulation

RULES = Path(__file__).parent.parent / "deploy" / "alerts" / "kube-device-exporter.rules.yaml"
GPU0 = "GPU-d7a0c1e2-0000-4000-8000-000000000000"
GPU2 = "GPU-d7a0c1e2-0000-4000-8000-000000000002"
MIG = "MIG-d7a0c1e2-1111-4000-8000-000000000101"
AMD = "8f3a1c2e5b7d9e02"
INTEL = "0000:4d:00.0"
TAINT_AT = 20.0


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    tmp = tmp_path_factory.mktemp("dra-e2e")
    scenario = load_scenario("dra").path
    assert scenario is not None
    with scraped_simulation(tmp, scenario, rule_files=[RULES]) as run:
        yield run.prometheus


def _by(result: list[dict[str, Any]], *labels: str) -> dict[tuple[str, ...], float]:
    return {
        tuple(r["metric"].get(k, "") for k in labels): round(float(r["value"][1]), 3)
        for r in result
    }


@pytest.mark.peer
def test_free_devices_before_the_taint(prom: PrometheusServer) -> None:
    started: float = prom.started  # type: ignore[attr-defined]
    expected = {
        ("gpu.nvidia.com", "gpu"): 1.0,  # gpu-2 (shareable); gpu-0 held, gpu-3 short of counters
        ("gpu.nvidia.com", "mig/1g.10gb"): 1.0,  # the placement no claim holds
        ("gpu.amd.com", "amdgpu"): 0.0,  # held, and a NoSchedule DeviceTaintRule
        ("gpu.intel.com", "device"): 0.0,  # held
    }
    result = prom.wait_for(
        "hw_dra_free",
        lambda r: _by(r, "hw_allocation_resource", "hw_dra_kind") == expected,
        timeout=15,
    )
    assert time.monotonic() - started < TAINT_AT, "too slow to see the node before the taint"
    assert _by(result, "hw_allocation_resource", "hw_dra_kind") == expected


INTEL_RATE_SLACK = 0.01


@pytest.mark.peer
def test_each_claim_joins_its_device_through_the_slices(prom: PrometheusServer) -> None:
    query = (
        'hw_gpu_utilization_ratio{hw_gpu_task="general"} * on(k8s_node_name, hw_id) '
        'group_left(k8s_pod_name, hw_allocation_device_id) hw_allocation_info{hw_allocation_kind="dra", hw_allocation_shared="false"}'
    )
    expected = {
        ("trainer-0", "gpu-0", GPU0): 0.91,
        ("notebook-a", "gpu-3-mig-19-0-1", MIG): 0.37,
        ("rocm-train", "gpu-1-128", AMD): 0.88,
        ("transcode-0", "0000-4d-00-0-0x56c0", INTEL): 0.64,
    }
    labels = ("k8s_pod_name", "hw_allocation_device_id", "hw_id")

    def joined(r: list[dict[str, Any]]) -> bool:
        return _by(r, *labels) == pytest.approx(expected, abs=INTEL_RATE_SLACK)

    result = prom.wait_for(query, joined, timeout=20)
    # NVML and amdgpu report the scenario's utilization as it is; Intel's is a rate of the
    # engines' busy counters between two reads, which a loaded machine's read timing moves
    # by a little (0.6366 for 0.64 seen under load)
    assert _by(result, *labels) == pytest.approx(expected, abs=INTEL_RATE_SLACK)
    assert {k: v for k, v in _by(result, *labels).items() if k[2] != INTEL} == {
        k: v for k, v in expected.items() if k[2] != INTEL
    }
    assert _by(prom.query("kube_device_exporter_dra_unidentified"), "k8s_node_name") == {
        ("dra-node-1",): 0.0
    }


@pytest.mark.peer
def test_share_id_device_has_two_holders_and_no_copied_labels(prom: PrometheusServer) -> None:
    held = prom.query(f'hw_allocation_info{{hw_id="{GPU2}"}}')
    assert _by(held, "k8s_pod_name", "hw_allocation_replica", "hw_allocation_shared") == {
        ("infer-a", "6f1c0d52-4b1e-4a5c-9d3e-0a1b2c3d4e5f", "true"): 1.0,
        ("infer-b", "8d2e4b17-2c6f-4e8a-b1d0-5f6e7d8c9b0a", "true"): 1.0,
    }
    util = prom.query(f'hw_gpu_utilization_ratio{{hw_id="{GPU2}", hw_gpu_task="general"}}')
    assert len(util) == 1 and "k8s_pod_name" not in util[0]["metric"]
    assert float(util[0]["value"][1]) == 0.64


@pytest.mark.peer
def test_unhealthy_claim_makes_its_alert_pending(prom: PrometheusServer) -> None:
    query = 'ALERTS{alertname="KubeDeviceDraAllocationUnhealthy"}'
    result = prom.wait_for(query, lambda r: len(r) == 1, timeout=20)
    metric = result[0]["metric"]
    assert (metric["k8s_pod_name"], metric["hw_id"], metric["hw_allocation_claim"]) == (
        "transcode-0",
        INTEL,
        "transcode-0-gpu-q9d4m",
    )


@pytest.mark.peer
def test_taints_reach_free_devices_and_their_alert(prom: PrometheusServer) -> None:
    query = 'ALERTS{alertname="KubeDeviceDraPodOnTaintedDevice"}'
    labels = ("hw_allocation_device_id", "hw_id", "hw_dra_taint_key", "hw_dra_taint_effect")
    expected = {
        # the DeviceTaintRule on the held AMD GPU, from the start
        ("gpu-1-128", AMD, "example.com/maintenance", "NoSchedule"): 1.0,
        # NVIDIA's driver taints the shared GPU 2 in its slice at 20 s
        ("gpu-2", GPU2, "gpu.nvidia.com/unhealthy", "NoExecute"): 1.0,
    }
    result = prom.wait_for(query, lambda r: _by(r, *labels) == expected, timeout=TAINT_AT + 20)
    assert _by(result, *labels) == expected
    free = prom.query('hw_dra_free{hw_allocation_resource="gpu.nvidia.com", hw_dra_kind="gpu"}')
    assert float(free[0]["value"][1]) == 0.0  # gpu-2 tainted: no whole GPU left


@pytest.mark.peer
def test_the_dashboards_dra_panels_show_the_node(prom: PrometheusServer) -> None:
    """The devices dashboard's DRA row, its queries as generated, with the node picked."""
    queries = {
        q.panel: q.expr.replace('cluster=~"$cluster"', 'cluster=~".*"')
        for q in kit.panel_queries()
        if q.dashboard == "devices"
    }
    free = queries["Free DRA devices by driver, pool and kind"].replace("$node", "dra-node-1")
    assert _by(prom.query(free), "hw_allocation_resource", "hw_dra_kind") == {
        ("gpu.nvidia.com", "gpu"): 0.0,  # after the taint
        ("gpu.nvidia.com", "mig/1g.10gb"): 1.0,
        ("gpu.amd.com", "amdgpu"): 0.0,
        ("gpu.intel.com", "device"): 0.0,
    }
    by_id = {q.id: q.expr.replace('cluster=~"$cluster"', 'cluster=~".*"').replace(
        "$node", "dra-node-1") for q in kit.panel_queries()}  # fmt: skip
    shares = prom.query(by_id["devices:Shares of shared DRA devices:A"])
    assert sorted(float(r["value"][1]) for r in shares) == [20 * GIB, 30 * GIB]
    left = prom.query(by_id["devices:Shares of shared DRA devices:B"])
    assert [float(r["value"][1]) for r in left] == [30 * GIB]  # of GPU 2's 80Gi
    counters = by_id["devices:DRA pool counters left and stranded:A"]
    assert prom.query(counters), counters  # the pool's counter set, what is left of it
    tainted = queries["Tainted DRA devices"].replace("$node", "dra-node-1")
    assert _by(prom.query(tainted), "hw_allocation_device_id", "hw_dra_taint_source") == {
        ("gpu-1-128", "maintenance-amd"): 1.0,
        ("gpu-2", "slice"): 1.0,
    }


GIB = 2**30


@pytest.mark.peer
def test_claims_give_shares_capacity_left_and_no_admin_holder(prom: PrometheusServer) -> None:
    """What only the ResourceClaims say (the loopback API server serves them by name): the
    two shares of GPU 2 in bytes and what the scheduler can still give of its 80Gi; the
    monitor holding GPU 0 through an admin-access claim is no holder, so GPU 0 keeps
    trainer-0's labels (without the API it has two holders: tests/golden/scenario-dra.prom)."""
    shares = prom.wait_for(
        "hw_dra_allocation_capacity",
        lambda r: len(r) == 2,
        timeout=20,
    )
    assert _by(shares, "k8s_pod_name", "hw_allocation_replica", "hw_id", "hw_dra_capacity") == {
        ("infer-a", "6f1c0d52-4b1e-4a5c-9d3e-0a1b2c3d4e5f", GPU2, "memory"): 20 * GIB,
        ("infer-b", "8d2e4b17-2c6f-4e8a-b1d0-5f6e7d8c9b0a", GPU2, "memory"): 30 * GIB,
    }
    free = prom.query('hw_dra_device_capacity_free{hw_allocation_device_id="gpu-2"}')
    assert _by(free, "hw_id", "hw_dra_capacity") == {(GPU2, "memory"): 30 * GIB}
    held = prom.query(f'hw_allocation_info{{hw_id="{GPU0}"}}')
    assert _by(held, "k8s_pod_name", "hw_allocation_shared") == {("trainer-0", "false"): 1.0}
    admin = prom.query("hw_dra_admin_access_info")
    assert _by(admin, "k8s_pod_name", "k8s_container_name", "hw_allocation_claim", "hw_id") == {
        ("dcgm-0", "dcgm", "gpu-monitoring/dcgm-0-gpus-m4x8q", GPU0): 1.0
    }
    util = prom.query(f'hw_gpu_utilization_ratio{{hw_id="{GPU0}", hw_gpu_task="general"}}')
    assert [r["metric"].get("k8s_pod_name") for r in util] == ["trainer-0"]
    assert _by(prom.query("kube_device_exporter_dra_claims_up"), "k8s_node_name") == {
        ("dra-node-1",): 1.0
    }
