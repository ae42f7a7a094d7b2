"""The NVML source on a real NVIDIA driver, when this machine has one.

Runs in a subprocess: the test process may already hold the simulated library. Without a
driver the test is skipped with the reason; run it on a GPU machine with
`pytest -q -s tests/test_nvml_real.py` (it prints the cycle cost it measured).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from simulator.nvml import STATE_ENV
from tests.nvml_support import NvidiaNode, fakenvml, nvidia_node

__all__ = ["fakenvml", "nvidia_node"]

SCRIPT = r"""
import json, statistics
from simulator.nvml import measure_collect
from exporter.sources import SourceContext
from exporter.sources.nvml import NvmlSource

source = NvmlSource(SourceContext())
source.collect()
result = source.collect()
source.close()
durations = measure_collect(None, cycles=20, interval=0)
print(json.dumps({
    "devices": [
        {"id": r.device.id, "parent": r.device.parent, "model": r.device.model,
         "attributes": dict(r.device.attributes),
         "metrics": sorted({s.metric for s in r.samples}),
         "status": [dict(s.attributes)["hw.state"] for s in r.samples
                    if s.metric == "hw.status" and s.value == 1]}
        for r in result.readings
    ],
    "field_errors": result.field_errors,
    "first_ms": durations[0] * 1e3,
    "median_ms": statistics.median(durations[1:]) * 1e3,
    "max_ms": max(durations[1:]) * 1e3,
}))
"""


def run_report(env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    report: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    print(json.dumps(report, indent=1))
    return report


def check_report(report: dict[str, Any]) -> None:
    assert report["devices"], "the driver reported no GPU"
    for device in report["devices"]:
        assert device["id"].startswith(("GPU-", "MIG-"))
        assert device["status"] in (["ok"], ["degraded"])
        assert "hw.gpu.memory.limit" in device["metrics"]
        if not device["parent"]:
            assert device["attributes"]["hw.pci.bus_id"]
            assert "hw.power" in device["metrics"] or "hw.energy" in device["metrics"]
    assert report["median_ms"] < 1000


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", STATE_ENV)}


@pytest.mark.skipif(
    not Path("/dev/nvidiactl").exists(), reason="no NVIDIA driver here (/dev/nvidiactl)"
)
@pytest.mark.peer
def test_the_source_reads_the_real_driver() -> None:
    check_report(run_report(clean_env()))


@pytest.mark.peer
def test_the_same_check_passes_on_the_simulated_driver(
    nvidia_node: Callable[[str], NvidiaNode],
) -> None:
    """Keeps the real-driver check honest where no GPU is: same script, same assertions,
    the simulated library found through LD_LIBRARY_PATH by the exporter's own source."""
    node = nvidia_node("demo")
    report = run_report({**clean_env(), **node.part.env()})
    check_report(report)
    assert len(report["devices"]) == 8


GPM_SCRIPT = r"""
import json, time
from exporter.sources import SourceContext
from exporter.sources.nvml import NvmlSource

source = NvmlSource(SourceContext(options={"gpm-interval": "1s"}))
source.collect()  # the first GPM sample of each device
time.sleep(1.5)  # nvml.h: samples over 100 ms apart
result = source.collect()
source.close()
print(json.dumps([
    {"id": r.device.id, "mig_mode": any(d.device.parent == r.device.id for d in result.readings),
     "gpm": {" ".join([s.metric, *(v for _, v in s.attributes)]): s.value for s in r.samples
             if s.metric.startswith(("hw.gpu.sm.", "hw.gpu.tensor.", "hw.gpu.pipe.",
                                     "hw.gpu.dram.", "hw.gpu.graphics.", "hw.gpu.pcie.t",
                                     "hw.gpu.nvlink.t"))}}
    for r in result.readings
]))
"""


def run_gpm(env: dict[str, str]) -> list[dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, "-c", GPM_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    devices: list[dict[str, Any]] = json.loads(out.stdout.strip().splitlines()[-1])
    print(json.dumps(devices, indent=1))
    return devices


def check_gpm(devices: list[dict[str, Any]]) -> None:
    """Every GPU with MIG off that has GPM reports the profiling series, ratios in 0..1 and
    byte rates >= 0 (what issue 28 asks to quote from a real H100)."""
    whole = [d for d in devices if d["id"].startswith("GPU-") and not d["mig_mode"]]
    with_gpm = [d for d in whole if d["gpm"]]
    assert with_gpm, "no GPU with MIG off reported GPM (pre-Hopper? then this check is moot)"
    for device in with_gpm:
        for name in ("hw.gpu.sm.activity", "hw.gpu.sm.occupancy", "hw.gpu.tensor.activity"):
            assert 0.0 <= device["gpm"][name] <= 1.0, (device["id"], name)
        assert device["gpm"]["hw.gpu.pcie.throughput transmit"] >= 0


@pytest.mark.skipif(
    not Path("/dev/nvidiactl").exists(), reason="no NVIDIA driver here (/dev/nvidiactl)"
)
@pytest.mark.peer
def test_gpm_on_the_real_driver() -> None:
    check_gpm(run_gpm(clean_env()))


@pytest.mark.peer
def test_the_same_gpm_check_passes_on_the_simulated_driver(
    nvidia_node: Callable[[str], NvidiaNode],
) -> None:
    """The stand-in's time follows the wall clock while the script runs (a thread moves it),
    so its two GPM samples 1.5 s apart have a rate, as a real driver's do."""
    node = nvidia_node("demo")
    done = threading.Event()

    def advance() -> None:
        started = time.monotonic()
        while not done.wait(0.05) and time.monotonic() - started < 120:
            node.at(10.0 + time.monotonic() - started)

    mover = threading.Thread(target=advance, daemon=True)
    mover.start()
    try:
        devices = run_gpm({**clean_env(), **node.part.env()})
    finally:
        done.set()
        mover.join(timeout=5)
    check_gpm(devices)
    gpu3 = next(d for d in devices if d["id"].endswith("000000000003"))  # 25 % busy
    assert gpu3["gpm"]["hw.gpu.sm.activity"] == pytest.approx(0.85 * 0.25, abs=1e-3)
