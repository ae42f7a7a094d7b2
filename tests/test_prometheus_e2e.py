"""A real Prometheus scrapes the real exporter process running the simulated demo node.

PromQL then checks pod attribution for each sharing mode: an exclusive GPU, a MIG slice,
a time-sliced GPU (allocation series, values never copied per pod), a free GPU, and a pod
deleted mid-run with its process (its series are gone after the kubelet poll the process's
end asks for, or the one 5 s later, and a cycle).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from simulator.scenario import load_scenario
from tests.peers import PrometheusServer, scraped_simulation

GPU = "GPU-6a3f1c2e-1b7d-4c1e-9a55-00000000000{}"
MIG = "MIG-0b6f4a21-7d3c-5e2a-8f10-00000000010{}"
DELETED_AT = 12.0
POLL_EVERY = 5.0
"""A device's processes changing makes the exporter ask the kubelet at once, and again this
much later (exporter/podresources/schedule.py SOONEST)."""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    tmp = tmp_path_factory.mktemp("e2e")
    # The bundled demo, with the short job ending a few seconds into the run.
    demo = load_scenario("demo")
    assert demo.path is not None
    doc = yaml.safe_load(demo.path.read_text())
    (short,) = [p for p in doc["pods"] if p["name"] == "short-job"]
    short["end"] = DELETED_AT
    (pid,) = short["containers"][0]["pids"]
    (process,) = [
        proc
        for gpu in doc["nvidia"]["gpus"]
        for mig in gpu.get("mig", [])
        for proc in mig.get("processes", [])
        if proc["pid"] == pid
    ]
    process["end"] = DELETED_AT  # deleting a pod stops its processes
    scenario = tmp / "demo-short.yaml"
    scenario.write_text(yaml.safe_dump(doc))

    with scraped_simulation(tmp, scenario) as run:
        yield run.prometheus


def labels(result: list[dict[str, Any]]) -> list[dict[str, str]]:
    return sorted((r["metric"] for r in result), key=lambda m: sorted(m.items()))


def pods(result: list[dict[str, Any]]) -> set[str]:
    return {r["metric"].get("k8s_pod_name", "") for r in result}


def util(hw_id: str) -> str:
    return f'hw_gpu_utilization_ratio{{hw_id="{hw_id}",hw_gpu_task="general"}}'


@pytest.mark.peer
def test_deleted_pod_disappears_within_a_kubelet_poll_and_a_cycle(stack: PrometheusServer) -> None:
    # Order-free: whenever this runs, wait until the deletion is a poll and a few cycles old, then
    # read the pod's history from Prometheus (its TSDB kept what was scraped before).
    mig2 = MIG.format(2)
    started: float = stack.started  # type: ignore[attr-defined]
    wait = started + DELETED_AT + POLL_EVERY + 4 - time.monotonic()
    if wait > 0:
        time.sleep(wait)
    now = time.time()
    deleted = now - (time.monotonic() - started - DELETED_AT)
    history = stack.api(
        "query_range",
        query='hw_allocation_info{k8s_pod_name="short-job"}',
        start=str(now - (time.monotonic() - started)),
        end=str(now),
        step="1",
    )["result"]
    stamps = [float(t) for series in history for t, _ in series["values"]]
    assert stamps, "the pod was never seen while it existed"
    assert min(stamps) < deleted - 2, "seen only around its deletion"
    # gone within the poll its process's end asks for (or the one 5 s later), a collect
    # cycle (1 s) and a scrape (1 s) of the deletion, plus slack
    limit = POLL_EVERY + 2.5
    assert max(stamps) <= deleted + limit, f"still there {max(stamps) - deleted:.1f}s after"
    assert stack.query('hw_allocation_info{k8s_pod_name="short-job"}') == []
    (now_series,) = stack.query(f'hw_gpu_memory_usage_bytes{{hw_id="{mig2}"}}')
    assert "k8s_pod_name" not in now_series["metric"]
    assert now_series["metric"]["hw_id"] == mig2


@pytest.mark.peer
def test_exclusive_gpu_is_labelled_with_its_pod(stack: PrometheusServer) -> None:
    gpu0 = GPU.format(0)
    (series,) = labels(stack.wait_for(util(gpu0)))
    assert series["k8s_pod_name"] == "trainer-0"
    assert series["k8s_namespace_name"] == "ml-team"
    assert series["k8s_container_name"] == "pytorch"
    assert series["k8s_node_name"] == "demo-node-1"
    assert series["job"] == "kube-device-exporter"  # target labels untouched, no exported_*
    (memory,) = stack.wait_for(f'hw_gpu_memory_usage_bytes{{hw_id="{gpu0}"}}')
    assert memory["metric"]["k8s_pod_name"] == "trainer-0"
    assert float(memory["value"][1]) > 0


@pytest.mark.peer
def test_mig_slice_is_labelled_with_its_pod(stack: PrometheusServer) -> None:
    (series,) = stack.wait_for(f'hw_gpu_memory_usage_bytes{{hw_id="{MIG.format(1)}"}}')
    assert series["metric"]["k8s_pod_name"] == "notebook-alice"
    assert series["metric"]["hw_parent"] == GPU.format(1)
    assert "hw_gpu_mig_profile" not in series["metric"]  # vendor identity is on hw_info
    (info,) = stack.wait_for(f'hw_info{{hw_id="{MIG.format(1)}"}}')
    assert info["metric"]["hw_gpu_mig_profile"] == "1g.10gb"
    (big,) = stack.wait_for(f'hw_gpu_memory_usage_bytes{{hw_id="{MIG.format(4)}"}}')
    assert big["metric"]["k8s_pod_name"] == "inference-small"
    # The MIG parent itself belongs to nobody.
    parent = stack.wait_for(f'hw_gpu_memory_limit_bytes{{hw_id="{GPU.format(1)}"}}')
    assert pods(parent) == {""}


@pytest.mark.peer
def test_time_sliced_gpu_values_are_not_copied_per_pod(stack: PrometheusServer) -> None:
    gpu2 = GPU.format(2)
    (series,) = stack.wait_for(util(gpu2))  # one series, not one per sharing pod
    assert "k8s_pod_name" not in series["metric"]
    allocations = stack.wait_for(f'hw_allocation_info{{hw_id="{gpu2}"}}', lambda r: len(r) == 2)
    assert pods(allocations) == {"batch-a", "batch-b"}
    assert {r["metric"]["hw_allocation_shared"] for r in allocations} == {"true"}
    assert {r["metric"]["hw_allocation_replica"] for r in allocations} == {"0", "1"}
    # The documented PromQL join gives each sharing pod the device's value, marked shared.
    joined = stack.wait_for(
        f"{util(gpu2)} * on(k8s_node_name, hw_id) group_right hw_allocation_info",
        lambda r: len(r) == 2,
    )
    assert pods(joined) == {"batch-a", "batch-b"}


@pytest.mark.peer
def test_unallocated_gpu_has_no_pod(stack: PrometheusServer) -> None:
    gpu3 = GPU.format(3)
    (series,) = stack.wait_for(util(gpu3))
    assert "k8s_pod_name" not in series["metric"]
    assert stack.query(f'hw_allocation_info{{hw_id="{gpu3}"}}') == []
    free = stack.wait_for('hw_allocatable_devices{hw_allocation_resource="nvidia.com/gpu"}')
    assert float(free[0]["value"][1]) == 2
