"""Scrape latency: our /metrics against a static handler serving the same bytes (the floor
of the HTTP stack) and against node_exporter, with 1 and 20 concurrent scrapers. Targets
are interleaved round by round so load drift hits them alike."""

from __future__ import annotations

import asyncio
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

from bench.procs import PROMETHEUS_ACCEPT, ExporterProcess, NodeProcess, Process, free_port

HEADERS = {"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"}


@dataclass(frozen=True)
class Latency:
    target: str
    scrapers: int
    p50_ms: float
    p99_ms: float
    series: int


def serve_static(body_file: Path, content_type: str, port: int) -> None:
    """`python -m bench static FILE TYPE PORT`: the same bytes from a bare aiohttp handler."""
    body = body_file.read_bytes()

    async def handler(request: web.Request) -> web.Response:
        return web.Response(
            body=body, headers={"Content-Type": content_type, "Content-Encoding": "gzip"}
        )

    app = web.Application()
    app.router.add_get("/metrics", handler)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


async def _wait_up(http: aiohttp.ClientSession, url: str) -> None:
    for _ in range(500):
        try:
            async with http.get(url) as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass  # not listening yet
        await asyncio.sleep(0.02)
    raise TimeoutError(url)


async def _batch(http: aiohttp.ClientSession, url: str, scrapers: int, each: int) -> list[float]:
    out: list[float] = []

    async def one() -> None:
        for _ in range(each):
            started = time.perf_counter()
            async with http.get(url, headers=HEADERS) as r:
                await r.read()
            out.append(time.perf_counter() - started)

    await asyncio.gather(*(one() for _ in range(scrapers)))
    return out


def _series(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


async def measure(scenario: str, workdir: Path, *, rounds: int) -> list[Latency]:
    node = NodeProcess.start(scenario, workdir)
    exporter = ExporterProcess(node, "1s")
    helpers: list[Process] = []
    try:
        async with aiohttp.ClientSession(auto_decompress=True) as http:
            await exporter.wait_ready(http)
            await asyncio.sleep(2)
            async with http.get(f"{exporter.url}metrics", headers=HEADERS) as r:
                content_type = r.headers["Content-Type"]
                ours_text = await r.text()
            async with http.get(
                f"{exporter.url}metrics", headers=HEADERS, auto_decompress=False
            ) as r:
                body = await r.read()
            body_file = workdir / "static.body"
            body_file.write_bytes(body)
            static_port = free_port()
            static = ["static", str(body_file), content_type, str(static_port)]
            helpers.append(Process([sys.executable, "-m", "bench", *static]))
            targets = {
                "kube-device-exporter": (f"{exporter.url}metrics", _series(ours_text)),
                "static handler, same bytes": (f"http://127.0.0.1:{static_port}/metrics", 0),
            }
            node_exporter = shutil.which("prometheus-node-exporter") or shutil.which(
                "node_exporter"
            )
            if node_exporter:
                port = free_port()
                helpers.append(Process([node_exporter, f"--web.listen-address=127.0.0.1:{port}"]))
                targets["node_exporter"] = (f"http://127.0.0.1:{port}/metrics", 0)
            for name, (url, _) in targets.items():
                await _wait_up(http, url)
                if not targets[name][1]:
                    async with http.get(url, headers=HEADERS) as r:
                        targets[name] = (url, _series(await r.text()))
            samples: dict[tuple[str, int], list[float]] = {}
            for _ in range(rounds):
                for scrapers, each in ((1, 20), (20, 2)):
                    for name, (url, _) in targets.items():
                        samples.setdefault((name, scrapers), []).extend(
                            await _batch(http, url, scrapers, each)
                        )
    finally:
        for helper in helpers:
            helper.stop()
        exporter.stop()
        node.stop()
    out = []
    for (name, scrapers), values in samples.items():
        values.sort()
        out.append(
            Latency(
                target=name,
                scrapers=scrapers,
                p50_ms=statistics.median(values) * 1000,
                p99_ms=values[min(len(values) - 1, int(len(values) * 0.99))] * 1000,
                series=targets[name][1],
            )
        )
    return out
