"""A real Prometheus scrapes the exporter running with `--kubernetes.api` against a Kubernetes
API server on loopback: GPU utilization summed by Deployment (and by workload) through the
`k8s_pod_workload_info` join comes out right, and a pod deleted mid-run leaves the join.

The demo node with constant utilizations: trainer-0 (GPU 0, 0.8) of Deployment `train`;
inference-small (MIG 3g, 0.4) and inference-large (MIG 1g, 0.02) of Deployment `inference`;
short-job (MIG 1g, 0.9) of CronJob `nightly`, ending a few seconds in.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from simulator.apiserver import ApiServer
from simulator.scenario import load_scenario
from tests.peers import PrometheusServer, scraped_simulation
from tests.support.kubeapi import owner_object, pod, put_owner

NODE = "demo-node-1"
ENDS_AT = 20.0
JOIN = "on(k8s_node_name, k8s_namespace_name, k8s_pod_name)"
UTIL = 'hw_gpu_utilization_ratio{hw_gpu_task="general"}'


def _scenario(tmp: Any) -> Any:
    demo = load_scenario("demo")
    assert demo.path is not None
    doc = yaml.safe_load(demo.path.read_text())
    by_name = {p["name"]: p for p in doc["pods"]}
    by_name["notebook-alice"].update(name="inference-large", namespace="serving")
    by_name["short-job"]["end"] = ENDS_AT
    mig103 = "MIG-0b6f4a21-7d3c-5e2a-8f10-000000000103"
    doc["pods"].append({"name": "late-0", "namespace": "serving", "start": 5,
                        "containers": [{"name": "triton", "devices": [
                            {"resource": "nvidia.com/mig-1g.10gb", "ids": [mig103]}]}]})  # fmt: skip
    gpus = doc["nvidia"]["gpus"]
    gpus[0]["utilization"] = 0.8
    mig = {m["uuid"][-3:]: m for m in gpus[1]["mig"]}
    mig["104"]["utilization"] = 0.4
    mig["102"]["processes"][0]["end"] = ENDS_AT
    path = tmp / "demo-kubeapi.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _api() -> ApiServer:
    api = ApiServer().start()
    put_owner(
        api,
        owner_object("ReplicaSet", "train-5d", "rs-t", "ml-team", ("Deployment", "train", "d-t")),
    )
    put_owner(api, owner_object("ReplicaSet", "inference-7c", "rs-i", "serving",
                                ("Deployment", "inference", "d-i")))  # fmt: skip
    put_owner(
        api, owner_object("Job", "nightly-29", "job-n", "batch", ("CronJob", "nightly", "cj-n"))
    )
    api.put("pods", pod("trainer-0", "ml-team", node=NODE, labels={"team": "vision"},
                        owner=("ReplicaSet", "train-5d", "rs-t")))  # fmt: skip
    for name in ("inference-small", "inference-large"):
        api.put("pods", pod(name, "serving", node=NODE, labels={"team": "serving", "secret": "x"},
                            owner=("ReplicaSet", "inference-7c", "rs-i")))  # fmt: skip
    api.put("pods", pod("short-job", "batch", node=NODE, owner=("Job", "nightly-29", "job-n")))
    for name in ("batch-a", "batch-b"):
        api.put("pods", pod(name, "batch", node=NODE))
    return api


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[PrometheusServer, ApiServer]]:
    tmp = tmp_path_factory.mktemp("kubeapi-e2e")
    scenario = _scenario(tmp)
    api = _api()
    kubeconfig = str(api.kubeconfig(tmp / "kubeconfig"))
    api_flags = ("--kubernetes.api", "--kubernetes.kubeconfig", kubeconfig)
    try:
        with scraped_simulation(
            tmp, scenario, *api_flags, "--kubernetes.pod-labels", "team"
        ) as run:
            yield run.prometheus, api
    finally:
        api.stop()
    # With a watch open on the API server, SIGTERM still ends the process in its budget.
    assert run.stop_seconds < 10, f"the exporter took {run.stop_seconds:.1f}s to stop"


def _values(result: list[dict[str, Any]], *labels: str) -> dict[tuple[str, ...], float]:
    return {
        tuple(r["metric"].get(k, "") for k in labels): round(float(r["value"][1]), 3)
        for r in result
    }


@pytest.mark.peer
def test_cronjob_workload_leaves_when_its_pod_does(
    stack: tuple[PrometheusServer, ApiServer],
) -> None:
    prom, api = stack
    query = f"sum by (k8s_workload_kind, k8s_workload_name) ({UTIL} * {JOIN} group_left(k8s_workload_kind, k8s_workload_name) k8s_pod_workload_info)"
    started: float = prom.started  # type: ignore[attr-defined]
    # This test runs first in the module, while the job still runs.
    assert time.monotonic() - started < ENDS_AT - 3, "stack too slow to see the job alive"
    if True:
        result = prom.wait_for(
            query,
            lambda r: (
                ("CronJob", "nightly") in _values(r, "k8s_workload_kind", "k8s_workload_name")
            ),
        )
        assert (
            _values(result, "k8s_workload_kind", "k8s_workload_name")[("CronJob", "nightly")] == 0.9
        )
    api.delete("pods", pod("short-job", "batch", node=NODE, owner=("Job", "nightly-29", "job-n")))
    prom.wait_for(
        'k8s_pod_workload_info{k8s_workload_name="nightly"}',
        lambda r: r == [],
        timeout=ENDS_AT + 15,
    )
    assert api.count("list", "pods") == 1  # the whole run: one list, then the watch


@pytest.mark.peer
def test_utilization_by_deployment_through_the_info_join(
    stack: tuple[PrometheusServer, ApiServer],
) -> None:
    prom, _ = stack
    by = "k8s_namespace_name, k8s_deployment_name"
    query = f"sum by ({by}) ({UTIL} * {JOIN} group_left(k8s_deployment_name) k8s_pod_workload_info)"
    expected = {("ml-team", "train"): 0.8, ("serving", "inference"): 0.42}
    result = prom.wait_for(query, lambda r: _values(r, "k8s_namespace_name", "k8s_deployment_name") == expected,
                           timeout=20)  # fmt: skip
    assert _values(result, "k8s_namespace_name", "k8s_deployment_name") == expected


@pytest.mark.peer
def test_info_series_carries_uid_workload_and_allowed_labels(
    stack: tuple[PrometheusServer, ApiServer],
) -> None:
    prom, _ = stack
    (series,) = prom.wait_for('k8s_pod_workload_info{k8s_pod_name="trainer-0"}', timeout=20)
    metric = series["metric"]
    assert metric["k8s_pod_uid"] == "uid-ml-team-trainer-0"
    assert (metric["k8s_workload_kind"], metric["k8s_workload_name"]) == ("Deployment", "train")
    assert (metric["k8s_replicaset_name"], metric["k8s_node_name"]) == ("train-5d", NODE)
    assert metric["k8s_pod_label_team"] == "vision"
    # Only device holders (web-* pods hold nothing), never a label that was not allowed.
    everything = prom.query("k8s_pod_workload_info")
    assert {r["metric"]["k8s_pod_name"] for r in everything} <= {
        "trainer-0", "inference-small", "inference-large", "short-job", "batch-a", "batch-b"}  # fmt: skip
    assert not any("k8s_pod_label_secret" in r["metric"] for r in everything)
    # Device series are not copied per workload: no workload label on them.
    assert not any("k8s_deployment_name" in r["metric"] for r in prom.query(UTIL))
    (up,) = prom.query("kube_device_exporter_kubernetes_up")
    assert up["value"][1] == "1"


@pytest.mark.peer
def test_pod_created_during_the_run_joins_its_deployment(
    stack: tuple[PrometheusServer, ApiServer],
) -> None:
    prom, api = stack
    # The kubelet has admitted late-0 (it holds a MIG slice) but the API cache has not seen it.
    prom.wait_for('hw_allocation_info{k8s_pod_name="late-0"}', timeout=20)
    assert prom.query('k8s_pod_workload_info{k8s_pod_name="late-0"}') == []
    api.put(
        "pods", pod("late-0", "serving", node=NODE, owner=("ReplicaSet", "inference-7c", "rs-i"))
    )
    devices = (
        "count by (k8s_namespace_name, k8s_deployment_name) (hw_allocation_info"
        f" * {JOIN} group_left(k8s_deployment_name) k8s_pod_workload_info)"
    )
    result = prom.wait_for(
        devices, lambda r: _values(r, "k8s_deployment_name").get(("inference",)) == 3, timeout=10
    )
    assert (
        _values(result, "k8s_namespace_name", "k8s_deployment_name")[("serving", "inference")] == 3
    )
