"""What a real node does to the whole process: a driver call hung at SIGTERM, a driver
upgraded under us, a node without NVIDIA hardware, a GPU node whose pod has no NVML.

Each runs `kde-simulate` (the exporter against the simulated kubelet,
NVML and sysfs) as its own process, as the DaemonSet runs it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from simulator.ports import free_port

pytestmark = pytest.mark.peer

GPU0 = "GPU-00000000-0000-4000-8000-000000000000"


def get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


class Running:
    def __init__(self, proc: subprocess.Popen[str], port: int) -> None:
        self.proc = proc
        self.url = f"http://127.0.0.1:{port}/"

    def wait_for(self, path: str, predicate: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        body = ""
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.stdout.read() if self.proc.stdout else ""
            try:
                _, body = get(self.url + path)
            except OSError:
                body = ""
            if predicate in body:
                return body
            time.sleep(0.2)
        raise AssertionError(f"{path} never showed {predicate!r}; last:\n{body[-2000:]}")


@pytest.fixture
def simulate(tmp_path: Path) -> Iterator[object]:
    started: list[subprocess.Popen[str]] = []

    def run(scenario: str, *flags: str) -> Running:
        path = tmp_path / f"scenario{len(started)}.yaml"
        path.write_text(scenario)
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("KDE_")}
        env["KDE_SIMULATE_WORKDIR"] = str(tmp_path / f"work{len(started)}")
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "simulator", str(path)),
                *("--web.listen-address", f"127.0.0.1:{port}", "--collect-interval", "500ms"),
                *flags,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        started.append(proc)
        return Running(proc, port)

    yield run
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


HUNG = f"""
node: hung-node
allocatable: [{{resource: nvidia.com/gpu, ids: [{GPU0}]}}]
nvidia:
  gpus: [{{uuid: {GPU0}}}]
  faults: [{{kind: slow, function: nvmlDeviceGetPowerUsage, ms: 600000, start: 3}}]
"""


def test_sigterm_ends_the_process_within_10s_behind_a_hung_driver_call(simulate: object) -> None:
    assert callable(simulate)
    node: Running = simulate(HUNG, "--collect-timeout", "300ms")
    node.wait_for("metrics", 'kube_device_exporter_source_success{k8s_node_name="hung-node"')
    # from t=3 the power call hangs for ten minutes: the source fails, /metrics answers
    node.wait_for("metrics", 'source_success{k8s_node_name="hung-node",source="nvml"} 0.0')
    for _ in range(5):
        started = time.monotonic()
        status, body = get(node.url + "metrics", timeout=2.0)
        assert status == 200 and time.monotonic() - started < 2.0
        assert 'source="nvml"} 0.0' in body
        time.sleep(0.2)
    started = time.monotonic()
    node.proc.send_signal(signal.SIGTERM)
    node.proc.wait(timeout=30)
    took = time.monotonic() - started
    assert took < 10.0, f"exit took {took:.1f}s"
    assert node.proc.returncode == 0


UPGRADED = f"""
node: upgrade-node
allocatable: [{{resource: nvidia.com/gpu, ids: [{GPU0}]}}]
nvidia:
  driver_version: "570.86.15"
  gpus: [{{uuid: {GPU0}}}]
  faults: [{{kind: driver_upgraded, start: 2, end: 3, version: "580.95.05"}}]
"""


def test_a_driver_upgrade_turns_healthz_unhealthy_within_restart_after(simulate: object) -> None:
    assert callable(simulate)
    node: Running = simulate(UPGRADED, "--collector.nvml.restart-after", "2s")
    node.wait_for("metrics", 'source="nvml"} 1.0')
    assert get(node.url + "healthz") == (200, "ok\n")
    started = time.monotonic()
    body = node.wait_for("healthz", "restart required", timeout=20)
    # the driver went away at t=2; 2 s of failing after that, plus one cycle
    assert time.monotonic() - started < 8.0
    assert "nvml: " in body and "NVML/RM version mismatch" in body
    status, _ = get(node.url + "healthz")
    assert status == 503
    assert get(node.url + "readyz")[0] == 200  # still serving what it has


AMD_ONLY = """
node: amd-node
allocatable: [{resource: amd.com/gpu, ids: ["0000:c1:00.0"]}]
pods:
  - name: trainer
    namespace: ml
    containers: [{name: main, devices: [{resource: amd.com/gpu, ids: ["0000:c1:00.0"]}]}]
sysfs:
  amdgpu:
    - {pci: "0000:c1:00.0", card: 1, product: "AMD Instinct MI300X OAM", vram_gib: 192}
"""


def test_an_amd_node_without_nvidia_is_healthy_with_no_failed_source(simulate: object) -> None:
    assert callable(simulate)
    node: Running = simulate(AMD_ONLY)
    body = node.wait_for("metrics", "hw_gpu_memory_limit_bytes")
    assert get(node.url + "readyz")[0] == 200
    success = [line for line in body.splitlines() if "source_success{" in line]
    assert success and all(line.endswith(" 1.0") for line in success), success
    assert any('source="nvml"' in line for line in success)  # on, and absent is success
    assert 'k8s_pod_name="trainer"' in body
    assert 'kube_device_exporter_devices_unseen{hw_allocation_resource="amd.com/gpu"' in body
    assert 'hw_allocation_resource="amd.com/gpu",k8s_node_name="amd-node"} 0.0' in body


NO_NVML = f"""
node: gpu-node
allocatable: [{{resource: nvidia.com/gpu, ids: [{GPU0}, GPU-00000000-0000-4000-8000-000000000001]}}]
pods:
  - name: job
    namespace: ml
    containers: [{{name: main, devices: [{{resource: nvidia.com/gpu, ids: [{GPU0}]}}]}}]
"""


def test_a_gpu_node_whose_pod_has_no_nvml_is_loud(simulate: object) -> None:
    assert callable(simulate)
    node: Running = simulate(NO_NVML)
    body = node.wait_for("metrics", "kube_device_exporter_devices_unseen")
    assert (
        'kube_device_exporter_devices_unseen{hw_allocation_resource="nvidia.com/gpu",'
        'k8s_node_name="gpu-node"} 2.0'
    ) in body
    time.sleep(1.5)  # several cycles: still one warning
    node.proc.send_signal(signal.SIGTERM)
    out, _ = node.proc.communicate(timeout=30)
    warnings = [line for line in out.splitlines() if "seen by no source" in line]
    assert len(warnings) == 1, out
    assert "runtimeClassName: nvidia" in warnings[0] and "docs/deploy.md" in warnings[0]
