"""Scrape latency at the cadence Prometheus scrapes, against a static handler serving the
same bytes measured the same way, side by side in one run.

Prometheus scrapes a target once per scrape interval, each time (with keep-alive off, as
here, or after an idle close) on a fresh connection, at an offset that has nothing to do
with the exporter's cycle. So every scrape here opens its own connection, and comes at a
random moment, for two cadences of an exporter collecting every 1 s:

- **every cycle**: one scrape per second, at a random point of the second;
- **every 15 s** (Prometheus's default): several exporters side by side, each scraped every
  15 s (+-0.5 s of jitter, which only makes the next scrape harder to foresee), at offsets
  spread over the 15 s, so a few minutes give a few dozen scrapes (after two warm-up rounds:
  the steady state of a Prometheus that has scraped the target before; the exporter learns
  a scraper's period from its first two scrapes, exporter/sinks/cadence.py).

The exporters' cycle counts are read in the text format, not the one measured, so that
reading them is not one more scrape of it.

The static handler (`python -m bench static`: a bare aiohttp app returning the very bytes
our exporter served) is scraped the same way at the same moments (just before or just
after ours, in random order): its latency is the floor
of the HTTP stack and the client. Each exporter's CPU over the phase (from /proc) divided
by the cycles it ran gives its CPU per cycle at that cadence. `--baseline DIR` runs another
tree's `exporter` package (e.g. main's, `git archive main exporter | tar -x -C DIR`) side by
side with ours, the same way: before and after in one run.

    python -m bench scrape [--scenario dense] [--per-cycle S] [--rounds N] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

from bench.procs import (
    PROMETHEUS_ACCEPT,
    ExporterProcess,
    NodeProcess,
    Process,
    cpu_seconds,
)
from simulator.ports import free_port

HEADERS = {"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"}
STATIC = "static handler, same bytes"
OURS = "kube-device-exporter"
SLOW_PERIOD = 15.0
SLOW_EXPORTERS = 4
WARMUP_ROUNDS = 2
"""15 s rounds scraped but not counted: a Prometheus's first two scrapes of a target."""


@dataclass(frozen=True)
class Latency:
    target: str
    cadence: str
    scrapes: int
    p50_ms: float
    p99_ms: float
    series: int
    cpu_per_cycle_s: float | None = None
    """The exporter's CPU per cycle over the phase (None for the static handler)."""


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


async def _wait_up(url: str, deadline_s: float = 10.0) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            await _scrape(url)
            return
        except aiohttp.ClientError:
            await asyncio.sleep(0.02)  # not listening yet
    raise TimeoutError(url)


async def _scrape(url: str) -> float:
    """One scrape on a fresh connection: seconds from connect to the last byte read."""
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as http:
        started = time.perf_counter()
        async with http.get(url, headers=HEADERS) as r:
            await r.read()
            if r.status != 200:
                raise aiohttp.ClientError(f"{url}: HTTP {r.status}")
        return time.perf_counter() - started


def _series(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


@dataclass
class _Target:
    name: str
    exporters: list[ExporterProcess]
    samples: list[float]
    series: int = 0
    cpu: float = 0.0
    cycles: float = 0.0


async def _cpu_window(targets: list[_Target], http: aiohttp.ClientSession) -> list[list[float]]:
    """Per target: the cycles each of its exporters ran so far, then their CPU seconds."""
    out = []
    for t in targets:
        cycles = [(await e.counters(http, aside=True))[0] for e in t.exporters]
        out.append(cycles + [cpu_seconds(e.pid) for e in t.exporters])
    return out


def _take(target: _Target, before: list[float], after: list[float]) -> None:
    n = len(target.exporters)
    target.cycles += sum(after[:n]) - sum(before[:n])
    target.cpu += sum(after[n:]) - sum(before[n:])


async def _per_cycle(ours: list[_Target], static_url: str, seconds: float) -> list[float]:
    """Each target, and the static handler, scraped once a second, each at a random moment
    of the second (one at a time: random moments, sorted, dealt to the targets shuffled)."""
    static: list[float] = []
    urls = [(t.samples, f"{t.exporters[0].url}metrics") for t in ours] + [(static, static_url)]
    start = time.monotonic()
    for k in range(int(seconds)):
        moments = sorted(random.random() for _ in urls)
        for at, (out, url) in zip(moments, random.sample(urls, len(urls)), strict=True):
            await asyncio.sleep(max(0.0, start + k + at - time.monotonic()))
            out.append(await _scrape(url))
    return static


async def _every_15s(ours: list[_Target], static_url: str, rounds: int) -> list[float]:
    """Each exporter of each target scraped every SLOW_PERIOD s (offsets spread over the
    period, +-0.5 s jitter), the first WARMUP_ROUNDS not counted; the static handler at the
    same moments, just before or just after ours (in random order: the client's first
    scrape after a quiet spell is slower)."""
    static: list[float] = []
    start = time.monotonic()

    async def one(target: _Target, exporter: ExporterProcess, offset: float) -> None:
        for k in range(WARMUP_ROUNDS + rounds):
            at = start + offset + k * SLOW_PERIOD + random.uniform(-0.5, 0.5)
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            pair = [(target.samples, f"{exporter.url}metrics"), (static, static_url)]
            for out, url in random.sample(pair, 2):  # the first after a quiet spell pays more
                seconds = await _scrape(url)
                if k >= WARMUP_ROUNDS:
                    out.append(seconds)

    jobs = []
    for i, target in enumerate(ours):
        for j, exporter in enumerate(target.exporters):
            slot = (j * len(ours) + i) / (len(ours) * len(target.exporters))
            jobs.append(one(target, exporter, 1.0 + slot * SLOW_PERIOD))
    await asyncio.gather(*jobs)
    return static


def _latency(name: str, cadence: str, values: list[float], t: _Target | None) -> Latency:
    values = sorted(values)
    return Latency(
        target=name,
        cadence=cadence,
        scrapes=len(values),
        p50_ms=statistics.median(values) * 1000,
        p99_ms=values[min(len(values) - 1, int(len(values) * 0.99))] * 1000,
        series=t.series if t else 0,
        cpu_per_cycle_s=t.cpu / t.cycles if t and t.cycles else None,
    )


async def _static_server(exporter: ExporterProcess, workdir: Path) -> tuple[Process, str]:
    """The static handler, serving the body `exporter` serves a Prometheus scrape."""
    async with (
        aiohttp.ClientSession(auto_decompress=False) as http,
        http.get(f"{exporter.url}metrics", headers=HEADERS) as r,
    ):
        content_type = r.headers["Content-Type"]
        body = await r.read()
    body_file = workdir / "static.body"
    body_file.write_bytes(body)
    port = free_port()
    server = Process(
        [sys.executable, "-m", "bench", "static", str(body_file), content_type, str(port)]
    )
    url = f"http://127.0.0.1:{port}/metrics"
    await _wait_up(url)
    return server, url


async def measure(
    scenario: str,
    workdir: Path,
    *,
    per_cycle_s: float = 90.0,
    rounds: int = 8,
    baseline: Path | None = None,
) -> list[Latency]:
    """Both cadences on one simulated node; ours (and `baseline`'s) against the floor."""
    node = NodeProcess.start(scenario, workdir)
    trees: list[tuple[str, Path | None]] = [(OURS, None)]
    if baseline is not None:
        trees.append((f"{OURS} ({baseline.name})", baseline))
    started: list[ExporterProcess] = []
    static: Process | None = None

    def exporters(tree: Path | None, n: int) -> list[ExporterProcess]:
        env = {"PYTHONPATH": str(tree)} if tree else {}
        out = [ExporterProcess(node, "1s", env=env, cwd=tree) for _ in range(n)]
        started.extend(out)
        return out

    out: list[Latency] = []
    try:
        async with aiohttp.ClientSession() as http:
            # One scrape per cycle: one exporter per tree.
            fast = [_Target(name, exporters(tree, 1), []) for name, tree in trees]
            for e in started:
                await e.wait_ready(http)
            await asyncio.sleep(3)
            static, static_url = await _static_server(fast[0].exporters[0], workdir)
            for t in fast:
                async with http.get(f"{t.exporters[0].url}metrics") as r:
                    t.series = _series(await r.text())
            before = await _cpu_window(fast, http)
            floor = await _per_cycle(fast, static_url, per_cycle_s)
            for t, b, a in zip(fast, before, await _cpu_window(fast, http), strict=True):
                _take(t, b, a)
            out += [_latency(t.name, "every cycle (1 s)", t.samples, t) for t in fast]
            out.append(_latency(STATIC, "every cycle (1 s)", floor, None))
            for e in started:
                e.stop()
            started.clear()
            # Every 15 s: SLOW_EXPORTERS per tree, side by side.
            slow = [_Target(n, exporters(tree, SLOW_EXPORTERS), []) for n, tree in trees]
            for e in started:
                await e.wait_ready(http)
            await asyncio.sleep(3)
            for t, f in zip(slow, fast, strict=True):
                t.series = f.series
            before = await _cpu_window(slow, http)
            floor = await _every_15s(slow, static_url, rounds)
            for t, b, a in zip(slow, before, await _cpu_window(slow, http), strict=True):
                _take(t, b, a)
            out += [_latency(t.name, "every 15 s, 1 s cycles", t.samples, t) for t in slow]
            out.append(_latency(STATIC, "every 15 s, 1 s cycles", floor, None))
    finally:
        if static is not None:
            static.stop()
        for e in started:
            e.stop()
        node.stop()
    return out


def table(rows: list[Latency]) -> str:
    """The markdown table of `rows`, each with its p50 and p99 over the static handler's."""
    floor = {r.cadence: r for r in rows if r.target == STATIC}
    out = [
        "| cadence | target | scrapes | p50 | p99 | p50 / static | p99 / static "
        "| CPU per cycle |\n|---|---|---|---|---|---|---|---|\n"
    ]
    for r in rows:
        f = floor[r.cadence]
        cpu = f"{r.cpu_per_cycle_s * 1000:.1f} ms" if r.cpu_per_cycle_s is not None else "-"
        out.append(
            f"| {r.cadence} | {r.target} | {r.scrapes} | {r.p50_ms:.2f} ms | {r.p99_ms:.2f} ms "
            f"| {r.p50_ms / f.p50_ms:.2f}x | {r.p99_ms / f.p99_ms:.2f}x | {cpu} |\n"
        )
    return "".join(out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench scrape")
    parser.add_argument("--scenario", default="dense")
    parser.add_argument("--per-cycle", type=float, default=90.0, help="seconds, 1 scrape/s")
    parser.add_argument("--rounds", type=int, default=8, help="15 s rounds")
    parser.add_argument("--baseline", type=Path, help="a tree holding another exporter/")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/kde-bench-scrape"))
    args = parser.parse_args(argv)
    rows = asyncio.run(
        measure(
            args.scenario,
            args.workdir,
            per_cycle_s=args.per_cycle,
            rounds=args.rounds,
            baseline=args.baseline.resolve() if args.baseline else None,
        )
    )
    print(table(rows), end="")
    return 0
