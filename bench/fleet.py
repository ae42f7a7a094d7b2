"""The fleet in small: one real Prometheus scraping N simulated nodes at once, side by side
with an idle Prometheus (no targets), so the difference is what the nodes cost it."""

from __future__ import annotations

import asyncio
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import yaml

from bench.procs import ExporterProcess, NodeProcess, Process
from exporter.settings.table import CORE, GROUPS
from simulator.ports import free_port


@dataclass(frozen=True)
class Fleet:
    nodes: int
    scrape_interval_s: float
    head_series: float
    samples_per_s: float
    heap_bytes_per_series: float
    series_per_node: float
    label: str = "native schema, default groups"
    heap_bytes_per_node: float = 0.0
    """The busy Prometheus's heap over the idle one's, per node."""


EVERY_GROUP = tuple(f"--metrics.group.{g.name}" for g in GROUPS if g.name != CORE)
SETS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("native schema, default groups", ()),
    ("native schema, every group", EVERY_GROUP),
    ("dcgm schema, default groups", ("--metrics.schema", "dcgm")),
    ("dcgm schema, every group", ("--metrics.schema", "dcgm", *EVERY_GROUP)),
)
"""What a fleet's Prometheus is measured with: the schemas and the group sets."""


def _metric(text: str, name: str) -> float:
    found = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)", text, re.M)
    return float(found.group(1)) if found else 0.0


class _Prometheus:
    def __init__(self, workdir: Path, targets: list[str], interval: float) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise FileNotFoundError("prometheus (Debian package prometheus) is not installed")
        workdir.mkdir(parents=True, exist_ok=True)
        jobs = [{"job_name": "nodes", "static_configs": [{"targets": targets}]}]
        config = {
            "global": {"scrape_interval": f"{interval:g}s"},
            "scrape_configs": jobs if targets else [],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.process = Process(
            [
                binary,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ]
        )

    async def metrics(self, http: aiohttp.ClientSession) -> str:
        for _ in range(500):
            try:
                async with http.get(f"http://127.0.0.1:{self.port}/metrics") as r:
                    return await r.text()
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)  # still starting
        raise TimeoutError("prometheus did not answer")


async def measure_sets(
    workdir: Path, *, nodes: int, interval: float, duration: float
) -> list[Fleet]:
    """`measure` for every schema and group set of `SETS`, one after the other."""
    return [
        await measure(
            workdir / f"set{i}",
            nodes=nodes,
            interval=interval,
            duration=duration,
            label=label,
            extra=extra,
        )
        for i, (label, extra) in enumerate(SETS)
    ]


async def measure(
    workdir: Path,
    *,
    nodes: int,
    interval: float,
    duration: float,
    label: str = SETS[0][0],
    extra: tuple[str, ...] = (),
) -> Fleet:
    started: list[NodeProcess] = []
    exporters: list[ExporterProcess] = []
    servers: list[_Prometheus] = []
    try:
        async with aiohttp.ClientSession() as http:
            for i in range(nodes):
                started.append(NodeProcess.start("dense", workdir / f"node{i}"))
                exporters.append(ExporterProcess(started[-1], "5s", *extra))
            for e in exporters:
                await e.wait_ready(http)
            targets = [f"127.0.0.1:{e.port}" for e in exporters]
            idle = _Prometheus(workdir / "idle", [], interval)
            busy = _Prometheus(workdir / "busy", targets, interval)
            servers += [idle, busy]
            await idle.metrics(http)
            await busy.metrics(http)
            await asyncio.sleep(duration / 2)
            first = await busy.metrics(http)
            t0 = time.monotonic()
            await asyncio.sleep(duration / 2)
            last, quiet = await busy.metrics(http), await idle.metrics(http)
            elapsed = time.monotonic() - t0
    finally:
        for server in servers:
            server.process.stop()
        for e in exporters:
            e.stop()
        for n in started:
            n.stop()
    series = _metric(last, "prometheus_tsdb_head_series") - _metric(
        quiet, "prometheus_tsdb_head_series"
    )
    appended = "prometheus_tsdb_head_samples_appended_total"
    heap = "go_memstats_heap_inuse_bytes"
    return Fleet(
        nodes=nodes,
        scrape_interval_s=interval,
        head_series=series,
        samples_per_s=(_metric(last, appended) - _metric(first, appended)) / elapsed,
        heap_bytes_per_series=(_metric(last, heap) - _metric(quiet, heap)) / max(series, 1),
        series_per_node=series / nodes,
        label=label,
        heap_bytes_per_node=(_metric(last, heap) - _metric(quiet, heap)) / nodes,
    )


@dataclass(frozen=True)
class OtlpVolume:
    temporality: str
    wire_bytes_per_min: float
    """As sent (gzip), per node."""
    raw_bytes_per_min: float
    """Protobuf before compression, per node."""
    exports_per_min: float


async def otlp_volume(workdir: Path, *, export_every: str, duration: float) -> list[OtlpVolume]:
    """A dense node pushing OTLP/HTTP (gzip) to a counting receiver, cumulative and delta
    side by side, each from its own exporter process."""
    from aiohttp import web

    received: dict[str, list[int]] = {"CUMULATIVE": [0, 0, 0], "DELTA": [0, 0, 0]}

    async def receive(request: web.Request) -> web.Response:
        body = await request.read()  # aiohttp has already undone Content-Encoding
        entry = received[request.match_info["temporality"]]
        entry[0] += request.content_length or len(body)
        entry[1] += len(body)
        entry[2] += 1
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_post("/{temporality}/v1/metrics", receive)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    node = NodeProcess.start("dense", workdir)
    exporters = []
    try:
        for temporality in received:
            env = {
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": (
                    f"http://127.0.0.1:{port}/{temporality}/v1/metrics"
                ),
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
                "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": temporality,
            }
            exporters.append(ExporterProcess(node, export_every, env=env))
        async with aiohttp.ClientSession() as http:
            for e in exporters:
                await e.wait_ready(http)
        await asyncio.sleep(2)
        start = {k: list(v) for k, v in received.items()}
        await asyncio.sleep(duration)
    finally:
        for e in exporters:
            e.stop()
        node.stop()
        await runner.cleanup()
    per_min = 60.0 / duration
    return [
        OtlpVolume(
            temporality=k.lower(),
            wire_bytes_per_min=(v[0] - start[k][0]) * per_min,
            raw_bytes_per_min=(v[1] - start[k][1]) * per_min,
            exports_per_min=(v[2] - start[k][2]) * per_min,
        )
        for k, v in received.items()
    ]
