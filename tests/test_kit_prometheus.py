"""Acceptance: a real Prometheus scrapes simulated nodes, loads the alert rules, and every
dashboard panel query and template-variable query is evaluated through its HTTP API.

The exporters run as `kde-simulate SCENARIO` subprocesses, as a user runs
them: the simulated NVML library must be on LD_LIBRARY_PATH before the process starts, and
the runner re-executes itself to get it. Beside the simulated nodes Prometheus scrapes an
exporter whose kubelet socket does not exist (and whose OTLP push goes nowhere) and an
address nobody listens on, so the health alerts and panels have something real to select.

A query must parse and return data. The only queries allowed to come back empty are those
naming a metric listed in `awaiting()`, each with the reason the simulation cannot produce
it yet; they are reported as xfail, so the list shrinks as sources land.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from bench.fleet import EVERY_GROUP
from exporter.metrics import SPECS, Scope, prometheus_label
from exporter.sources import registry
from simulator.apiserver import ApiServer
from simulator.nvml_scenario import parse_nvidia
from simulator.nvml_spec import GPM_SHARES
from simulator.ports import free_port
from simulator.scenario import bundled_names, load_scenario
from tests import kit
from tests.peers import PrometheusServer, need
from tests.scenario_facts import (
    device_behind,
    holdings,
    idle_while_held,
    nvidia_spec,
)
from tests.support.kubeapi import owner_object, pod, put_owner

pytestmark = pytest.mark.peer

SCENARIOS = [s for s in ("demo", "mixed", "numa") if s in bundled_names()]
RATE_INTERVAL = "4s"
CLUSTER = "lab"
"""The `cluster` label every target gets here, as from a multi-cluster Prometheus."""
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
    if "dra" not in SCENARIOS:
        for name in ("hw.dra.free", "hw.dra.device.taint", "hw.dra.counter.free",
                     "hw.dra.counter.stranded", "hw.dra.allocation.capacity",
                     "hw.dra.device.capacity.free"):  # fmt: skip
            out.setdefault(SPECS[name].prom_name, "only the `dra` scenario (its own loopback API "
                           "server) has DRA slices: tests/test_dra_simulated.py runs these panels")  # fmt: skip
    if "mixed" not in SCENARIOS:
        for name in MIXED_ONLY:
            out.setdefault(SPECS[name].prom_name, "the `mixed` scenario is not merged yet")
    return out


DEMO_GROUPS = frozenset({"energy"})
"""Opt-in groups demo's exporter runs beside the default ones: energy by workload joins
k8s_pod_workload_info, which only demo's exporter has (it alone has an API server)."""


# --- the simulated cluster -------------------------------------------------------------


@dataclass
class Cluster:
    prometheus: PrometheusServer
    exporters: dict[str, str]
    """scenario (or role) -> scrape target."""
    down_target: str
    started: dict[str, tuple[float, float]]
    """scenario -> (wall time its process was launched, wall time it was ready): its
    scenario time 0 lies between the two."""
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
        [sys.executable, "-m", *args, "--web.listen-address", f"127.0.0.1:{port}",
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


def _demo_api() -> ApiServer:
    """The demo node's pods on a Kubernetes API server: a Deployment, a CronJob, bare pods."""
    node = "demo-node-1"
    api = ApiServer().start()
    put_owner(api, owner_object("ReplicaSet", "trainer-5d", "rs-t", "ml-team",
                                ("Deployment", "trainer", "d-t")))  # fmt: skip
    put_owner(api, owner_object("Job", "batch-29", "job-b", "batch", ("CronJob", "batch", "cj-b")))
    api.put(
        "pods", pod("trainer-0", "ml-team", node=node, owner=("ReplicaSet", "trainer-5d", "rs-t"))
    )
    for name in ("batch-a", "batch-b", "short-job"):
        api.put("pods", pod(name, "batch", node=node, owner=("Job", "batch-29", "job-b")))
    api.put("pods", pod("notebook-alice", "research", node=node))
    api.put("pods", pod("inference-small", "serving", node=node))
    return api


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    need("prometheus", "prometheus")
    root = tmp_path_factory.mktemp("kit")
    procs: list[subprocess.Popen[bytes]] = []
    exporters: dict[str, str] = {}
    started: dict[str, tuple[float, float]] = {}
    api = _demo_api()
    try:
        for scenario in SCENARIOS:
            extra = []
            if scenario == "demo":  # the workload panels need --kubernetes.api
                kubeconfig = api.kubeconfig(root / "kubeconfig")
                extra = ["--kubernetes.api", "--kubernetes.kubeconfig", str(kubeconfig)]
                extra += [f"--metrics.group.{g}" for g in sorted(DEMO_GROUPS)]
            else:  # the opt-in panels' data; demo keeps the default metric groups
                extra = list(EVERY_GROUP)
            launched = time.time()
            proc, target = _start_exporter(["simulator", scenario, *extra], root / scenario)
            procs.append(proc)
            _wait_ready(proc, target, root / scenario / "exporter.log")
            exporters[scenario] = target
            started[scenario] = (launched, time.time())
        # It also pushes OTLP to an address nobody listens on: its export counters are real.
        proc, target = _start_exporter(
            ["exporter", "--kubelet-socket", str(root / "no-kubelet" / "kubelet.sock"),
             "--node-name", "no-kubelet-node",
             "--otlp.endpoint", f"http://127.0.0.1:{free_port()}"],
            root / "no-kubelet",
            env={"OTEL_EXPORTER_OTLP_TIMEOUT": "500"},
        )  # fmt: skip
        procs.append(proc)
        _wait_ready(proc, target, root / "no-kubelet" / "exporter.log")
        exporters["no-kubelet"] = target
        down = f"127.0.0.1:{free_port()}"
        # Labelled as a multi-cluster Prometheus (Thanos, Mimir) sees them: the dashboards'
        # $cluster lists it, and a query that forgot it would still pass, so a test checks.
        prometheus = PrometheusServer(
            root,
            [*exporters.values(), down],
            rule_files=[kit.RULES],
            scrape_config={
                "static_configs": [
                    {"targets": [*exporters.values(), down], "labels": {"cluster": CLUSTER}}
                ]
            },
        )
        prometheus.start()
        try:
            cycles = SPECS["kube_device_exporter.cycles"].prom_name
            # Every exporter scraped often enough for rate() over $__rate_interval.
            prometheus.wait_for(
                f"count(rate({cycles}[{RATE_INTERVAL}]) > 0) >= {len(exporters)}",
                timeout=40,
            )
            yield Cluster(prometheus, exporters, down, started)
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
            values[variable.name] = _selected(found[0])
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


def _selected(value: str) -> str:
    """One value picked in a multi-value variable, as Grafana writes it into a PromQL
    string: regex-escaped."""
    return re.escape(value).replace("\\", "\\\\")


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
    resolved = f'{prometheus_label("hw.id")}!=""'
    if not registry() and resolved in expr:
        waiting[resolved] = "allocations resolve to devices only once a device source is merged"
    if waiting:
        pytest.xfail("; ".join(f"{n}: {why}" for n, why in sorted(waiting.items())))


QUERIES = kit.panel_queries()


@pytest.mark.parametrize("query", QUERIES, ids=[q.id for q in QUERIES])
def test_panel_query_returns_data(cluster: Cluster, query: kit.PanelQuery) -> None:
    """Every panel returns data. `demo` runs with the default metric groups (and DEMO_GROUPS),
    the others with every group on: a panel marked `(opt-in: ...)` (monitoring/groups.py) has
    data, and none on `demo`'s node unless demo runs its groups."""
    expr = _substitute(query.expr, _variable_values(cluster, query.dashboard, concrete=False))
    result = cluster.query(expr, instant=query.instant)
    # With one concrete value per variable the query must still parse and evaluate.
    concrete = _substitute(query.expr, _variable_values(cluster, query.dashboard, concrete=True))
    cluster.query(concrete, instant=query.instant)
    values = _variable_values(cluster, query.dashboard, concrete=False)
    opt_in = re.search(r"\(opt-in: ([^)]*)\)", query.panel)
    if opt_in and "node" in values and not set(opt_in[1].split(", ")) <= DEMO_GROUPS:
        default_node = _substitute(query.expr, {**values, "node": load_scenario("demo").node})
        on_default = cluster.query(default_node, instant=query.instant)
        assert not on_default, f"{query.id} is marked opt-in but has data on the default groups"
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
    return str(next(r["expr"] for r in kit.rules() if r["alert"] == name))


def test_health_alert_expressions_select_the_broken_targets(cluster: Cluster) -> None:
    """The health alerts' expressions pick exactly what is broken in the real cluster."""
    down = cluster.prometheus.wait_for(_alert_expr("KubeDeviceExporterDown"))
    assert {s["metric"]["instance"] for s in down} == {cluster.down_target}

    unreachable = cluster.prometheus.wait_for(_alert_expr("KubeDeviceExporterKubeletUnreachable"))
    node = prometheus_label("k8s.node.name")
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
    hw_id, pod = prometheus_label("hw.id"), prometheus_label("k8s.pod.name")
    allocatable, holder = _panel("devices", "Not allocatable (device plugin reports unhealthy)")
    assert {r[hw_id] for r in _rows(cluster, allocatable)} == {gpu}
    assert [(r[hw_id], r[pod]) for r in _rows(cluster, holder)] == [(gpu, "trainer-misaligned")]
    selected = cluster.prometheus.query(_alert_expr("KubeDeviceNotAllocatable"))
    assert {s["metric"][hw_id] for s in selected} == {gpu}


def test_numa_panels_and_alert_show_the_misaligned_container(cluster: Cluster) -> None:
    pod = prometheus_label("k8s.pod.name")
    alignment = _panel("workloads", "NUMA alignment of containers holding devices")
    aligned_q, cpus_q = alignment
    aligned = {
        r[pod]: float(s["value"][1])
        for s in cluster.query(
            _substitute(aligned_q.expr, _variable_values(cluster, "workloads", concrete=False)),
            instant=True,
        )
        for r in [s["metric"]]
        if r.get(prometheus_label("k8s.node.name")) == "numa-node-1"
    }
    # The notebook runs on the shared CPU pool with no pinned memory: no alignment value.
    assert aligned == {"trainer-misaligned": 0.0, "trainer-aligned": 1.0}
    assert {r[pod] for r in _rows(cluster, cpus_q)} >= {"notebook", "trainer-aligned"}
    (placed,) = _panel("workloads", "NUMA nodes by resource")
    resource = prometheus_label("hw.numa.resource")
    numa_node = prometheus_label("hw.numa_node")
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
    on = prometheus_label("k8s.node.name")
    return [(m, points[-1]) for m, points in _read(cluster, query) if m.get(on, node) == node]


def test_dashboards_show_the_values_the_demo_node_has(cluster: Cluster) -> None:
    """What a user reads on the demo node, checked against the scenario file (not against
    the exporter): the devices table's holder of GPU 0, the device counts, and each
    time-sliced holder's own memory on the efficiency board."""
    path = load_scenario("demo").path
    assert path is not None
    demo = yaml.safe_load(path.read_text())
    gpus = demo["nvidia"]["gpus"]
    slices = sum(len(g.get("mig", [])) for g in gpus)
    hw_id, pod = prometheus_label("hw.id"), prometheus_label("k8s.pod.name")

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


# --- what a user reads on the bundled scenarios -----------------------------------------
#
# Every expected value is derived from the scenario files, through the scenario parsers so
# that the defaults docs/simulation.md gives apply; none is read from an exporter.

DATA_LAG = 5.0
"""Seconds by which what Prometheus shows may trail a simulated node: a collect cycle and a
scrape (1 s each), and the staleness marker a vanished series gets at the next scrape."""
SETTLE = 30.0
"""Seconds a panel may take to show what the scenario implies: up to a slow interval (10 s:
GPM activity, per-process utilization), then a scrape."""
MIB = 2**20
T = TypeVar("T")


def _shown(cluster: Cluster, scenario: str, start: float, end: float | None) -> bool | None:
    """Whether what Prometheus shows, now and for DATA_LAG seconds on, lies inside [start,
    end) of `scenario`'s time: True or False when both lie clear of the window its time may
    be in, None when it may show either. For values read every cycle (not every slow
    interval), which need no waiting for but a scrape."""
    launched, ready = cluster.started[scenario]
    now = time.time()
    earliest, latest = now - ready - DATA_LAG, now - launched + DATA_LAG
    if start <= earliest and (end is None or latest < end):
        return True
    if latest < start or (end is not None and end <= earliest):
        return False
    return None


def _read(
    cluster: Cluster, query: kit.PanelQuery, **chosen: str
) -> list[tuple[dict[str, str], list[float]]]:
    """A panel's series with the `chosen` variables set to one value each, as a user picks
    them, the others at their defaults: an instant query's value, or each point of a range
    query (the last 20 s)."""
    values = dict(_variable_values(cluster, query.dashboard, concrete=False))
    values.update({name: _selected(value) for name, value in chosen.items()})
    expr = _substitute(query.expr, values)
    out = []
    for s in cluster.query(expr, instant=query.instant):
        points = [s["value"]] if query.instant else s["values"]
        out.append((s["metric"], [float(v) for _, v in points]))
    return out


def _stat(cluster: Cluster, query: kit.PanelQuery, **chosen: str) -> float:
    """The number a stat panel shows."""
    ((_, (value,)),) = _read(cluster, query, **chosen)
    return value


def _latest(cluster: Cluster, query: kit.PanelQuery, label: str, **chosen: str) -> dict[str, float]:
    """A panel's series by one label's value -> the latest value (a stat or table cell, a
    graph's right edge)."""
    return {m.get(label, ""): points[-1] for m, points in _read(cluster, query, **chosen)}


def _settled(read: Callable[[], T], expected: object) -> T:
    """`read()` once it equals `expected`, or its last answer after SETTLE seconds."""
    deadline = time.monotonic() + SETTLE
    while True:
        got = read()
        if got == expected or time.monotonic() > deadline:
            return got
        time.sleep(0.5)


def _levels(series: list[tuple[dict[str, str], list[float]]], label: str) -> dict[str, set[float]]:
    """Label value -> the values its series take (6 decimals: what a panel can show)."""
    out: dict[str, set[float]] = {}
    for metric, points in series:
        out.setdefault(metric.get(label, ""), set()).update(round(p, 6) for p in points)
    return out


def test_devices_dashboard_shows_each_gpus_utilization_and_memory(cluster: Cluster) -> None:
    """The devices board's `Utilization` and `Device memory used` graphs, with the node and
    the GPU picked, for every whole GPU whose utilization the scenario holds constant (the
    numa node's four: 90, 10, 60, 60 %; the demo's GPU ...003, which dev-shell uses without
    a request: 25 %): one `general` line at the scenario's value (whole percents, as NVML
    reports them), a `decoder` line at its decoder_utilization (0 unless set; on numa, whose
    exporter runs every metric group, not on demo's default groups), no `encoder`
    line (the scenarios' `unsupported: [encoder_utilization]`: an H100 has no NVENC), and
    memory used = the GPU's memory_used (0 unless set) plus its processes' memory (GPU
    ...003: dev-shell's 3 GiB), out of its memory (81559 MiB unless set)."""
    (utilization,) = _panel("devices", "Utilization")
    used, size = _panel("devices", "Device memory used")
    hw_id, task = prometheus_label("hw.id"), prometheus_label("hw.gpu.task")
    checked = []
    for name in ("demo", "numa"):
        scenario = load_scenario(name)
        for gpu in nvidia_spec(scenario).gpus:
            lines = {
                "general": ("utilization", gpu.utilization),
                "decoder": ("decoder_utilization", gpu.decoder_utilization),
                "encoder": ("encoder_utilization", gpu.encoder_utilization),
            }
            processes = [*gpu.processes, *(p for m in gpu.mig for p in m.processes)]
            if gpu.mig or any(s.pattern != "constant" for _, s in lines.values()):
                continue
            assert all(p.start == 0 and p.end == math.inf for p in processes), gpu.uuid
            expected = {
                line: {round(signal.max, 6)}
                for line, (feature, signal) in lines.items()
                if feature not in gpu.unsupported
                # demo runs the default groups: decoder and encoder lines are `media`
                and (name != "demo" or line == "general")
            }
            picked = {"node": scenario.node, "device": gpu.uuid}
            series = _read(cluster, utilization, **picked)
            assert {m[hw_id] for m, _ in series} == {gpu.uuid}
            assert _levels(series, task) == expected, gpu.uuid
            in_use = gpu.memory_used + sum(p.memory for p in processes)
            assert _levels(_read(cluster, used, **picked), hw_id) == {gpu.uuid: {in_use}}
            assert _levels(_read(cluster, size, **picked), hw_id) == {gpu.uuid: {gpu.memory}}
            checked.append(gpu.uuid)
    assert "GPU-6a3f1c2e-1b7d-4c1e-9a55-000000000003" in checked
    assert len(checked) == 5, checked


def test_workloads_dashboard_shows_each_pods_devices(cluster: Cluster) -> None:
    """Picking a pod on the workloads board (its node, namespace and name) shows what the
    scenario's kubelet hands it: `Device IDs held` counts its IDs (2 for the numa node's
    trainer-misaligned), `Pods holding devices` is 1, and the `Allocations` table has one
    row per (container, resource, device ID), an NVIDIA one resolved to the GPU or slice
    behind it (a time-slicing replica `UUID::N` to its GPU). With only a node picked,
    `Devices held by namespace` counts each namespace's (container, device ID) pairs.
    A pod that starts or ends during the run (the demo's short-job) is left out, and so is
    its node's namespace count: what they show depends on when the test looks."""
    (held,) = _panel("workloads", "Device IDs held")
    (pods,) = _panel("workloads", "Pods holding devices")
    (table,) = _panel("workloads", "Allocations")
    (by_namespace,) = _panel("workloads", "Devices held by namespace")
    label = prometheus_label
    checked: dict[str, int] = {}
    for name in SCENARIOS:
        scenario = load_scenario(name)
        nvidia_ids = nvidia_spec(scenario).device_index()
        handed = holdings(scenario)
        for timed in {h.pod for h in handed}:
            if timed.start or timed.end is not None:
                continue
            mine = [h for h in handed if h.pod == timed]
            picked = {
                "node": scenario.node,
                "namespace": timed.pod.namespace,
                "pod": timed.pod.name,
            }
            rows = [
                (
                    m[label("k8s.container.name")],
                    m[label("hw.allocation.resource")],
                    m[label("hw.allocation.device_id")],
                    m.get(label("hw.id"), ""),
                )
                for m, _ in _read(cluster, table, **picked)
            ]
            assert sorted(r[:3] for r in rows) == sorted(
                (h.container, h.resource, h.device_id) for h in mine
            ), picked
            for _, _, device_id, hw_id in rows:
                if device_behind(device_id) in nvidia_ids:
                    assert hw_id == device_behind(device_id), (picked, device_id)
            assert _stat(cluster, held, **picked) == len({h.device_id for h in mine}), picked
            assert _stat(cluster, pods, **picked) == 1, picked
            checked[timed.pod.name] = len(mine)
        if any(h.pod.start or h.pod.end is not None for h in handed):
            continue
        namespaces = Counter(h.pod.pod.namespace for h in handed)
        shown = _latest(cluster, by_namespace, label("k8s.namespace.name"), node=scenario.node)
        assert shown == namespaces, scenario.name
    assert checked.get("trainer-misaligned") == 2, checked


def test_efficiency_dashboard_lists_exactly_the_idle_allocated_devices(
    cluster: Cluster,
) -> None:
    """The efficiency board's `Allocated but idle` table, at its default threshold (5 %),
    lists exactly the held devices whose utilization the scenarios keep under it: the
    demo's notebook-alice on MIG slice ...101 (a constant 2 %). Not short-job's slice ...102
    (90 % until the pod ends at 40 s, then held by no one), not the numa notebook's GPU
    (10 %), not the mixed node's GPUs (35-99 % busy), nothing that has no utilization (AMD
    partitions, NICs). Its utilization and peak columns read the scenario's value, and its
    idle-for column is at most the time since the node started (it was never busy). The
    `Idle now` and `Idle while allocated` stats, the by-namespace graph and the overview's
    `Idle while allocated` count the same devices."""
    threshold = float(_variable_values(cluster, "efficiency", concrete=False)["idle_threshold"])
    expected: dict[tuple[str, ...], tuple[float, float]] = {}
    for name in SCENARIOS:
        expected |= idle_while_held(load_scenario(name), threshold)
    keys = ("k8s.node.name", "hw.id", "k8s.namespace.name", "k8s.pod.name")
    labels = [prometheus_label(k) for k in keys]
    idle_for, peak, now = _panel("efficiency", "Allocated but idle")

    def listed(query: kit.PanelQuery) -> dict[tuple[str, ...], float]:
        return {tuple(m[k] for k in labels): v[-1] for m, v in _read(cluster, query)}

    assert _settled(lambda: set(listed(now)), set(expected)) == set(expected)
    assert ("demo-node-1", "MIG-0b6f4a21-7d3c-5e2a-8f10-000000000101") in {
        key[:2] for key in expected
    }
    for column in (now, peak):
        values = listed(column)
        assert set(values) == set(expected), column.ref
        for key, value in values.items():
            low, high = expected[key]
            assert low - 1e-6 <= value <= high + 1e-6, (column.ref, key, value)
    scenario_on = {load_scenario(name).node: name for name in SCENARIOS}
    since = listed(idle_for)
    assert set(since) == set(expected)
    for key, seconds in since.items():
        launched, _ = cluster.started[scenario_on[key[0]]]
        assert 0 < seconds <= time.time() - launched, (key, seconds)

    count = len(expected)
    for stem, title in (
        ("efficiency", "Idle now"),
        ("efficiency", "Idle while allocated"),
        ("overview", "Idle while allocated"),
    ):
        (stat,) = _panel(stem, title)
        assert _stat(cluster, stat) == count, title
    (graph,) = _panel("efficiency", "Allocated devices idle now, by namespace")
    by_namespace = _latest(cluster, graph, prometheus_label("k8s.namespace.name"))
    assert by_namespace == Counter(key[2] for key in expected)


def test_power_panels_show_watts_from_the_scenario(cluster: Cluster) -> None:
    """Power in watts (base units, not NVML's milliwatts) on the numa node, whose four GPUs
    run at constant utilization: each GPU's `Power and limit` lines on the devices board
    read power_idle + (power_max - power_idle) x utilization (defaults 70 W and 95 % of the
    700 W power_limit: 605.5, 129.5, 427 and 427 W) and power_limit, and the overview's
    `Power by node` their sum, each GPU counted once whatever pods hold it."""
    scenario = load_scenario("numa")
    gpus = nvidia_spec(scenario).gpus
    assert all(g.utilization.pattern == "constant" and not g.mig for g in gpus)
    watts = {
        g.uuid: round(g.power_idle + (g.power_max - g.power_idle) * g.utilization.max, 3)
        for g in gpus
    }
    power, limit = _panel("devices", "Power and limit")
    hw_id = prometheus_label("hw.id")
    node = {"node": scenario.node}
    assert _levels(_read(cluster, power, **node), hw_id) == {k: {v} for k, v in watts.items()}
    assert _levels(_read(cluster, limit, **node), hw_id) == {g.uuid: {g.power_limit} for g in gpus}
    (by_node,) = _panel("overview", "Power by node")
    total = round(sum(watts.values()), 3)
    on = prometheus_label("k8s.node.name")
    assert _levels(_read(cluster, by_node, **node), on) == {scenario.node: {total}}


def test_mig_slices_panel_shows_each_slices_parent_profile_and_holder(cluster: Cluster) -> None:
    """The devices board's `MIG slices` table on the demo node: each slice of GPU ...001
    with its parent, profile, GPU and compute instance IDs (ci 0 unless set) and the pod
    the scenario's kubelet gives it (none for ...103; short-job holds ...102 until it ends
    at 40 s, and that slice's holder is not compared while the node's time may be on either
    side of 40 s); its size from the profile (97.5 % of the name: 1g.10gb is 9984 MiB,
    3g.40gb 39936 MiB); its memory used its live processes' memory plus the slice's own
    few MiB (13 MiB on an H100, under 64 MiB anywhere)."""
    scenario = load_scenario("demo")
    holders = {h.device_id: h.pod for h in holdings(scenario)}
    slices_q, used_q, size_q = _panel("devices", "MIG slices")
    label = prometheus_label
    columns: tuple[str, ...] = ("hw.parent", "hw.gpu.mig.profile", "hw.gpu.mig.gpu_instance_id")
    columns += ("hw.gpu.mig.compute_instance_id", "k8s.namespace.name", "k8s.pod.name")
    expected: dict[str, tuple[str, ...]] = {}
    in_use: dict[str, tuple[int, int]] = {}
    for gpu in nvidia_spec(scenario).gpus:
        for mig in gpu.mig:
            timed = holders.get(mig.uuid)
            shown = _shown(cluster, "demo", timed.start, timed.end) if timed else False
            if shown is not None:
                pod = (timed.pod.namespace, timed.pod.name) if timed and shown else ("", "")
                expected[mig.uuid] = (gpu.uuid, mig.profile, str(mig.gi), str(mig.ci), *pod)
            alive = [_shown(cluster, "demo", p.start, p.end) for p in mig.processes]
            if None not in alive:
                processes = sum(p.memory for p, a in zip(mig.processes, alive, strict=True) if a)
                in_use[mig.uuid] = (processes, processes + 64 * MIB)
    assert len(expected) >= 3, expected

    def rows() -> dict[str, tuple[str, ...]]:
        return {
            m[label("hw.id")]: tuple(m.get(label(c), "") for c in columns)
            for m, _ in _read(cluster, slices_q, node=scenario.node)
            if m[label("hw.id")] in expected
        }

    assert _settled(rows, expected) == expected
    sizes = {mig.uuid: {mig.memory} for g in nvidia_spec(scenario).gpus for mig in g.mig}
    assert _levels(_read(cluster, size_q, node=scenario.node), label("hw.id")) == sizes
    assert sizes["MIG-0b6f4a21-7d3c-5e2a-8f10-000000000101"] == {9984 * MIB}
    used = _latest(cluster, used_q, label("hw.id"), node=scenario.node)
    assert in_use
    for uuid, (low, high) in in_use.items():
        assert low <= used[uuid] < high, (uuid, used)


def test_overview_resources_table_counts_what_the_kubelet_lists(cluster: Cluster) -> None:
    """The overview's `Resources` table on the nodes whose pods never change (numa, mixed):
    allocatable per resource is the scenario's `allocatable` IDs less those its plugin
    reports unhealthy (numa: GPU ...003 from 2 s on, so 3 of 4), allocated the IDs its
    pods hold (numa: 4, the unhealthy GPU staying with its pod); every such resource's
    plugin registered (1), none of them being down in any bundled scenario."""
    allocatable_q, allocated_q, registered_q = _panel("overview", "Resources")
    resource = prometheus_label("hw.allocation.resource")
    checked = []
    for name in SCENARIOS:
        scenario = load_scenario(name)
        handed = holdings(scenario)
        if any(h.pod.start or h.pod.end is not None for h in handed):
            continue
        launched, _ = cluster.started[name]
        now = time.time() - launched
        allocatable = Counter[str]()
        for devices in scenario.allocatable_at(now):
            allocatable[devices.resource_name] += len(devices.device_ids)
        allocated = Counter(h.resource for h in handed)
        registered = dict.fromkeys(allocatable | allocated, 1.0)
        for query, expected in (
            (allocatable_q, allocatable),
            (allocated_q, allocated),
            (registered_q, registered),
        ):
            shown = partial(_latest, cluster, query, resource, node=scenario.node)
            assert _settled(shown, expected) == expected, (name, query.ref)
        checked.append(name)
    assert "numa" in checked, checked


def test_pod_panel_says_how_well_each_pod_uses_its_gpu(cluster: Cluster) -> None:
    """The workloads dashboard's per-pod GPM panel (opt-in: profiling), through the allocation
    join, on the numa node (every group on; demo runs the default groups, so none there):
    three pods each hold a whole H100 with MIG off, busy a constant 0.9, 0.6 and 0.1 of the
    time, so their SMs are active 0.85 x busy and their tensor pipes 0.6 x busy (the
    stand-in's GPM_SHARES), and nobody else is on the panel."""
    loaded = load_scenario("numa")
    nvidia = parse_nvidia(loaded.sections["nvidia"], "numa")
    busy = {g.uuid[-1]: g.utilization.value(0.0) for g in nvidia.gpus}
    holders = {"trainer-aligned": busy["0"], "notebook": busy["1"], "trainer-misaligned": busy["2"]}
    pod = prometheus_label("k8s.pod.name")
    sm, tensor = _panel(
        "workloads",
        "Is the GPU used well? SM and tensor activity per pod (GPM) (opt-in: profiling)",
    )
    want_sm = {name: GPM_SHARES["gpm_sm_s"] * b for name, b in holders.items()}
    got_sm = _settled(lambda: _latest(cluster, sm, pod), want_sm)
    # (the stand-in keeps busy seconds to 1 us: rates over a GPM interval are good to 1e-6)
    assert got_sm == pytest.approx(want_sm, abs=1e-6)
    want_tensor = {name: GPM_SHARES["gpm_tensor_s"] * b for name, b in holders.items()}
    assert _latest(cluster, tensor, pod) == pytest.approx(want_tensor, abs=1e-6)


def test_the_cluster_variable_lists_the_cluster_and_filters_by_it(cluster: Cluster) -> None:
    """Issue 31, item 14: one Prometheus, several clusters. $cluster lists ours; every panel
    query with another cluster chosen comes back empty (none ignores the variable)."""
    for stem in kit.dashboards():
        assert _variable_values(cluster, stem, concrete=True)["cluster"] == CLUSTER
    for query in QUERIES:
        values = {**_variable_values(cluster, query.dashboard, concrete=False), "cluster": "other"}
        expr = _substitute(query.expr, values)
        assert not cluster.query(expr, instant=True) or _only_constants(cluster, expr), (
            f"{query.dashboard}: {query.panel}: shows data of another cluster\n{expr}"
        )


def _only_constants(cluster: Cluster, expr: str) -> bool:
    """`... or vector(0)`: a count that falls back to 0 has no series labels at all."""
    return all(not r["metric"] for r in cluster.query(expr, instant=True))
