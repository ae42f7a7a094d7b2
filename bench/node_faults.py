"""Node faults: the exporter process on a simulated node run here (kubelet, NVML, a static
sysfs copy, an OTLP receiver), so this script can stop the kubelet, unload the driver, write
hostile values into sysfs files and stop the collector, and time detection and recovery by
polling /metrics (bench/faults.py prints the rows)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

from bench.fault_harness import POLL, Metrics, Row, read_metrics, value
from simulator.node import SimulatedNode
from simulator.ports import free_port
from simulator.scenario import parse_scenario
from tests.otlp_receivers import GrpcReceiver
from tests.support.waiting import within

GPU = "GPU-00000000-0000-4000-8000-000000000000"

AMD_A, AMD_B = "0000:03:00.0", "0000:04:00.0"

AMD_A_DEV = "devices/pci0000:00/0000:00:03.0/0000:03:00.0"

HUGE = "9" * 400

NVML_FAULT = (25.0, 31.0)
"""Scenario seconds in which the simulated NVIDIA driver is unloaded."""

NODE = f"""
node: fault-node
kubelet: {{api: v1}}
allocatable:
  - {{resource: nvidia.com/gpu, ids: [{GPU}]}}
  - {{resource: amd.com/gpu, ids: ["{AMD_A}", "{AMD_B}"]}}
pods:
  - name: trainer
    namespace: ml
    containers:
      - name: main
        devices:
          - {{resource: nvidia.com/gpu, ids: [{GPU}]}}
          - {{resource: amd.com/gpu, ids: ["{AMD_A}"]}}
nvidia:
  gpus:
    - uuid: {GPU}
      utilization: {{pattern: sine, min: 0.1, max: 0.9, period: 17}}
  faults:
    - {{kind: driver_unloaded, start: {NVML_FAULT[0]}, end: {NVML_FAULT[1]}}}
sysfs:
  amdgpu:
    - {{pci: "{AMD_A}", card: 1, busy_percent: 37, vram_gib: 64, vram_used_gib: 1.5,
        power_w: 120, temperature_c: {{edge: 41}}, pcie_replays: 9, ras: {{umc: {{ue: 1, ce: 4}}}}}}
    - {{pci: "{AMD_B}", card: 2, busy_percent: 50, vram_gib: 64, vram_used_gib: 2,
        power_w: 100, temperature_c: {{edge: 40}}, pcie_replays: 1}}
"""


def device_series(m: Metrics, device: str) -> int:
    return sum(1 for series in m.values() for labels, _ in series if labels.get("hw_id") == device)


class NodeTarget:
    """The exporter process on a simulated node this script controls."""

    def __init__(self, workdir: Path, receiver: GrpcReceiver) -> None:
        self.node = SimulatedNode(parse_scenario(NODE, name="faults"), workdir)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.receiver = receiver
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.http = aiohttp.ClientSession()

    async def start(self) -> None:
        await self.node.start()
        self.proc = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        args = [*self.node.exporter_args(), "--collect-interval", "1s",
                "--web.listen-address", f"127.0.0.1:{self.port}",
                "--otlp.endpoint", self.receiver.endpoint,
                "--metrics.group.interconnect"]  # fmt: skip  # PCIe replays (sysfs_u64_glitch)
        log = (self.workdir / "exporter.log").open("w")
        return subprocess.Popen(
            [sys.executable, "-m", "exporter", *args],
            env={**os.environ, **self.node.env()}, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    async def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(20)
        await self.http.close()
        await self.node.stop()

    async def until(self, check: Callable[[Metrics], bool], timeout: float = 60.0) -> float:
        """Seconds until /metrics satisfies `check` (polled every 100 ms)."""

        async def satisfied() -> bool:
            return check(await read_metrics(self.http, self.url))

        took = await within(satisfied, timeout, POLL)
        if took is None:
            raise TimeoutError(f"not within {timeout:g}s")
        return took

    def tick_nvml(self) -> None:
        """Advance only the NVML part: the sysfs copy stays static, as this script writes it."""
        t = self.node.clock()
        for part in self.node.parts:
            if type(part).__module__ == "simulator.nvml":
                part.advance(t)


async def kubelet_restart(t: NodeTarget) -> Row:
    up = "kube_device_exporter_podresources_up"
    await t.node.kubelet.stop()
    detected = await t.until(lambda m: value(m, up) == 0.0)
    await asyncio.sleep(3)
    m = await read_metrics(t.http, t.url)
    kept = len(m.get("hw_allocation_info", []))
    await t.node.kubelet.start()
    recovered = await t.until(lambda m: value(m, up) == 1.0)
    return Row(
        "kubelet stopped for 3 s, then started again (new socket)",
        f"podresources_up 0 within {detected:.1f} s; {kept} allocation series kept meanwhile "
        "(--kubernetes.stale-after)",
        f"{recovered:.1f} s from restart to podresources_up 1",
    )


async def nvml_driver_reload(t: NodeTarget) -> Row:
    ok = "kube_device_exporter_source_success"

    async def ticker(stop: asyncio.Event) -> None:
        while not stop.is_set():
            t.tick_nvml()
            await asyncio.sleep(0.2)

    stop = asyncio.Event()
    ticking = asyncio.create_task(ticker(stop))
    try:
        await asyncio.sleep(max(0.0, NVML_FAULT[0] - t.node.clock()))
        detected = await t.until(lambda m: value(m, ok, source="nvml") == 0.0)
        await asyncio.sleep(max(0.0, NVML_FAULT[1] - t.node.clock()))
        recovered = await t.until(
            lambda m: value(m, ok, source="nvml") == 1.0 and device_series(m, GPU) > 1
        )
    finally:
        stop.set()
        await ticking
    return Row(
        f"NVIDIA driver unloaded for {NVML_FAULT[1] - NVML_FAULT[0]:g} s (NVML init fails)",
        f"source_success{{source=nvml}} 0 within {detected:.1f} s; AMD series unaffected",
        f"{recovered:.1f} s from driver back to the GPU's series back",
    )


async def sysfs_u64_glitch(t: NodeTarget) -> Row:
    replays = t.node.workdir / "sysfs" / AMD_A_DEV / "pcie_replay_count"
    name, labels = "hw_errors_total", {"hw_id": AMD_A, "error_type": "pcie_replay"}
    errors = "kube_device_exporter_source_field_errors_total"
    m = await read_metrics(t.http, t.url)
    before, errors_before = value(m, name, **labels), value(m, errors, source="amdgpu") or 0.0
    replays.write_text("18446744073709551615\n")
    worst = before or 0.0
    started = time.monotonic()
    while time.monotonic() - started < 3.0:
        worst = max(worst, value(await read_metrics(t.http, t.url), name, **labels) or 0.0)
        await asyncio.sleep(POLL)
    replays.write_text("10\n")
    recovered = await t.until(lambda m: value(m, name, **labels) == 10.0)
    m = await read_metrics(t.http, t.url)
    counted = (value(m, errors, source="amdgpu") or 0.0) - errors_before
    return Row(
        "18446744073709551615 (all ones) in pcie_replay_count for 3 s",
        f"counter stayed at {worst:g} (was {before:g}), never 1.8e19; {counted:g} field errors",
        f"{recovered:.1f} s from a good value (10) to the counter showing it",
    )


async def sysfs_huge_integer(t: NodeTarget) -> Row:
    busy = t.node.workdir / "sysfs" / AMD_A_DEV / "gpu_busy_percent"
    ok = "kube_device_exporter_source_success"
    util = "hw_gpu_utilization_ratio"
    m = await read_metrics(t.http, t.url)
    a, b, original = device_series(m, AMD_A), device_series(m, AMD_B), busy.read_text()
    busy.write_text(HUGE + "\n")
    await t.until(lambda m: value(m, util, hw_id=AMD_A) is None)
    m = await read_metrics(t.http, t.url)
    during = (device_series(m, AMD_A), device_series(m, AMD_B), value(m, ok, source="amdgpu"))
    busy.write_text(original)
    recovered = await t.until(lambda m: value(m, util, hw_id=AMD_A) is not None)
    return Row(
        "a 400-digit integer in gpu_busy_percent",
        f"amdgpu source_success {during[2]:g}; GPU A series {a} -> {during[0]} (its utilization "
        f"only), GPU B {b} -> {during[1]}",
        f"{recovered:.1f} s from a good value to the series back",
    )


async def otlp_collector_down(t: NodeTarget) -> Row:
    batches = "kube_device_exporter_export_batches_total"
    port = t.receiver.port
    t.receiver.stop()
    failed = await t.until(lambda m: (value(m, batches, result="failure") or 0) > 0)
    await asyncio.sleep(5)
    started = time.monotonic()
    t.receiver = GrpcReceiver(port=port)
    await asyncio.to_thread(t.receiver.wait_for, 1, 60.0)
    recovered = time.monotonic() - started
    m = await read_metrics(t.http, t.url)
    return Row(
        "OTLP collector stopped for 5 s, then started again on the same port",
        f"failed exports counted within {failed:.1f} s "
        f"({value(m, batches, result='failure'):g} failed export(s)); /metrics unaffected",
        f"{recovered:.1f} s from collector back to the first export received",
    )


async def node_faults() -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="kde-node-faults-") as tmp:
        t = NodeTarget(Path(tmp), GrpcReceiver())
        try:
            await t.start()
            await t.until(lambda m: value(m, "kube_device_exporter_podresources_up") == 1.0)
            rows = [
                await kubelet_restart(t),
                await sysfs_u64_glitch(t),
                await sysfs_huge_integer(t),
                await otlp_collector_down(t),
                await nvml_driver_reload(t),
            ]
        finally:
            await t.stop()
            t.receiver.stop()
    return rows
