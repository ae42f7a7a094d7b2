"""`python -m bench threads`: where a cycle's CPU goes, thread by thread.

One exporter on a simulated node (its own process), scraped every 15 s as Prometheus does,
at one collect interval. Each live thread's CPU over the window comes from
/proc/PID/task/*/schedstat under the name the kernel shows (the exporter names its
threads: exporter/runtime/threads.py), and how often it went to sleep (voluntary context
switches: each a wake-up, which a VM charges dearly); what the whole process used comes
from /proc/PID/stat, so the threads that ended within the window (gRPC's, which live only
during a kubelet poll) are the difference. Divided by the cycles the exporter ran: per
cycle.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import aiohttp

from bench.cost import SCRAPE_EVERY, learn_cadence
from bench.procs import ExporterProcess, NodeProcess, cpu_seconds, thread_cpu, thread_sleeps

ENDED = "(threads that ended in the window)"


@dataclass(frozen=True)
class ThreadCost:
    name: str
    ms_per_cycle: float
    core_share: float
    sleeps_per_cycle: float | None = None
    """Times it went to sleep per cycle; None for the threads that ended."""


@dataclass(frozen=True)
class Threads:
    interval: str
    cycles: float
    elapsed_s: float
    rows: list[ThreadCost]

    @property
    def total_ms_per_cycle(self) -> float:
        return sum(r.ms_per_cycle for r in self.rows)


async def measure(
    scenario: str, workdir: Path, *, interval: str, warmup: float, window: float
) -> Threads:
    node = NodeProcess.start(scenario, workdir)
    exporter = ExporterProcess(node, interval)
    try:
        async with aiohttp.ClientSession() as http:
            await exporter.wait_ready(http)
            await asyncio.sleep(warmup)
            await learn_cadence([partial(exporter.scrape, http)])
            cycles0, _ = await exporter.counters(http)
            before, total0, t0 = (
                thread_cpu(exporter.pid),
                cpu_seconds(exporter.pid),
                time.monotonic(),
            )
            slept0 = thread_sleeps(exporter.pid)
            while (left := window - (time.monotonic() - t0)) > 0:
                await asyncio.sleep(min(SCRAPE_EVERY, left))
                await exporter.scrape(http)
            after, total1 = thread_cpu(exporter.pid), cpu_seconds(exporter.pid)
            slept1 = thread_sleeps(exporter.pid)
            elapsed = time.monotonic() - t0
            cycles1, _ = await exporter.counters(http)
    finally:
        exporter.stop()
        node.stop()
    cycles = max(cycles1 - cycles0, 1.0)
    main = next((name for tid, name in after if tid == exporter.pid), "")
    by_name: dict[str, float] = defaultdict(float)
    sleeps: dict[str, int] = defaultdict(int)
    for (tid, name), seconds in after.items():
        label = "main (event loop)" if tid == exporter.pid else name
        if name == main and tid != exporter.pid:
            label = "(unnamed)"
        by_name[label] += seconds - before.get((tid, name), 0.0)
        sleeps[label] += slept1.get((tid, name), 0) - slept0.get((tid, name), 0)
    by_name[ENDED] = max(0.0, (total1 - total0) - sum(by_name.values()))
    rows = [
        ThreadCost(
            name,
            seconds / cycles * 1e3,
            seconds / elapsed,
            None if name == ENDED else sleeps[name] / cycles,
        )
        for name, seconds in sorted(by_name.items(), key=lambda kv: -kv[1])
        if seconds > 0
    ]
    return Threads(interval, cycles, elapsed, rows)


def table(result: Threads) -> str:
    def sleeps(r: ThreadCost) -> str:
        return "" if r.sleeps_per_cycle is None else f"{r.sleeps_per_cycle:.1f}"

    known = [r.sleeps_per_cycle for r in result.rows if r.sleeps_per_cycle is not None]
    lines = [
        "| thread | ms per cycle | share of a core | wake-ups per cycle |",
        "|---|---|---|---|",
        *(
            f"| {r.name} | {r.ms_per_cycle:.2f} | {r.core_share:.3%} | {sleeps(r)} |"
            for r in result.rows
        ),
        f"| **whole process** | **{result.total_ms_per_cycle:.2f}** | "
        f"**{sum(r.core_share for r in result.rows):.3%}** | **{sum(known):.1f}** |",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench threads")
    parser.add_argument("--scenario", default="dense")
    parser.add_argument("--interval", default="1s")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--window", type=float, default=60.0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kde-threads-") as tmp:
        result = asyncio.run(
            measure(
                args.scenario,
                Path(tmp),
                interval=args.interval,
                warmup=args.warmup,
                window=args.window,
            )
        )
    print(
        f"{args.scenario}, {args.interval} cycles, {result.cycles:.0f} cycles "
        f"in {result.elapsed_s:.0f} s\n"
    )
    print(table(result))
    return 0
