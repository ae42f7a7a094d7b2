"""Fault and load runs against a real exporter process (loopback only); prints a markdown table.

    python -m bench.faults            short runs (a minute or so)
    python -m bench.faults --soak     make soak: the long versions (about 12 minutes)

Two targets, both exporter processes on 127.0.0.1:
- node faults: the exporter on a simulated node run here (kubelet, NVML, a static sysfs copy,
  an OTLP receiver), so this script can stop the kubelet, unload the driver, write hostile
  values into sysfs files and stop the collector, and time detection and recovery by polling
  /metrics;
- client faults: `kde-simulate demo`, attacked with scrapers, idle,
  slowloris and malformed connections, then soaked.
Each row says what was done, what happened and how long the exporter took to be whole again;
docs/reliability.md quotes the output.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from simulator.node import SimulatedNode
from simulator.ports import free_port
from simulator.scenario import parse_scenario
from tests.otlp_receivers import GrpcReceiver


@dataclass
class Row:
    fault: str
    happened: str
    recovery: str


DEMO = ["simulator", "demo"]
"""`kde-simulate demo`; each Target list starts with the module `python -m` runs."""
BARE = ["exporter", "--kubelet-socket", "/nonexistent/kubelet.sock", "--no-collector.nvml"]
"""An exporter with no simulated node in its process (whose files would share its fd limit)."""


class Target:
    def __init__(self, log: Path, args: list[str], fd_limit: int | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        self._log = log.open("w")
        limit = ["prlimit", f"--nofile={fd_limit}:{fd_limit}"] if fd_limit else []
        self.proc = subprocess.Popen(
            [*limit, sys.executable, "-m", *args,
             "--web.listen-address", f"127.0.0.1:{self.port}"],
            stdout=self._log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def log_lines(self) -> int:
        self._log.flush()
        return len(self.log_path.read_text().splitlines())

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)
        self._log.close()


async def scrape(http: aiohttp.ClientSession, url: str) -> tuple[bool, float]:
    started = time.monotonic()
    try:
        async with http.get(f"{url}/metrics", timeout=aiohttp.ClientTimeout(total=10)) as r:
            await r.read()
            return r.status == 200, time.monotonic() - started
    except (aiohttp.ClientError, TimeoutError):
        return False, time.monotonic() - started


async def wait_ready(url: str) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(300):
            ok, _ = await scrape(http, url)
            if ok:
                return
            await asyncio.sleep(0.1)
    raise RuntimeError("exporter did not become ready")


async def scrapers(t: Target, n: int, rounds: int) -> Row:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        results = []
        for _ in range(rounds):
            results += await asyncio.gather(*(scrape(http, t.url) for _ in range(n)))
    errors = sum(not ok for ok, _ in results)
    worst = max(s for _, s in results)
    return Row(
        f"{n} concurrent scrapers x {rounds} rounds",
        f"{errors} errors in {len(results)} scrapes; slowest {worst * 1000:.0f} ms",
        "n/a (no degradation)",
    )


async def _hold_then_scrape(
    t: Target, n: int
) -> tuple[list[tuple[asyncio.StreamReader, asyncio.StreamWriter]], tuple[bool, float]]:
    """Open up to `n` idle connections (those refused are skipped), then one scrape."""
    conns = []
    for _ in range(n):
        with contextlib.suppress(OSError):
            conns.append(await asyncio.open_connection("127.0.0.1", t.port))
    async with aiohttp.ClientSession() as http:
        return conns, await scrape(http, t.url)


async def idle_connections(t: Target, n: int) -> Row:
    conns, (ok, took) = await _hold_then_scrape(t, n)
    fds = t.fds()
    started = time.monotonic()
    closed = 0
    for reader, _ in conns:
        with contextlib.suppress(OSError, TimeoutError):
            await asyncio.wait_for(reader.read(), 30)
        closed += 1
    gone = time.monotonic() - started
    for _, writer in conns:
        writer.close()
    return Row(
        f"{n} idle connections (nothing sent)",
        f"scrape during: {'200' if ok else 'FAILED'} in {took * 1000:.0f} ms; exporter fds "
        f"{fds} (cap 512 connections); all {closed} closed by the server",
        f"{gone:.1f} s until the last idle connection was closed (header timeout 10 s)",
    )


async def slowloris(t: Target, n: int, seconds: float) -> Row:
    conns = [await asyncio.open_connection("127.0.0.1", t.port) for _ in range(n)]
    for _, w in conns:
        w.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: ")
    started = time.monotonic()
    alive = n
    async with aiohttp.ClientSession() as http:
        ok, took = await scrape(http, t.url)
        while alive and time.monotonic() - started < seconds:
            alive = 0
            for _, w in conns:
                if not w.is_closing():
                    with contextlib.suppress(OSError):
                        w.write(b"a")
                        await w.drain()
                        alive += 1
            await asyncio.sleep(1.0)
    took_all = time.monotonic() - started
    for _, w in conns:
        w.close()
    return Row(
        f"slowloris: {n} connections sending one header byte a second",
        f"scrape during: {'200' if ok else 'FAILED'} in {took * 1000:.0f} ms; "
        f"{n - alive} of {n} cut off",
        f"{took_all:.1f} s until all were closed (header timeout 10 s)",
    )


async def malformed(t: Target, n: int) -> Row:
    before = t.log_lines()
    bad = [
        b"GET /\x00 HTTP/1.1\r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
    ]
    for i in range(n):
        with contextlib.suppress(OSError):
            reader, writer = await asyncio.open_connection("127.0.0.1", t.port)
            writer.write(bad[i % len(bad)])
            with contextlib.suppress(OSError, TimeoutError):
                await asyncio.wait_for(reader.read(), 5)
            writer.close()
    async with aiohttp.ClientSession() as http:
        ok, _ = await scrape(http, t.url)
    return Row(
        f"{n} malformed requests (NUL byte, PRI, Content-Length with Transfer-Encoding)",
        f"{t.log_lines() - before} log lines; scrape after: {'200' if ok else 'FAILED'}",
        "immediate (each connection answered 400 and closed)",
    )


async def fd_exhaustion(log: Path, fd_limit: int, n: int, seconds: float) -> Row:
    """The exporter at a file-descriptor limit below its connection cap: accept() fails."""
    t = Target(log, BARE, fd_limit=fd_limit)
    try:
        await wait_ready(t.url)
        before = t.log_lines()
        conns, (ok, took) = await _hold_then_scrape(t, n)
        await asyncio.sleep(seconds)
        lines = t.log_lines() - before
        for _, writer in conns:
            writer.close()
        started = time.monotonic()
        async with aiohttp.ClientSession() as http:
            for _ in range(int(60 / POLL)):
                if (await scrape(http, t.url))[0]:
                    break
                await asyncio.sleep(POLL)
        recovered = time.monotonic() - started
    finally:
        t.stop()
    return Row(
        f"file descriptors exhausted: {n} connections held for {seconds:g} s at a limit of "
        f"{fd_limit}",
        f"scrape during: {'200' if ok else 'FAILED'} in {took * 1000:.0f} ms (the cap drops "
        f"under the fd limit, the longest-idle connections make room); {lines} log lines",
        f"{recovered:.1f} s from the connections closing to a scrape answered",
    )


async def soak(t: Target, seconds: float) -> Row:
    rss0, fds0 = t.rss_mib(), t.fds()
    errors = count = 0
    started = time.monotonic()
    async with aiohttp.ClientSession() as http:
        while time.monotonic() - started < seconds:
            ok, _ = await asyncio.wait_for(scrape(http, t.url), 15)
            errors += not ok
            count += 1
            await asyncio.sleep(0.1)
    return Row(
        f"soak: a scrape every 100 ms for {seconds:.0f} s",
        f"{errors} errors in {count} scrapes; RSS {rss0:.1f} -> {t.rss_mib():.1f} MiB; "
        f"fds {fds0} -> {t.fds()}",
        "n/a",
    )


# --- node faults ------------------------------------------------------------------------

GPU = "GPU-00000000-0000-4000-8000-000000000000"
AMD_A, AMD_B = "0000:03:00.0", "0000:04:00.0"
AMD_A_DEV = "devices/pci0000:00/0000:00:03.0/0000:03:00.0"
HUGE = "9" * 400
NVML_FAULT = (25.0, 31.0)
"""Scenario seconds in which the simulated NVIDIA driver is unloaded."""
POLL = 0.1

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

Metrics = dict[str, list[tuple[dict[str, str], float]]]


async def read_metrics(http: aiohttp.ClientSession, url: str) -> Metrics:
    try:
        async with http.get(f"{url}/metrics", timeout=aiohttp.ClientTimeout(total=5)) as r:
            if r.status != 200:  # 503 before the first cycle
                return {}
            text = await r.text()
    except (aiohttp.ClientError, TimeoutError):
        return {}
    out: Metrics = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def value(m: Metrics, name: str, **labels: str) -> float | None:
    for have, v in m.get(name, []):
        if labels.items() <= have.items():
            return v
    return None


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
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if check(await read_metrics(self.http, self.url)):
                return time.monotonic() - started
            await asyncio.sleep(POLL)
        raise TimeoutError(f"not within {timeout:g}s")

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


async def run(long: bool) -> list[Row]:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    rows = await node_faults()
    with tempfile.TemporaryDirectory(prefix="kde-faults-") as tmp:
        t = Target(Path(tmp) / "exporter.log", DEMO)
        try:
            await wait_ready(t.url)
            rows += [
                await scrapers(t, 200, 20 if long else 3),
                await idle_connections(t, 1000),
                await slowloris(t, 200, 40),
                await malformed(t, 3000 if long else 300),
            ]
            rows.append(await soak(t, 600.0 if long else 30.0))
        finally:
            t.stop()
        rows.append(await fd_exhaustion(Path(tmp) / "fd.log", 128, 300, 40.0 if long else 10.0))
    from bench import faults_round3  # it imports this module's helpers

    rows += await faults_round3.run(Path.cwd(), long)  # issue 25: host reads, web config, auth
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.faults")
    parser.add_argument("--soak", action="store_true", help="the long versions")
    args = parser.parse_args(argv)
    rows = asyncio.run(run(args.soak))
    print("| fault | what happened | recovery |\n|---|---|---|")
    for r in rows:
        print(f"| {r.fault} | {r.happened} | {r.recovery} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
