"""`kde-simulate demo`: the runner re-execs with LD_LIBRARY_PATH, the
exporter's NVML source loads the simulated library, and /metrics shows GPUs with pods."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import urllib.request

import pytest

from simulator.ports import free_port
from tests.nvml_support import fakenvml

pytestmark = pytest.mark.peer

__all__ = ["fakenvml"]


def _read_lines(proc: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.put(line)
    lines.put(None)


def test_simulate_demo_serves_gpu_metrics(fakenvml: object, tmp_path: object) -> None:
    port = free_port()
    env = {
        k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "KDE_FAKENVML_STATE")
    }
    env["KDE_SIMULATE_WORKDIR"] = str(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "simulator", "demo",
         "--web.listen-address", f"127.0.0.1:{port}",
         "--collect-interval", "1s", "--collect-timeout", "1s"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_read_lines, args=(proc, lines), daemon=True).start()
    seen: list[str] = []
    try:
        while True:
            line = lines.get(timeout=30)
            assert line is not None, "the simulation exited:\n" + "".join(seen)
            seen.append(line)
            if "Metrics:" in line:
                break
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    gpu0 = 'hw_id="GPU-6a3f1c2e-1b7d-4c1e-9a55-000000000000"'
    util = [
        line
        for line in text.splitlines()
        if line.startswith("hw_gpu_utilization_ratio{") and gpu0 in line and "general" in line
    ]
    assert util, "".join(seen) + text[:2000]
    assert 'k8s_pod_name="trainer-0"' in util[0]
    assert 'hw_gpu_mig_profile="3g.40gb"' in text
    assert "kube_device_exporter_source_success{" in text
    success = [line for line in text.splitlines() if 'source="nvml"' in line and "success" in line]
    assert len(success) == 1 and float(success[0].rsplit(" ", 1)[1]) == 1.0, success
