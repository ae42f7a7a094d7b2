"""CPU per cycle, share of a core and RSS of exporter processes on a simulated node.

The node runs in its own process (`kde-simulate --node-only`). Two exporters read it side by
side, one collecting every 1 s and one every 10 s, each in its own process, scraped every
15 s as Prometheus does by default (OpenMetrics preferred, gzip). Over the same window,
their CPU (user + system, all threads, the stand-in NVML library included) is read from
/proc before and after.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import aiohttp

from bench.procs import (
    PROMETHEUS_ACCEPT,
    ExporterProcess,
    NodeProcess,
    Process,
    cpu_seconds,
    rss_bytes,
    threads_and_switches,
)
from simulator.ports import free_port

INTERVALS = ("1s", "10s")
Run = tuple[str, tuple[str, ...], dict[str, str]]
"""One exporter of a side-by-side run: (interval, extra flags, environment beyond the
image's)."""
SCRAPE_EVERY = 15.0
WARM_SCRAPES = 2
"""Scrapes of every target, SCRAPE_EVERY apart, before a window (`learn_cadence`): the
exporter builds a body ahead of a scrape once it knows that format's period, from its first
scrapes (exporter/sinks/cadence.py), as it does for a Prometheus that has scraped it for
hours. A window that held those first scrapes measured a target's first half minute, whose
bodies are built at the scrape: at 30 s, two more bodies in a window of three cycles."""


async def learn_cadence(scrapes: Sequence[Callable[[], Awaitable[object]]]) -> None:
    """WARM_SCRAPES rounds of `scrapes`, SCRAPE_EVERY apart; the window that follows keeps
    the cadence (its first scrape SCRAPE_EVERY after the last of these)."""
    for _ in range(WARM_SCRAPES):
        for scrape in scrapes:
            await scrape()
        await asyncio.sleep(SCRAPE_EVERY)


SCRAPE_HEADERS = {"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"}


@dataclass(frozen=True)
class Cost:
    interval: str
    series: int
    cycles: float
    cpu_per_cycle_s: float
    core_share: float
    rss_bytes: int
    ready_s: float


@dataclass(frozen=True)
class _Window:
    cycles: float
    series: int
    cpu_s: float
    elapsed_s: float
    rss_bytes: int
    threads: int = 0
    switches: int = 0
    """Context switches of all its threads over the window."""

    @property
    def per_cycle_s(self) -> float:
        """CPU seconds per cycle run in the window (NaN when none ran)."""
        return self.cpu_s / self.cycles if self.cycles else float("nan")


@dataclass(frozen=True)
class Wakeups:
    interval: str
    threads: int
    switches_per_s: float
    core_share: float


async def _side_by_side(
    exporters: list[ExporterProcess],
    http: aiohttp.ClientSession,
    window: float,
    rounds: int = 1,
) -> list[list[_Window]]:
    """CPU of each exporter over `rounds` consecutive windows, the same windows for all, all
    scraped every SCRAPE_EVERY seconds. The scrape that ends a window (and is counted in it)
    starts the next one, so consecutive rounds keep the cadence the exporters learnt."""
    start = [await e.counters(http) for e in exporters]
    cpu0 = [cpu_seconds(e.pid) for e in exporters]
    sw0 = [threads_and_switches(e.pid)[1] for e in exporters]
    out: list[list[_Window]] = []
    for _ in range(rounds):
        t0 = time.monotonic()
        while (left := window - (time.monotonic() - t0)) > 0:
            await asyncio.sleep(min(SCRAPE_EVERY, left))
            if time.monotonic() - t0 < window - 0.5:  # the last one is the reading below
                for e in exporters:
                    await e.scrape(http)
        sw1 = [threads_and_switches(e.pid) for e in exporters]  # before our last scrape
        end = [await e.counters(http) for e in exporters]
        cpu1 = [cpu_seconds(e.pid) for e in exporters]
        elapsed = time.monotonic() - t0
        out.append(
            [
                _Window(a[0] - b[0], a[1], c1 - c0, elapsed, rss_bytes(e.pid), s1[0], s1[1] - s0)
                for e, b, a, c0, c1, s0, s1 in zip(
                    exporters, start, end, cpu0, cpu1, sw0, sw1, strict=True
                )
            ]
        )
        start, cpu0, sw0 = end, cpu1, [s[1] for s in sw1]
    return out


async def _run(
    scenario: str,
    workdir: Path,
    runs: list[Run],
    warmup: float,
    window: float,
) -> tuple[list[float], list[_Window]]:
    """One node, an exporter per (interval, extra flags, environment beyond the image's),
    measured side by side: (seconds each took to be ready, each one's window)."""
    node = NodeProcess.start(scenario, workdir)
    exporters = [ExporterProcess(node, i, *extra, env=env) for i, extra, env in runs]
    try:
        async with aiohttp.ClientSession() as http:
            ready = [await e.wait_ready(http) for e in exporters]
            await asyncio.sleep(warmup)
            await learn_cadence([partial(e.scrape, http) for e in exporters])
            (windows,) = await _side_by_side(exporters, http, window)
    finally:
        for e in exporters:
            e.stop()
        node.stop()
    return ready, windows


async def measure(scenario: str, workdir: Path, *, warmup: float, window: float) -> list[Cost]:
    runs: list[Run] = [(i, (), {}) for i in INTERVALS]
    ready, windows = await _run(scenario, workdir, runs, warmup, window)
    return [
        Cost(
            interval=interval,
            series=w.series,
            cycles=w.cycles,
            cpu_per_cycle_s=w.per_cycle_s,
            core_share=w.cpu_s / w.elapsed_s,
            rss_bytes=w.rss_bytes,
            ready_s=r,
        )
        for interval, w, r in zip(INTERVALS, windows, ready, strict=True)
    ]


def label(scenario: str) -> str:
    """How a run names a node: a built-in scenario by its name, a generated one (a path to
    its YAML) by the file's stem."""
    return Path(scenario).stem if scenario.endswith(".yaml") else scenario


@dataclass(frozen=True)
class Growth:
    """A bigger node's exporter against `base`'s, both at 1 s, measured in the same windows."""

    scenario: str
    base: str
    series: int
    per_cycle_s: tuple[tuple[float, float], ...]
    """Per round: (CPU per cycle on this node, on `base`)."""

    @property
    def ratios(self) -> tuple[float, ...]:
        return tuple(node / base for node, base in self.per_cycle_s)

    @property
    def ratio(self) -> float:
        """The median round's: one round's ratio swings with where the held pods' timeline
        is in it; the median of several says where the exporter stands."""
        return statistics.median(self.ratios)


async def growth(
    base: str,
    bigger: Sequence[str],
    workdir: Path,
    *,
    warmup: float,
    window: float,
    rounds: int,
) -> list[Growth]:
    """CPU per cycle of an exporter at 1 s on each `bigger` node against one on `base`: every
    node and its exporter running at once, read over the same `rounds` windows, one ratio a
    round. Two nodes measured in windows minutes apart and divided compare two moments of
    this machine's load as much as two exporters (the 1,000-pod row read 1.16x and 2.04x on
    one tree that way)."""
    names = [base, *bigger]
    nodes: list[NodeProcess] = []
    exporters: list[ExporterProcess] = []
    try:
        for n, name in enumerate(names):
            nodes.append(NodeProcess.start(name, workdir / f"node{n}"))
            exporters.append(ExporterProcess(nodes[-1], "1s"))
        async with aiohttp.ClientSession() as http:
            for e in exporters:
                await e.wait_ready(http)
            await asyncio.sleep(warmup)
            await learn_cadence([partial(e.scrape, http) for e in exporters])
            measured = await _side_by_side(exporters, http, window, rounds)
    finally:
        for e in exporters:
            e.stop()
        for node in nodes:
            node.stop()

    return [
        Growth(
            scenario=label(name),
            base=base,
            series=measured[-1][n].series,
            per_cycle_s=tuple((ws[n].per_cycle_s, ws[0].per_cycle_s) for ws in measured),
        )
        for n, name in enumerate(names)
        if n
    ]


BREAKDOWN: tuple[tuple[str, tuple[str, ...], dict[str, str]], ...] = (  # (name, flags, env)
    ("everything", (), {}),
    ("without the kubelet (no socket)", ("--kubelet-socket", "/nonexistent/kubelet.sock"), {}),
    ("without NVML", ("--no-collector.nvml",), {}),
    ("without XID events", ("--collector.nvml.xid-events", "false"), {}),
    ("on Python's own allocator", (), {"PYTHONMALLOC": "pymalloc"}),
)
"""Exporters run side by side on one node at 1 s, each without one part (the last on
pymalloc instead of the image's glibc malloc): what a part costs is the difference from
`everything`."""


async def breakdown(
    scenario: str, workdir: Path, *, warmup: float, window: float
) -> dict[str, float]:
    """CPU seconds per cycle of each BREAKDOWN configuration, at a 1 s interval."""
    runs = [("1s", extra, env) for _, extra, env in BREAKDOWN]
    _, windows = await _run(scenario, workdir, runs, warmup, window)
    return {name: w.per_cycle_s for (name, _, _), w in zip(BREAKDOWN, windows, strict=True)}


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares `cost = fixed + per_series * series` -> (fixed, per_series)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return my - slope * mx, slope


WAKEUP_INTERVALS = ("1s", "10s", "30s")


async def wakeups(scenario: str, workdir: Path, *, warmup: float, window: float) -> list[Wakeups]:
    """Threads and context switches per second of exporters at 1 s, 10 s and 30 s side by
    side, scraped every 15 s: what an exporter costs a big node's CPUs when it is idle."""
    runs: list[Run] = [(i, (), {}) for i in WAKEUP_INTERVALS]
    _, windows = await _run(scenario, workdir, runs, warmup, window)
    return [
        Wakeups(i, w.threads, w.switches / w.elapsed_s, w.cpu_s / w.elapsed_s)
        for i, w in zip(WAKEUP_INTERVALS, windows, strict=True)
    ]


@dataclass(frozen=True)
class FloorRatio:
    """One interval's exporter against its floor: the shares of the median round (the
    round whose ratio is the median of `rounds`; the only one when there was one)."""

    interval: str
    exporter_share: float
    floor_share: float
    wake_share: float = 0.0
    """A process that only wakes every interval (bench/floor.py `wake`): the machine's
    own price of waking, which neither the exporter nor the floor can go below."""
    rounds: tuple[float, ...] = ()
    """Every round's ratio, in the order they ran (empty: one window, not reported)."""

    @property
    def ratio(self) -> float:
        return self.exporter_share / self.floor_share


def _median_round(interval: str, shares: list[tuple[float, float, float]]) -> FloorRatio:
    """The round whose exporter/floor ratio is the median (the lower middle one of an even
    count: a round that ran, not an average of two), with every round's ratio."""
    ratios = [e / f for e, f, _ in shares]
    middle = sorted(range(len(shares)), key=ratios.__getitem__)[(len(shares) - 1) // 2]
    e, f, w = shares[middle]
    return FloorRatio(interval, e, f, w, tuple(ratios) if len(shares) > 1 else ())


FLOOR_INTERVALS = ("1s", "30s")


async def floor_ratios(
    scenario: str, workdir: Path, *, warmup: float, window: float, rounds: int = 1
) -> list[FloorRatio]:
    """CPU of exporters at 1 s and 30 s against the floor of the same work at the same
    intervals (bench/floor.py), all side by side on one node, scraped every 15 s, over
    `rounds` consecutive windows: each interval's figure is its median round's (a 30 s
    cycle is rare in a window, and one kubelet poll more or less in it moves the ratio)."""
    node = NodeProcess.start(scenario, workdir)
    exporters = [ExporterProcess(node, i) for i in FLOOR_INTERVALS]
    floors: list[Process] = []
    try:
        async with aiohttp.ClientSession() as http:
            for e in exporters:
                await e.wait_ready(http)
            async with http.get(f"{exporters[0].url}metrics") as r:
                body = workdir / "metrics.txt"
                body.write_bytes(await r.read())
            socket = node.args[node.args.index("--kubelet-socket") + 1]
            ports = [free_port() for _ in FLOOR_INTERVALS]
            for interval, port in zip(FLOOR_INTERVALS, ports, strict=True):
                seconds = interval.removesuffix("s")
                argv = [sys.executable, "-m", "bench", "floor", seconds, socket, str(body)]
                floors.append(Process([*argv, str(port)], node.env))
            for interval in FLOOR_INTERVALS:
                seconds = interval.removesuffix("s")
                wake = [sys.executable, "-m", "bench", "floor", "wake", seconds]
                floors.append(Process(wake, node.env))
            for f in floors:
                assert f.proc.stdout is not None
                if f.proc.stdout.readline().strip() != "ready":
                    raise RuntimeError("the floor process did not start")
            await asyncio.sleep(warmup)
            pids = [e.pid for e in exporters] + [f.pid for f in floors]
            urls = [f"{e.url}metrics" for e in exporters]
            urls += [f"http://127.0.0.1:{p}/metrics" for p in ports]

            async def scrape(url: str) -> None:
                async with http.get(url, headers=SCRAPE_HEADERS) as r:
                    await r.read()

            await learn_cadence([partial(scrape, url) for url in urls])
            measured: list[list[float]] = []
            cpu0, t0 = [cpu_seconds(p) for p in pids], time.monotonic()
            for _ in range(rounds):
                # The scrape that ends a round is the next one's first: the cadence holds.
                while (left := window - (time.monotonic() - t0)) > 0:
                    await asyncio.sleep(min(SCRAPE_EVERY, left))
                    for url in urls:
                        await scrape(url)
                cpu1, t1 = [cpu_seconds(p) for p in pids], time.monotonic()
                measured.append([(b - a) / (t1 - t0) for a, b in zip(cpu0, cpu1, strict=True)])
                cpu0, t0 = cpu1, t1
    finally:
        for f in floors:
            f.stop()
        for e in exporters:
            e.stop()
        node.stop()
    n = len(FLOOR_INTERVALS)
    return [
        _median_round(i, [(s[k], s[n + k], s[2 * n + k]) for s in measured])
        for k, i in enumerate(FLOOR_INTERVALS)
    ]
