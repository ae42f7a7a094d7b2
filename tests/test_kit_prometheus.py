"""Acceptance: a real Prometheus scrapes simulated nodes, loads the alert rules, and every
dashboard panel query and template-variable query is evaluated through its HTTP API.

The exporters run as `kube-device-exporter simulate SCENARIO` subprocesses, as a user runs
them: the simulated NVML library must be on LD_LIBRARY_PATH before the process starts, and
the runner re-executes itself to get it. Beside the simulated nodes Prometheus scrapes an
exporter whose kubelet socket does not exist (and whose OTLP push goes nowhere) and an
address nobody listens on, so the health alerts and panels have something real to select.

A query must parse and return data. The only queries allowed to come back empty are those
naming a metric listed in `awaiting()`, each with the reason the simulation cannot produce
it yet; they are reported as xfail, so the list shrinks as sources land.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.metrics import SPECS, Scope
from exporter.simulate.scenario import bundled_names, load_scenario
from exporter.sources import registry
from tests import kit
from tests.kubeapi_server import FakeApiServer, owner_object, pod
from tests.peers import PrometheusServer, free_port, need

pytestmark = pytest.mark.peer

SCENARIOS = [s for s in ("demo", "mixed", "numa") if s in bundled_names()]
RATE_INTERVAL = "4s"
"""What Grafana makes of $__rate_interval at a 1 s scrape interval (4 x scrape interval)."""
RANGE = "1m"
RANGE_SECONDS = "60"
"""$__range: the test's data spans less than this."""
MIXED_ONLY = (
    "hw.network.io",
    "hw.network.packets",
    "hw.network.dropped",
    "hw.network.up",
    "hw.network.bandwidth.limit",
    "hw.network.ib.transmit_wait",
    "hw.network.rdma.hw_counter",
    "hw.gpu.idle.time",
    "hw.gpu.memory.gtt.usage",
    "hw.gpu.memory.gtt.limit",
    "hw.gpu.memory.visible.usage",
    "hw.gpu.memory.visible.limit",
)
"""Metrics only AMD, Intel and network sources report: the `mixed` scenario's."""


def awaiting() -> dict[str, str]:
    """Prometheus name -> why the simulated cluster cannot have that metric yet."""
    out: dict[str, str] = {}
    if not registry():
        for spec in SPECS.values():
            if spec.scope is Scope.DEVICE:
                out[spec.prom_name] = "no device source is merged yet"
        out[SPECS["kube_device_exporter.source.success"].prom_name] = "no source is merged yet"
        for name in ("duration", "field_errors"):
            spec = SPECS[f"kube_device_exporter.source.{name}"]
            out[spec.prom_name] = "no source is merged yet"
    if "mixed" not in SCENARIOS:
        for name in MIXED_ONLY:
            out.setdefault(SPECS[name].prom_name, "the `mixed` scenario is not merged yet")
    return out


# --- the simulated cluster -------------------------------------------------------------


@dataclass
class Cluster:
    prometheus: PrometheusServer
    exporters: dict[str, str]
    """scenario (or role) -> scrape target."""
    down_target: str
    resolved: dict[tuple[str, bool], dict[str, str]] = field(default_factory=dict)
    """(dashboard, concrete) -> variable values, resolved once."""

    def query(self, expr: str, *, instant: bool) -> list[dict[str, Any]]:
        if instant:
            return self.prometheus.query(expr)
        end = time.time()
        data = self.prometheus.api(
            "query_range", query=expr, start=f"{end - 20:.3f}", end=f"{end:.3f}", step="1"
        )
        result: list[dict[str, Any]] = data["result"]
        return result


def _start_exporter(
    args: list[str], workdir: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "KDE_SIMULATE_WORKDIR": str(workdir), **(env or {})}
    workdir.mkdir(parents=True, exist_ok=True)
    log = (workdir / "exporter.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter", *args, "--web.listen-address", f"127.0.0.1:{port}",
         "--collect-interval", "1s", "--collect-timeout", "1s"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )  # fmt: skip
    return proc, f"127.0.0.1:{port}"


def _wait_ready(proc: subprocess.Popen[bytes], target: str, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exporter exited: {log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://{target}/readyz", timeout=1) as r:
                if r.status == 200:
                    return
        except (OSError, urllib.error.HTTPError):
            time.sleep(0.2)
    raise RuntimeError(f"exporter at {target} never became ready: {log.read_text()[-3000:]}")


def _demo_api() -> FakeApiServer:
    """The demo node's pods on a Kubernetes API server: a Deployment, a CronJob, bare pods."""
    node = "demo-node-1"
    api = FakeApiServer().start()
    api.add_owner(owner_object("ReplicaSet", "trainer-5d", "rs-t", "ml-team",
                               ("Deployment", "trainer", "d-t")))  # fmt: skip
    api.add_owner(owner_object("Job", "batch-29", "job-b", "batch", ("CronJob", "batch", "cj-b")))
    api.add_pod(pod("trainer-0", "ml-team", node=node, owner=("ReplicaSet", "trainer-5d", "rs-t")))
    for name in ("batch-a", "batch-b", "short-job"):
        api.add_pod(pod(name, "batch", node=node, owner=("Job", "batch-29", "job-b")))
    api.add_pod(pod("notebook-alice", "research", node=node))
    api.add_pod(pod("inference-small", "serving", node=node))
    return api


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    need("prometheus", "prometheus")
    root = tmp_path_factory.mktemp("kit")
    procs: list[subprocess.Popen[bytes]] = []
    exporters: dict[str, str] = {}
    api = _demo_api()
    try:
        for scenario in SCENARIOS:
            extra = []
            if scenario == "demo":  # the workload panels need --kubernetes.api
                kubeconfig = api.kubeconfig(root / "kubeconfig")
                extra = ["--kubernetes.api", "--kubernetes.kubeconfig", str(kubeconfig)]
            proc, target = _start_exporter(["simulate", scenario, *extra], root / scenario)
            procs.append(proc)
            _wait_ready(proc, target, root / scenario / "exporter.log")
            exporters[scenario] = target
        # It also pushes OTLP to an address nobody listens on: its export counters are real.
        proc, target = _start_exporter(
            ["--kubelet-socket", str(root / "no-kubelet" / "kubelet.sock"),
             "--node-name", "no-kubelet-node",
             "--otlp.endpoint", f"http://127.0.0.1:{free_port()}"],
            root / "no-kubelet",
            env={"OTEL_EXPORTER_OTLP_TIMEOUT": "500"},
        )  # fmt: skip
        procs.append(proc)
        _wait_ready(proc, target, root / "no-kubelet" / "exporter.log")
        exporters["no-kubelet"] = target
        down = f"127.0.0.1:{free_port()}"
        prometheus = PrometheusServer(root, [*exporters.values(), down], rule_files=[kit.RULES])
        prometheus.start()
        try:
            cycles = SPECS["kube_device_exporter.cycles"].prom_name
            # Every exporter scraped often enough for rate() over $__rate_interval.
            prometheus.wait_for(
                f"count(rate({cycles}[{RATE_INTERVAL}]) > 0) >= {len(exporters)}",
                timeout=40,
            )
            yield Cluster(prometheus, exporters, down)
        finally:
            prometheus.stop()
    finally:
        api.stop()
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# --- template variables ----------------------------------------------------------------

_LABEL_VALUES = re.compile(r"^label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\)$")


def _builtins(expr: str) -> str:
    expr = expr.replace("$__range_s", RANGE_SECONDS)
    return expr.replace("$__rate_interval", RATE_INTERVAL).replace("$__range", RANGE)


def _substitute(expr: str, values: dict[str, str]) -> str:
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    return _builtins(expr)


def _variable_values(cluster: Cluster, stem: str, *, concrete: bool) -> dict[str, str]:
    """Resolve variables in order, as Grafana does. Multi-value variables take their All
    value (the default a user sees) or, when `concrete`, the first value found."""
    if (stem, concrete) not in cluster.resolved:
        cluster.resolved[stem, concrete] = _resolve(cluster, kit.dashboards()[stem], concrete)
    return cluster.resolved[stem, concrete]


def _resolve(cluster: Cluster, board: dict[str, Any], concrete: bool) -> dict[str, str]:
    values: dict[str, str] = {}
    for variable in kit.variables(board):
        if variable.kind == "datasource":
            continue
        if variable.kind == "custom":
            values[variable.name] = variable.query.split(",")[0]
            continue
        found = _variable_options(cluster, variable, values)
        if variable.multi and (not concrete or not found):
            values[variable.name] = variable.all_value
        elif variable.multi:
            # Grafana regex-escapes a multi-value selection inside a PromQL string.
            values[variable.name] = re.escape(found[0]).replace("\\", "\\\\")
        else:
            values[variable.name] = found[0] if found else ""
    return values


def _variable_options(
    cluster: Cluster, variable: kit.Variable, values: dict[str, str]
) -> list[str]:
    """What Grafana lists for a label_values(SELECTOR, LABEL) variable."""
    m = _LABEL_VALUES.match(variable.query)
    assert m, f"{variable.name}: not a label_values() query: {variable.query}"
    match, label = _substitute(m[1], values), m[2]
    found: list[str] = cluster.prometheus.api(f"label/{label}/values", **{"match[]": match})
    return found


VARIABLES = [
    (stem, v)
    for stem, board in kit.dashboards().items()
    for v in kit.variables(board)
    if v.kind == "query"
]


@pytest.mark.parametrize(
    ("stem", "variable"), VARIABLES, ids=[f"{stem}:${v.name}" for stem, v in VARIABLES]
)
def test_template_variable_lists_values(
    cluster: Cluster, stem: str, variable: kit.Variable
) -> None:
    values = _variable_values(cluster, stem, concrete=False)
    if _variable_options(cluster, variable, values):
        return
    _xfail_if_awaiting(variable.query)
    raise AssertionError(f"{stem}: ${variable.name} lists nothing: {variable.query}")


def _xfail_if_awaiting(expr: str) -> None:
    series, _ = kit.names_in(expr)
    waiting = {name: why for name, why in awaiting().items() if name in series}
    resolved = f'{kit.prometheus_label("hw.id")}!=""'
    if not registry() and resolved in expr:
        waiting[resolved] = "allocations resolve to devices only once a device source is merged"
    if waiting:
        pytest.xfail("; ".join(f"{n}: {why}" for n, why in sorted(waiting.items())))


QUERIES = kit.panel_queries()


@pytest.mark.parametrize("query", QUERIES, ids=[q.id for q in QUERIES])
def test_panel_query_returns_data(cluster: Cluster, query: kit.PanelQuery) -> None:
    expr = _substitute(query.expr, _variable_values(cluster, query.dashboard, concrete=False))
    result = cluster.query(expr, instant=query.instant)
    # With one concrete value per variable the query must still parse and evaluate.
    concrete = _substitute(query.expr, _variable_values(cluster, query.dashboard, concrete=True))
    cluster.query(concrete, instant=query.instant)
    if result:
        return
    _xfail_if_awaiting(query.expr)
    raise AssertionError(f"{query.id} returned no data:\n{expr}")


def test_alert_rules_load_and_evaluate(cluster: Cluster) -> None:
    """Every rule is loaded and has evaluated without error against the real exporters
    (a join that is many-to-many on real data would show up here)."""
    expected = {rule["alert"] for rule in kit.rules()}
    deadline = time.monotonic() + 15
    while True:
        groups = cluster.prometheus.api("rules")["groups"]
        loaded = {r["name"]: r for g in groups for r in g["rules"]}
        evaluated = all(r.get("lastEvaluation", "").startswith("20") for r in loaded.values())
        if (set(loaded) == expected and evaluated) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert set(loaded) == expected
    for name, rule in loaded.items():
        assert rule["health"] == "ok", f"{name}: {rule.get('lastError')}"


def _alert_expr(name: str) -> str:
    return next(r["expr"] for r in kit.rules() if r["alert"] == name)


def test_health_alert_expressions_select_the_broken_targets(cluster: Cluster) -> None:
    """The health alerts' expressions pick exactly what is broken in the real cluster."""
    down = cluster.prometheus.wait_for(_alert_expr("KubeDeviceExporterDown"))
    assert {s["metric"]["instance"] for s in down} == {cluster.down_target}

    unreachable = cluster.prometheus.wait_for(_alert_expr("KubeDeviceExporterKubeletUnreachable"))
    node = kit.prometheus_label("k8s.node.name")
    assert {s["metric"][node] for s in unreachable} == {"no-kubelet-node"}

    # The demo exporter watches a reachable API server: its pod watch is up, so no alert.
    (api,) = cluster.prometheus.wait_for("kube_device_exporter_kubernetes_up == 1")
    assert api["metric"][node] == "demo-node-1"
    for healthy in (
        "KubeDeviceExporterAbsent",
        "KubeDeviceExporterCycleStalled",
        "KubeDeviceExporterKubernetesApiUnavailable",
    ):
        assert cluster.prometheus.query(_alert_expr(healthy)) == [], healthy


def _panel(stem: str, title: str) -> list[kit.PanelQuery]:
    found = [q for q in QUERIES if q.dashboard == stem and q.panel == title]
    assert found, f"{stem}: no panel {title!r}"
    return found


def _rows(cluster: Cluster, query: kit.PanelQuery) -> list[dict[str, str]]:
    expr = _substitute(query.expr, _variable_values(cluster, query.dashboard, concrete=False))
    return [s["metric"] for s in cluster.query(expr, instant=True)]


def test_not_allocatable_panel_and_alert_show_the_unhealthy_gpu(cluster: Cluster) -> None:
    """The `numa` node's plugin reports GPU ...003 unhealthy after 2 s: the devices
    dashboard's panel lists it with its holder, and the alert selects it and nothing else."""
    gpu = "GPU-2b7e0c41-93a5-4f1e-8d21-000000000003"
    hw_id, pod = kit.prometheus_label("hw.id"), kit.prometheus_label("k8s.pod.name")
    allocatable, holder = _panel("devices", "Not allocatable (device plugin reports unhealthy)")
    assert {r[hw_id] for r in _rows(cluster, allocatable)} == {gpu}
    assert [(r[hw_id], r[pod]) for r in _rows(cluster, holder)] == [(gpu, "trainer-misaligned")]
    selected = cluster.prometheus.query(_alert_expr("KubeDeviceNotAllocatable"))
    assert {s["metric"][hw_id] for s in selected} == {gpu}


def test_numa_panels_and_alert_show_the_misaligned_container(cluster: Cluster) -> None:
    pod = kit.prometheus_label("k8s.pod.name")
    alignment = _panel("workloads", "NUMA alignment of containers holding devices")
    aligned_q, cpus_q = alignment
    aligned = {
        r[pod]: float(s["value"][1])
        for s in cluster.query(
            _substitute(aligned_q.expr, _variable_values(cluster, "workloads", concrete=False)),
            instant=True,
        )
        for r in [s["metric"]]
        if r.get(kit.prometheus_label("k8s.node.name")) == "numa-node-1"
    }
    # The notebook runs on the shared CPU pool with no pinned memory: no alignment value.
    assert aligned == {"trainer-misaligned": 0.0, "trainer-aligned": 1.0}
    assert {r[pod] for r in _rows(cluster, cpus_q)} >= {"notebook", "trainer-aligned"}
    (placed,) = _panel("workloads", "NUMA nodes by resource")
    resource = kit.prometheus_label("hw.numa.resource")
    numa_node = kit.prometheus_label("hw.numa_node")
    rows = {
        (r[resource], r[numa_node])
        for r in _rows(cluster, placed)
        if r[pod] == "trainer-misaligned"
    }
    assert rows == {("nvidia.com/gpu", "1"), ("cpu", "0")}
    (misaligned,) = _panel("workloads", "Misaligned containers")
    assert _rows(cluster, misaligned)
    selected = cluster.prometheus.query(_alert_expr("KubeDeviceContainerNumaMisaligned"))
    assert {s["metric"][pod] for s in selected} == {"trainer-misaligned"}


def _values_on(
    cluster: Cluster, query: kit.PanelQuery, node: str
) -> list[tuple[dict[str, str], float]]:
    expr = _substitute(query.expr, _variable_values(cluster, query.dashboard, concrete=False))
    on = kit.prometheus_label("k8s.node.name")
    return [
        (s["metric"], float(s["value"][1]))
        for s in cluster.query(expr, instant=True)
        if s["metric"].get(on, node) == node
    ]


def test_dashboards_show_the_values_the_demo_node_has(cluster: Cluster) -> None:
    """What a user reads on the demo node, checked against the scenario file (not against
    the exporter): the devices table's holder of GPU 0, the device counts, and each
    time-sliced holder's own memory on the efficiency board."""
    path = load_scenario("demo").path
    assert path is not None
    demo = yaml.safe_load(path.read_text())
    gpus = demo["nvidia"]["gpus"]
    slices = sum(len(g.get("mig", [])) for g in gpus)
    hw_id, pod = kit.prometheus_label("hw.id"), kit.prometheus_label("k8s.pod.name")

    (devices,) = _panel("devices", "Devices")
    holders = {m[hw_id]: m.get(pod, "") for m, _ in _values_on(cluster, devices, "demo-node-1")}
    assert holders[gpus[0]["uuid"]] == "trainer-0"
    assert len(holders) == len(gpus) + slices

    (count,) = _panel("devices", "Slices per profile")
    per_profile = {m["hw_gpu_mig_profile"]: v for m, v in _values_on(cluster, count, "")}
    demo_profiles = [m["profile"] for g in gpus for m in g.get("mig", [])]
    for profile in set(demo_profiles):
        assert per_profile[profile] >= demo_profiles.count(profile)

    memory = next(
        q for q in _panel("efficiency", "Shared devices: each holder's share") if "memory" in q.expr
    )
    shared = {m[pod]: v for m, v in _values_on(cluster, memory, "demo-node-1") if m.get(pod)}
    by_pod = {p["name"]: p for p in demo["pods"]}
    for name in ("batch-a", "batch-b"):
        (pid,) = by_pod[name]["containers"][0]["pids"]
        procs = [p for g in gpus for p in g.get("processes", []) if p.get("pid") == pid]
        assert procs, f"{name}: pid {pid} has no GPU process in the scenario"
        expected = sum(_bytes(p["memory"]) for p in procs)
        assert shared[name] == expected, (name, shared)


def _bytes(size: str) -> float:
    number, unit = size[:-3], size[-3:]
    return float(number) * {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit]
