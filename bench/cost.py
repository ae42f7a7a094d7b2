"""CPU per cycle, share of a core and RSS of exporter processes on a simulated node.

The node runs in its own process (`simulate --node-only`). Two exporters read it side by
side, one collecting every 1 s and one every 10 s, each in its own process, scraped every
15 s as Prometheus does by default (OpenMetrics preferred, gzip). Over the same window,
their CPU (user + system, all threads, the stand-in NVML library included) is read from
/proc before and after.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.procs import ExporterProcess, NodeProcess, cpu_seconds, rss_bytes

INTERVALS = ("1s", "10s")
SCRAPE_EVERY = 15.0


@dataclass(frozen=True)
class Cost:
    interval: str
    series: int
    cycles: float
    cpu_per_cycle_s: float
    core_share: float
    rss_bytes: int
    ready_s: float


async def measure(scenario: str, workdir: Path, *, warmup: float, window: float) -> list[Cost]:
    node = NodeProcess.start(scenario, workdir)
    exporters = [ExporterProcess(node, interval) for interval in INTERVALS]
    try:
        async with aiohttp.ClientSession() as http:
            ready = [await e.wait_ready(http) for e in exporters]
            await asyncio.sleep(warmup)
            before = [await e.counters(http) for e in exporters]
            cpu0 = [cpu_seconds(e.pid) for e in exporters]
            t0 = time.monotonic()
            while (left := window - (time.monotonic() - t0)) > 0:
                await asyncio.sleep(min(SCRAPE_EVERY, left))
                if time.monotonic() - t0 < window - 0.5:  # the last one is the reading below
                    for e in exporters:
                        await e.scrape(http)
            after = [await e.counters(http) for e in exporters]
            cpu1 = [cpu_seconds(e.pid) for e in exporters]
            elapsed = time.monotonic() - t0
            rss = [rss_bytes(e.pid) for e in exporters]
    finally:
        for e in exporters:
            e.stop()
        node.stop()
    out = []
    for i, interval in enumerate(INTERVALS):
        cycles = after[i][0] - before[i][0]
        cpu = cpu1[i] - cpu0[i]
        out.append(
            Cost(
                interval=interval,
                series=after[i][1],
                cycles=cycles,
                cpu_per_cycle_s=cpu / cycles if cycles else float("nan"),
                core_share=cpu / elapsed,
                rss_bytes=rss[i],
                ready_s=ready[i],
            )
        )
    return out


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares `cost = fixed + per_series * series` -> (fixed, per_series)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return my - slope * mx, slope
