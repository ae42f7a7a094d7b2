"""A huge node against a real exporter process: issue 25 items 4 and 9.

The bundled `mixed` node (AMD, Intel, RDMA and SR-IOV devices read from sysfs) plus
`pods` pods each holding `per_pod` device IDs of `nvidia.com/gpu` that no source sees
(IDs as long as real GPU UUIDs: 100,000 of them make a 4.2 MB List, the size issue 25
measured). The exporter runs as the image runs it (`PYTHONMALLOC=malloc`), at a 1 s
interval; its peak RSS (`VmHWM`), series, the other sources' success over the first
cycles and what it logged are read from outside.

    python -m bench.bignode [--devices 100000] [--pods 1000] [ARGS for the exporter...]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import aiohttp

from bench.fault_harness import Process, Row, scrape_text
from exporter._proto.podresources.v1 import api_pb2 as v1_pb2
from exporter.model import Container, ContainerDevices, Pod
from exporter.runtime.heap import SHIPPED_ENV
from simulator.kubelet_wire import pod_to_v1
from simulator.node import SimulatedNode
from simulator.scenario import load_scenario
from simulator.scenario_model import TimedPod
from tests.support.waiting import within

RESOURCE = "nvidia.com/gpu"
OTHER_SOURCES = ("amdgpu", "intel", "rdma", "netdev")


def fake_id(i: int) -> str:
    """A device ID as long as a GPU UUID (40 bytes), unique per i."""
    return f"GPU-{i:08x}-0000-4000-8000-{i:012x}"


def big_pods(devices: int, pods: int) -> tuple[TimedPod, ...]:
    per_pod = -(-devices // pods)
    out = []
    for p in range(pods):
        ids = tuple(fake_id(i) for i in range(p * per_pod, min(devices, (p + 1) * per_pod)))
        container = Container("main", devices=(ContainerDevices(RESOURCE, ids),))
        out.append(TimedPod(Pod(f"big-{p:06d}", "bulk", (container,))))
    return tuple(out)


class BigNodeRun(NamedTuple):
    devices: int
    list_bytes: int
    ready_seconds: float | None
    peak_rss_mib: float
    rss_mib: float
    series: float | None
    dropped: float | None
    other_sources_failed: int
    """(source, cycle) pairs of the other sources reported failed over the first cycles, or
    the lines that logged one failing (the cycles before the first /metrics), the more."""
    cycles: int
    log_lines: list[str]
    exit_code: int | None


async def read_self(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """The exporter's own series (`kube_device_exporter_*`) by their whole line's series
    name: parsing 100,000 allocation series each time would load the machine we measure."""
    text = await scrape_text(http, url, 10)
    if text is None:
        return {}
    out = {}
    for line in text.splitlines():
        if line.startswith("kube_device_exporter_"):
            series, _, number = line.rpartition(" ")
            out[series] = float(number)
    return out


def value(metrics: dict[str, float], name: str, **labels: str) -> float | None:
    """The value of the first series of `name` carrying `labels`."""
    for series, v in metrics.items():
        named = series == name or series.startswith(name + "{")
        if named and all(f'{k}="{w}"' in series for k, w in labels.items()):
            return v
    return None


def _status(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


async def run(
    devices: int,
    pods: int,
    args: list[str],
    work: Path,
    *,
    watch: float = 20.0,
    tree: Path | None = None,
) -> BigNodeRun:
    """One exporter against a node of `devices` allocated IDs, watched for `watch` s."""
    scenario = load_scenario("mixed")
    scenario = dataclasses.replace(scenario, pods=scenario.pods + big_pods(devices, pods))
    node = SimulatedNode(scenario, work / "node")
    node.kubelet.set_behaviour(rate_limit=False)
    await node.start()
    node.advance()
    p = Process(
        tree or Path.cwd(),
        work / "exporter.log",
        [*node.exporter_args(), "--collect-interval", "1s", *args],
        {**node.env(), **SHIPPED_ENV},
    )
    failed = 0
    cycles = 0.0
    metrics: dict[str, float] = {}
    try:
        async with aiohttp.ClientSession() as http:

            async def ready() -> bool:
                return bool(await read_self(http, p.url)) or p.proc.poll() is not None

            took = await within(ready, watch)
            ended = time.monotonic() + (watch if took is not None else 0.0) / 2
            seen: set[float] = set()
            while time.monotonic() < ended and p.proc.poll() is None:
                metrics = await read_self(http, p.url)
                cycles = value(metrics, "kube_device_exporter_cycles_total") or 0.0
                if cycles not in seen:
                    seen.add(cycles)
                    failed += sum(
                        value(metrics, "kube_device_exporter_source_success", source=s) == 0.0
                        for s in OTHER_SOURCES
                    )
                await asyncio.sleep(0.3)
            peak = _status(p.proc.pid, "VmHWM") if p.proc.poll() is None else 0.0
            rss = _status(p.proc.pid, "VmRSS") if p.proc.poll() is None else 0.0
    finally:
        p.kill()
        await node.stop()
    list_bytes = v1_pb2.ListPodResourcesResponse(
        pod_resources=[pod_to_v1(t.pod, t.sidecars, None) for t in scenario.pods]
    ).ByteSize()
    logged = re.findall(rf"source ({'|'.join(OTHER_SOURCES)}) failed", p.log())
    return BigNodeRun(
        devices,
        list_bytes,
        took,
        peak,
        rss,
        value(metrics, "kube_device_exporter_series") if metrics else None,
        value(metrics, "kube_device_exporter_series_dropped") if metrics else None,
        max(failed, len(logged)),
        int(cycles),
        [ln for ln in p.log().splitlines() if " WARNING " in ln or " ERROR " in ln],
        p.proc.returncode,
    )


async def fault_rows(tree: Path, work: Path) -> list[Row]:
    """`make faults`' rows: 100,000 device IDs under the cap, 150,000 over it."""
    rows = []
    for devices in (100_000, 150_000):
        folder = work / f"bignode-{devices}"
        folder.mkdir()
        r = await run(devices, 1_000, [], folder, watch=16.0, tree=tree)
        refused = [ln for ln in r.log_lines if "max-message-size" in ln]
        rows.append(
            Row(
                f"a node of {devices:,} allocated device IDs ({r.list_bytes / 1e6:.1f} MB List) "
                "beside the mixed node's AMD, Intel, RDMA and netdev devices, 1 s cycles",
                f"peak RSS {r.peak_rss_mib:.0f} MiB; {r.series or 0:,.0f} series, "
                f"{r.dropped or 0:,.0f} left out; other sources failed {r.other_sources_failed} "
                f"times in {r.cycles} cycles; "
                + (f"refused: {refused[0].split(': ', 2)[-1][:160]}" if refused else "parsed"),
                "never ready" if r.ready_seconds is None else f"ready in {r.ready_seconds:.1f} s",
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bignode")
    parser.add_argument("--devices", type=int, default=100_000)
    parser.add_argument("--pods", type=int, default=1_000)
    parser.add_argument("--watch", type=float, default=20.0)
    parser.add_argument("--keep-log", action="store_true", help="print the log's end")
    parser.add_argument("--tree", type=Path, default=None, help="source tree to run")
    known, rest = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory(prefix="kde-bignode-") as tmp:
        r = asyncio.run(
            run(known.devices, known.pods, rest, Path(tmp), watch=known.watch, tree=known.tree)
        )
        if known.keep_log:
            print(Path(tmp, "exporter.log").read_text()[-6000:])
    for field, v in r._asdict().items():
        if field == "log_lines":
            for line in v:
                print("  log:", line[:300])
        else:
            print(f"{field}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
