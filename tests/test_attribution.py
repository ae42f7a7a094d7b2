"""Process attribution end to end: the simulated node's host /proc and container-log links,
the real NVML source over the stand-in driver, the poller, /metrics and OTLP."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.app import build_sources
from exporter.attribution.resolver import ProcessResolver, start_time
from exporter.cli.flags import parse_config
from exporter.model import Owner, Snapshot
from simulator import nvml as simnvml
from simulator.node import SimulatedNode
from simulator.procfs import container_id, pod_uid
from simulator.scenario import parse_scenario
from tests.nvml_support import fakenvml  # noqa: F401 - fixture
from tests.otlp_receivers import GrpcReceiver, points_of
from tests.otlp_snapshots import sink_for
from tests.support import Clock, metrics_text, one_cycle

GPU = "GPU-6a3f1c2e-1b7d-4c1e-9a55-000000000002"
GIB = 2**30

SHARED = f"""
node: shared-node
allocatable:
  - {{resource: nvidia.com/gpu, ids: ["{GPU}::0", "{GPU}::1"]}}
pods:
  - name: alpha
    namespace: team-a
    containers:
      - {{name: train, pids: [1001], devices: [{{resource: nvidia.com/gpu, ids: ["{GPU}::0"]}}]}}
  - name: beta
    namespace: team-b
    containers:
      - {{name: train, pids: [1002, 1003], devices: [{{resource: nvidia.com/gpu, ids: ["{GPU}::1"]}}]}}
      - {{name: sidecar}}
  - name: gamma
    namespace: team-c
    containers:
      - {{name: notebook, pids: [1004]}}
procfs:
  cgroup: {{cgroup}}
  driver: {{driver}}
  runtime: {{runtime}}
  cgroupns: {{cgroupns}}
  host_processes: [900]
nvidia:
  pid_namespace: {{pid_namespace}}
  gpus:
    - uuid: {GPU}
      processes:
        - {{pid: 1001, memory: 10GiB, utilization: 0.3}}
        - {{pid: 1002, memory: 12GiB, utilization: 0.2}}
        - {{pid: 1003, memory: 8GiB, utilization: 0.1}}
        - {{pid: 1004, memory: 2GiB, utilization: 0.05}}
        - {{pid: 900, memory: 1GiB, utilization: 0.01}}
        - {{pid: 4000, memory: 3GiB}}
"""
"""Alpha's process uses 10 GiB, beta's two 20 GiB; gamma requested nothing; PID 900 is a
host process, PID 4000 one the host /proc does not show (gone, or not resolvable)."""


async def cycle(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    pid_namespace: str = "host",
    cgroup: str = "v2",
    driver: str = "systemd",
    runtime: str = "containerd",
    cgroupns: str = "true",
    process_series: bool = True,
    args: tuple[str, ...] = (),
) -> Snapshot:
    text = SHARED
    for key, value in (
        ("pid_namespace", pid_namespace),
        ("cgroup", cgroup),
        ("driver", driver),
        ("runtime", runtime),
        ("cgroupns", cgroupns),
    ):
        text = text.replace(f"{{{key}}}", value)
    scenario = parse_scenario(text, name="shared")
    clock = Clock()
    node = SimulatedNode(scenario, tmp_path / "node", clock=clock)
    monkeypatch.setenv(simnvml.STATE_ENV, node.env()[simnvml.STATE_ENV])
    config = parse_config([*node.exporter_args(), *args], env={})
    sources = build_sources(config, clock=clock)
    resolver = ProcessResolver(config.procfs, config.container_logs)
    try:
        clock.now = 1.0
        node.advance()
        for source in sources.values():
            source.collect()
        clock.now = 11.0  # the slow values (process utilization) are read again
        node.advance()
        return await one_cycle(
            scenario,
            tmp_path / "kubelet.sock",
            sources,
            t=11.0,
            resolver=resolver,
            process_series=process_series,
        )
    finally:
        for source in sources.values():
            source.close()
        for part in node.parts:
            part.close()


def series(text: str, name: str) -> dict[tuple[str, str, str], tuple[dict[str, str], float]]:
    """(namespace, pod, container) -> (labels, value) of one metric in /metrics text."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                key = (
                    s.labels.get("k8s_namespace_name", ""),
                    s.labels.get("k8s_pod_name", ""),
                    s.labels.get("k8s_container_name", ""),
                )
                assert key not in out, f"{name}: two series for {key}"
                out[key] = (s.labels, s.value)
    return out


NO_POD = ("", "", "")


@pytest.mark.parametrize(
    "layout",
    [
        ("v2", "systemd", "containerd", "true"),
        ("v2", "cgroupfs", "crio", "false"),
        ("v1", "systemd", "docker", "false"),
        ("v1", "cgroupfs", "containerd", "true"),
    ],
)
async def test_time_sliced_gpu_split_per_pod(
    tmp_path: Path,
    fakenvml: ctypes.CDLL,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    layout: tuple[str, str, str, str],
) -> None:
    """Two pods time-slice one GPU (`::0`, `::1`), in every cgroup layout a node can have."""
    cgroup, driver, runtime, cgroupns = layout
    snapshot = await cycle(
        tmp_path, monkeypatch, cgroup=cgroup, driver=driver, runtime=runtime, cgroupns=cgroupns
    )
    assert snapshot.attribution
    text = metrics_text(snapshot)
    memory = series(text, "hw_gpu_container_memory_usage_bytes")
    assert {k: v for k, (_, v) in memory.items()} == {
        ("team-a", "alpha", "train"): 10 * GIB,
        ("team-b", "beta", "train"): 20 * GIB,
        ("team-c", "gamma", "notebook"): 2 * GIB,
        NO_POD: 4 * GIB,  # the host process and the unresolvable one: kept, not dropped
    }
    alpha = memory[("team-a", "alpha", "train")][0]
    assert alpha["hw_id"] == GPU
    assert alpha["k8s_pod_uid"] == pod_uid("team-a", "alpha")
    assert alpha["hw_allocation_requested"] == "true"
    assert memory[("team-c", "gamma", "notebook")][0]["hw_allocation_requested"] == "false"
    assert "hw_allocation_requested" not in memory[NO_POD][0]
    # The per-pod sums are the device's process total, process by process.
    processes = series_by_pid(text, "hw_gpu_process_memory_usage_bytes")
    assert sum(processes.values()) == sum(v for _, v in memory.values()) == 36 * GIB
    counts = series(text, "hw_gpu_container_processes")
    assert counts[("team-b", "beta", "train")][1] == 2
    assert counts[NO_POD][1] == 2
    util = series(text, "hw_gpu_container_utilization_ratio")
    assert util[("team-b", "beta", "train")][1] == pytest.approx(0.3)
    assert util[("team-a", "alpha", "train")][1] == pytest.approx(0.3)


def series_by_pid(text: str, name: str) -> dict[str, float]:
    return {
        s.labels["process_pid"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


async def test_otlp_carries_the_same_per_pod_series(
    tmp_path: Path,
    fakenvml: ctypes.CDLL,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    snapshot = await cycle(tmp_path, monkeypatch)
    receiver = GrpcReceiver()
    sink = sink_for(receiver.endpoint, node="shared-node")
    sink.start()
    try:
        sink.update(snapshot)
        sink.force_flush()
    finally:
        sink.shutdown()
        receiver.stop()
    pushed = {
        (
            p.attributes.get("k8s.namespace.name", ""),
            p.attributes.get("k8s.pod.name", ""),
            p.attributes["hw.id"],
        ): p.value
        for p in points_of(receiver.accepted())
        if p.metric == "hw.gpu.container.memory.usage"
    }
    assert pushed == {
        ("team-a", "alpha", GPU): 10 * GIB,
        ("team-b", "beta", GPU): 20 * GIB,
        ("team-c", "gamma", GPU): 2 * GIB,
        ("", "", GPU): 4 * GIB,
    }


async def test_own_pid_namespace_splits_utilization_and_says_nothing_of_memory(
    tmp_path: Path,
    fakenvml: ctypes.CDLL,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The DaemonSet as shipped (no hostPID): the driver lists no process, its utilization
    samples carry host PIDs; per-pod utilization, and no memory series (not 0)."""
    snapshot = await cycle(tmp_path, monkeypatch, pid_namespace="own")
    text = metrics_text(snapshot)
    assert series(text, "hw_gpu_container_memory_usage_bytes") == {}
    util = {k: v for k, (_, v) in series(text, "hw_gpu_container_utilization_ratio").items()}
    assert util == {
        ("team-a", "alpha", "train"): pytest.approx(0.3),
        ("team-b", "beta", "train"): pytest.approx(0.3),
        ("team-c", "gamma", "notebook"): pytest.approx(0.05),
        NO_POD: pytest.approx(0.01),  # PID 4000 is idle: no sample, not seen at all
    }


async def test_process_series_are_opt_in(
    tmp_path: Path,
    fakenvml: ctypes.CDLL,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    snapshot = await cycle(tmp_path, monkeypatch, process_series=False)
    text = metrics_text(snapshot)
    assert "hw_gpu_process_memory_usage_bytes{" not in text
    assert series(text, "hw_gpu_container_memory_usage_bytes")


async def test_without_container_logs_attribution_is_off_and_said_once(
    tmp_path: Path,
    fakenvml: ctypes.CDLL,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    snapshot = await cycle(
        tmp_path, monkeypatch, args=("--path.container-logs", str(tmp_path / "absent"))
    )
    text = metrics_text(snapshot)
    assert not snapshot.attribution
    assert "kube_device_exporter_attribution_enabled{" in text
    assert series(text, "kube_device_exporter_attribution_enabled")[NO_POD][1] == 0
    assert series(text, "hw_gpu_container_memory_usage_bytes") == {}
    # everything else as before: the device and its two holders
    assert any(line.startswith("hw_gpu_memory_usage_bytes{") for line in text.splitlines())
    assert len(series_by_holder(text)) == 2
    warnings = [r for r in caplog.records if "attribution is off" in r.getMessage()]
    assert len(warnings) == 1 and "--path.container-logs" in warnings[0].getMessage()


def series_by_holder(text: str) -> set[str]:
    return {
        s.labels["k8s_pod_name"]
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "hw_allocation_info"
    }


# --- the resolver on its own ------------------------------------------------------------


def _proc(root: Path, pid: int, started: int, cgroup: str) -> None:
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "stat").write_text(
        f"{pid} (a b) c) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {started} 0 0\n"
    )
    (root / str(pid) / "cgroup").write_text(cgroup)


def test_a_reused_pid_is_a_new_process(tmp_path: Path) -> None:
    proc, logs = tmp_path / "proc", tmp_path / "containers"
    logs.mkdir()
    uid = "8c1e2f3a-4b5c-4d6e-8f70-123456789abc"
    first, second = container_id("a", "p", "c"), container_id("b", "q", "c")
    for ns, pod, cid in (("a", "p", first), ("b", "q", second)):
        os.symlink("/var/log/pods/x", logs / f"{pod}_{ns}_c-{cid}.log")
    _proc(proc, 42, 500, f"0::/kubepods/pod{uid}/{first}\n")
    resolver = ProcessResolver(proc, logs)
    owners = resolver.resolve([42])
    assert owners is not None and owners[42].pod == "p"
    # Same start time: the cached cgroup is used even if the file now says otherwise.
    (proc / "42" / "cgroup").write_text(f"0::/kubepods/pod{uid}/{second}\n")
    owners = resolver.resolve([42])
    assert owners is not None and owners[42].pod == "p"
    # A new start time: a new process behind the same PID.
    _proc(proc, 42, 900, f"0::/kubepods/pod{uid}/{second}\n")
    owners = resolver.resolve([42])
    assert owners is not None and (owners[42].namespace, owners[42].pod) == ("b", "q")
    # Gone: no owner, and a process whose container has no link yet has none either.
    (proc / "42" / "stat").unlink()
    _proc(proc, 43, 1, f"0::/kubepods/pod{uid}/{'e' * 64}\n")
    assert resolver.resolve([42, 43]) == {}


def test_an_owner_is_made_again_when_its_process_or_its_log_link_changes(tmp_path: Path) -> None:
    """The resolver hands on last cycle's owner object while the process and the listing
    are the same; a new link for the container, a new process behind the PID, or the PID
    gone each give the answer a fresh resolver gives."""
    proc, logs = tmp_path / "proc", tmp_path / "containers"
    logs.mkdir()
    uid = "8c1e2f3a-4b5c-4d6e-8f70-123456789abc"
    first, second = container_id("a", "p", "c"), container_id("b", "q", "c")
    _proc(proc, 42, 500, f"0::/kubepods/pod{uid}/{first}\n")
    _proc(proc, 43, 600, f"0::/kubepods/pod{uid}/{second}\n")
    resolver = ProcessResolver(proc, logs)

    def fresh(pids: list[int]) -> dict[int, Owner] | None:
        return ProcessResolver(proc, logs).resolve(pids)

    assert resolver.resolve([42, 43]) == fresh([42, 43]) == {}  # no links yet
    link = logs / f"p_a_c-{first}.log"
    os.symlink("/var/log/pods/x", link)
    owners = resolver.resolve([42, 43])
    assert owners == fresh([42, 43]) and owners is not None and owners[42].pod == "p"
    again = resolver.resolve([42, 43])
    assert again is not None and again[42] is owners[42]  # nothing changed: the same owner
    link.unlink()  # the link made again under other names (a new listing)
    os.symlink("/var/log/pods/x", logs / f"p2_a2_c2-{first}.log")
    os.symlink("/var/log/pods/x", logs / f"q_b_c-{second}.log")
    owners = resolver.resolve([42, 43])
    assert owners == fresh([42, 43])
    assert owners is not None and (owners[42].namespace, owners[42].pod) == ("a2", "p2")
    _proc(proc, 42, 900, f"0::/kubepods/pod{uid}/{second}\n")  # the PID reused
    owners = resolver.resolve([42, 43])
    assert owners == fresh([42, 43]) and owners is not None and owners[42].pod == "q"
    (proc / "43" / "stat").unlink()  # gone
    assert resolver.resolve([42, 43]) == fresh([42, 43]) == {42: owners[42]}
    other = "0a1b2c3d-4e5f-4a6b-8c7d-0123456789ab"  # a new process: another pod's cgroup
    _proc(proc, 42, 1000, f"0::/kubepods/pod{other}/{second}\n")
    owners = resolver.resolve([42])
    assert owners == fresh([42]) and owners is not None and owners[42].pod_uid == other


@pytest.mark.parametrize(
    ("stat", "expected"),
    [
        ("42 (python3) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 777 0 0", 777),
        ("42 (a) b) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 12 0", 12),
        ("42 (x) S 1 2", None),
        ("42 x S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 777", None),
        ("", None),
    ],
)
def test_start_time(stat: str, expected: int | None) -> None:
    assert start_time(stat) == expected


def test_a_pods_own_proc_is_refused(tmp_path: Path) -> None:
    """/proc of the exporter's own PID namespace shows other PIDs than the drivers give,
    unless that namespace is the host's."""
    from exporter.attribution.resolver import PID_NS_INIT_INO, own_pid_namespace

    host = os.stat("/proc/self/ns/pid").st_ino == PID_NS_INIT_INO
    assert (own_pid_namespace(Path("/proc")) == "") == host
    assert own_pid_namespace(tmp_path) == ""  # a tree without `self`
