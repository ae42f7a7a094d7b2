"""`kube-device-exporter doctor`: the checks (pure) and the command against a simulated node."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from exporter.checks import (
    ABSENT,
    OK,
    PROBLEM,
    Finding,
    check_source,
    check_unattributed,
    check_unseen,
    source_findings,
    unseen_by_resource,
)
from exporter.cli import doctor as doctor_command
from exporter.cli.flags import parse_config
from exporter.ids import ResourceMatcher
from exporter.model import ContainerDevices, Device, DeviceReading, SourceResult
from exporter.sources.resources import SOURCE_FIXES
from simulator.node import SimulatedNode
from simulator.scenario import load_scenario
from tests.support import StaticSource

GPU0 = "GPU-6a3f1c2e-1b7d-4c1e-9a55-000000000000"


def reading(id_: str, *aliases: str, pools: tuple[str, ...] = ()) -> DeviceReading:
    device = Device(id_, "gpu", "v", "m", "s", aliases=frozenset(aliases), pools=frozenset(pools))
    return DeviceReading(device, ())


def test_unseen_by_resource_uses_the_joins_id_forms() -> None:
    allocatable = [
        ContainerDevices("nvidia.com/gpu", (GPU0, "GPU-gone")),
        ContainerDevices("nvidia.com/gpu.shared", (f"{GPU0}::0", f"{GPU0}::1")),
        ContainerDevices("amd.com/gpu", ("0000:9D:00.0",)),  # any case, short or long domain
        ContainerDevices("rdma/pool_a", ("0", "1")),
        ContainerDevices("rdma/pool_b", ("0",)),
        ContainerDevices("example.com/thing", ("x",)),  # not attributed: not ours to report
    ]
    readings = [
        reading(GPU0),
        reading("8f3a", "0000:9d:00.0"),
        reading("mlx5_0/1", pools=("rdma/pool_a",)),
    ]
    unseen = unseen_by_resource(allocatable, readings, ResourceMatcher())
    assert unseen == {"nvidia.com/gpu": 1, "rdma/pool_b": 1}
    assert unseen_by_resource(allocatable, [], ResourceMatcher(["amd.com/*"])) == {"amd.com/gpu": 1}


def test_each_unseen_resource_names_its_source_and_the_fix() -> None:
    allocatable = [
        ContainerDevices("nvidia.com/gpu", (GPU0,)),
        ContainerDevices("amd.com/gpu", ("0000:9d:00.0",)),
        ContainerDevices("rdma/pool_a", ("0",)),
        ContainerDevices("gpu.intel.com/i915", ("card0-0",)),
    ]
    sources = {
        "nvml": check_source("nvml", error="", absent="libnvidia-ml.so.1 not found", devices=0),
        "rdma": check_source("rdma", error="", absent="", devices=2),
        "intel": check_source("intel", error="", absent="", devices=1),
    }
    findings = {
        f.subject: f
        for f in check_unseen(allocatable, [reading("card0")], ResourceMatcher(), sources)
    }
    nvidia = findings["resource nvidia.com/gpu"]
    assert nvidia.status == PROBLEM and "libnvidia-ml.so.1 not found" in nvidia.cause
    assert "runtimeClassName: nvidia" in nvidia.fix
    assert findings["resource amd.com/gpu"].fix == "turn it on: --collector.amdgpu"
    assert "--collector.rdma.pool-config" in findings["resource rdma/pool_a"].fix
    assert findings["resource gpu.intel.com/i915"] == Finding(
        OK, "resource gpu.intel.com/i915", "1 allocatable, all seen"
    )


def test_an_unseen_resource_of_a_working_source_says_how_to_compare_the_ids() -> None:
    allocatable = [ContainerDevices("nvidia.com/gpu", (GPU0, "GPU-other"))]
    sources = {"nvml": check_source("nvml", error="", absent="", devices=1)}
    (finding,) = check_unseen(allocatable, [reading(GPU0)], ResourceMatcher(), sources)
    assert finding.sentence() == (
        "resource nvidia.com/gpu: 2 allocatable, 1 seen by no source; likely cause: source "
        "nvml sees 1 device, but none answers to these IDs; fix: compare the IDs "
        "`kube-device-exporter podresources` prints with /api/devices; where devices are "
        f"missing there: {SOURCE_FIXES['nvml']}"
    )


def test_gpus_unseen_for_want_of_nvml_point_at_the_gke_overlay_too() -> None:
    allocatable = [ContainerDevices("nvidia.com/gpu", (GPU0,))]
    absent = check_source("nvml", error="", absent="libnvidia-ml.so.1 not found", devices=0)
    (finding,) = check_unseen(allocatable, [], ResourceMatcher(), {"nvml": absent})
    assert finding.cause == "source nvml: no hardware: libnvidia-ml.so.1 not found"
    assert finding.fix.endswith("on GKE use the gke overlay (driver mounts); see docs/deploy.md")


def test_gpus_unseen_because_nvml_hangs_get_the_hang_fix_not_the_mount_fix() -> None:
    allocatable = [ContainerDevices("nvidia.com/gpu", (GPU0,))]
    hung = check_source("nvml", error="previous collection still running", absent="", devices=0)
    (finding,) = check_unseen(allocatable, [], ResourceMatcher(), {"nvml": hung})
    assert finding.sentence() == (
        "resource nvidia.com/gpu: 1 allocatable, 1 seen by no source; likely cause: source "
        "nvml failed: previous collection still running: a driver call hangs (a GPU fallen "
        "off the bus, a driver reset); fix: look for Xid errors in the node's kernel log "
        "(dmesg); raise --collect-timeout only if the source is merely slow"
    )


class Hung(StaticSource):
    """collect() stuck in a driver call until the test ends."""

    def __init__(self, release: threading.Event) -> None:
        super().__init__(SourceResult("hung"))
        self.release = release

    def collect(self) -> SourceResult:
        self.release.wait(30)
        return self.result


class CloseFails(StaticSource):
    def close(self) -> None:
        raise OSError(16, "Device or resource busy")


async def test_doctor_waits_one_timeout_for_all_hung_sources_and_fails_an_unclosable_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release = threading.Event()
    card = DeviceReading(Device("card0", "gpu", "amd", "MI300X", "amdgpu"), ())
    sources = {
        **{f"hung{i}": Hung(release) for i in range(3)},
        "amdgpu": CloseFails(SourceResult("amdgpu", (card,))),
    }
    monkeypatch.setattr(doctor_command, "build_sources", lambda config: sources)
    config = parse_config(["--collect-timeout", "400ms"], env={})
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        healths, readings = await doctor_command._collect_once(config)
    finally:
        release.set()
    elapsed = loop.time() - started
    assert elapsed < 1.0  # one 0.4 s timeout for the three, not three in a row
    by_name = {h.name: h for h in healths}
    assert [by_name[f"hung{i}"].error for i in range(3)] == ["timed out after 0.4s"] * 3
    assert by_name["amdgpu"].error == "close: OSError: [Errno 16] Device or resource busy"
    assert readings == [card]
    finding = source_findings(healths, readings)["amdgpu"]
    assert finding.status == PROBLEM and "Device or resource busy" in finding.found


@pytest.mark.parametrize(
    ("error", "cause", "fix"),
    [
        (
            "NvmlUnavailable: NVML init failed: NVML Shared Library Not Found",
            "libnvidia-ml",
            "runtimeClassName",
        ),
        ("NvmlUnavailable: NVML init failed: Driver Not Loaded", "kernel module", "driver"),
        ("NVML init failed: Insufficient Permissions", "device files", "runtime class"),
        ("timed out after 5s", "hangs", "dmesg"),
    ],
)
def test_source_errors_get_a_likely_cause_and_a_fix(error: str, cause: str, fix: str) -> None:
    finding = check_source("nvml", error=error, absent="", devices=0)
    assert finding.status == PROBLEM
    assert cause in finding.cause and fix in finding.fix


def test_absent_hardware_is_not_a_problem_by_itself() -> None:
    finding = check_source("amdgpu", error="", absent="no amdgpu cards", devices=0)
    assert finding.status == ABSENT


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KDE_", "LD_LIBRARY"))}
    return subprocess.run(
        [sys.executable, "-m", "exporter", "doctor", *args],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip


def lines_about(out: str, subject: str) -> list[str]:
    """The finding line for `subject` and its indented cause/fix lines."""
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if line.split()[1 : 1 + len(subject.split())] == subject.split():
            rest = [line]
            for more in lines[i + 1 :]:
                if not more.startswith(" "):
                    break
                rest.append(more.strip())
            return rest
    raise AssertionError(f"no line about {subject!r} in:\n{out}")


@pytest.mark.peer
async def test_doctor_on_a_healthy_simulated_node_then_a_misconfigured_one(
    tmp_path: Path,
) -> None:
    node = SimulatedNode(load_scenario("mixed"), tmp_path / "node")
    await node.start()
    try:
        args = node.exporter_args()
        healthy = await asyncio.to_thread(doctor, *args)
        off = await asyncio.to_thread(doctor, *args, "--no-collector.amdgpu")
        no_sys = await asyncio.to_thread(doctor, *args, "--path.sysfs", str(tmp_path / "nope"))
    finally:
        await node.stop()
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert "PROBLEM" not in healthy.stdout
    assert lines_about(healthy.stdout, "source amdgpu")[0].split()[0] == "OK"
    assert "PodResources v1, 10 pods" in lines_about(healthy.stdout, "kubelet")[0]
    assert "5 allocatable, all seen" in lines_about(healthy.stdout, "resource amd.com/gpu")[0]

    assert off.returncode == 1
    amd = lines_about(off.stdout, "resource amd.com/gpu")
    assert amd[0].startswith("PROBLEM") and "5 seen by no source" in amd[0]
    assert "fix: turn it on: --collector.amdgpu" in amd

    assert no_sys.returncode == 1
    assert "--path.sysfs" in lines_about(no_sys.stdout, "host sys")[0]
    intel = lines_about(no_sys.stdout, "resource gpu.intel.com/i915")
    assert intel[0].startswith("PROBLEM") and any("--path.sysfs" in x for x in intel)


@pytest.mark.peer
async def test_doctor_when_the_node_advertises_gpus_nvml_cannot_see(tmp_path: Path) -> None:
    """The usual first-hour failure: no runtime class, so no libnvidia-ml.so.1 in the pod."""
    node = SimulatedNode(load_scenario("demo"), tmp_path / "node")  # no library in env
    await node.start()
    try:
        args = [a for a in node.exporter_args() if a != "--no-collector.nvml"]
        done = await asyncio.to_thread(doctor, *args, "--collector.nvml")
        gone = await asyncio.to_thread(
            doctor, "--kubelet-socket", str(tmp_path / "none" / "kubelet.sock")
        )
    finally:
        await node.stop()
    assert done.returncode == 1
    gpu = lines_about(done.stdout, "resource nvidia.com/gpu")
    assert gpu[0].startswith("PROBLEM") and "2 allocatable, 2 seen by no source" in gpu[0]
    assert any("runtimeClassName: nvidia" in x for x in gpu)
    assert gone.returncode == 1
    kubelet = lines_about(gone.stdout, "kubelet")
    assert kubelet[0].startswith("PROBLEM") and "does not exist" in kubelet[0]
    assert any("/var/lib/kubelet/pod-resources" in x for x in kubelet)


def test_resources_no_pattern_attributes_are_a_problem() -> None:
    allocatable = [
        ContainerDevices("nvidia.com/gpu", (GPU0,)),
        ContainerDevices("example.com/fpga", ("f0",)),  # no bundled source: not ours
    ]
    (finding,) = check_unattributed(allocatable, ResourceMatcher(["nvidia.com/mig-*"]))
    assert finding.status == PROBLEM and finding.subject == "resource nvidia.com/gpu"
    assert "(now: nvidia.com/mig-*)" in finding.found
    assert "nvidia.com/*" in finding.fix
    assert check_unattributed(allocatable, ResourceMatcher()) == []


async def test_doctor_says_whether_the_api_and_the_pods_api_answer(tmp_path: Path) -> None:
    """Issue 42, the first apply, item 6: with --kubernetes.api, doctor said nothing of the
    API connection or the Pods API. The loopback API server lists this node's pods; the
    simulated Pods API answers ListPods; then each one missing or denied."""
    from simulator.apiserver import ApiServer
    from tests.support.kubeapi import NODE, pod
    from tests.support.podsapi import FakePodsApi

    server = ApiServer().start()
    pods_api = FakePodsApi(tmp_path / "pods-api.sock")
    for name in ("train", "debug"):
        server.put("pods", pod(name, "ml"))
        pods_api.add(pod(name, "ml"))
    server.put("pods", pod("elsewhere", "ml", node="other-node"))
    await pods_api.start()
    kubeconfig = server.kubeconfig(tmp_path / "kubeconfig")

    def flags(*more: str) -> list[str]:
        return ["--kubernetes.api", "--node-name", NODE, "--kubernetes.kubeconfig",
                str(kubeconfig), "--kubernetes.pods-api-socket", str(pods_api.socket), *more]  # fmt: skip

    try:
        api, kubelet = await doctor_command._ask_kubernetes(parse_config(flags(), env={}))
        await pods_api.stop()  # the socket gone: the API server's watch, said so
        _, gone = await doctor_command._ask_kubernetes(parse_config(flags(), env={}))
        denied_config = server.kubeconfig(tmp_path / "denied", token="not-the-token")
        denied_flags = flags("--kubernetes.kubeconfig", str(denied_config))
        denied, _ = await doctor_command._ask_kubernetes(parse_config(denied_flags, env={}))
    finally:
        await pods_api.stop()
        server.stop()
    unreachable, _ = await doctor_command._ask_kubernetes(parse_config(flags(), env={}))
    assert (api.status, api.found) == (OK, f"{server.url}: 2 pods on node {NODE}")
    assert kubelet.status == OK and kubelet.found.startswith(f"{pods_api.socket}: 2 pods")
    assert gone.status == ABSENT and "pods from the API server's watch" in gone.found
    assert denied.status == PROBLEM and denied.found.startswith("listing this node's pods: 401")
    assert unreachable.status == PROBLEM and "ConnectError" in unreachable.found
    assert unreachable.fix and "KUBERNETES_SERVICE_HOST" in unreachable.fix
    assert await doctor_command._ask_kubernetes(parse_config([], env={})) == []
