"""What the fault runs share (bench/faults.py runs them all): a row of the table they print,
an exporter process run from a source tree, and /metrics read back as it is polled.

Recovery is timed by polling /metrics every POLL seconds, so a figure of "1.0 s" at
`--collect-interval 1s` is one cycle.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from simulator.ports import free_port


@dataclass
class Row:
    """One line of the table docs/reliability.md quotes."""

    fault: str
    happened: str
    recovery: str


def print_table(rows: list[Row]) -> None:
    """The rows as the markdown table docs/reliability.md quotes."""
    print("| fault | what happened | recovery |\n|---|---|---|")
    for r in rows:
        print(f"| {r.fault} | {r.happened} | {r.recovery} |")


POLL = 0.1
"""Seconds between two reads of /metrics while waiting for a change."""

Metrics = dict[str, list[tuple[dict[str, str], float]]]


async def scrape_text(http: aiohttp.ClientSession, url: str, timeout: float) -> str | None:
    """/metrics as text; None when it does not answer 200 (503 before the first cycle) within
    `timeout` seconds."""
    try:
        async with http.get(f"{url}/metrics", timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            if r.status != 200:  # 503 before the first cycle
                return None
            return await r.text()
    except (aiohttp.ClientError, TimeoutError):
        return None


async def read_metrics(http: aiohttp.ClientSession, url: str) -> Metrics:
    text = await scrape_text(http, url, 5)
    if text is None:
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


class Process:
    """`python -m exporter ARGS` from `tree`, its output in `log`."""

    def __init__(self, tree: Path, log: Path, args: list[str], env: dict[str, str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "exporter", *args,
                 "--web.listen-address", f"127.0.0.1:{self.port}"],
                cwd=tree, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def log(self) -> str:
        return self.log_path.read_text()

    def sigterm(self, limit: float = 30.0) -> float | None:
        """Seconds from SIGTERM to exit; None when it had to be killed after `limit`."""
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(limit)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None
        return time.monotonic() - started

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


RSS_CEILING_MIB = 1024.0
"""An exporter past this is killed: the figure is then "over 1 GiB" (the machine is shared)."""


def rss_mib(pid: int, key: str = "VmRSS") -> float:
    """`key` of /proc/PID/status in MiB (VmHWM: the peak); 0 once the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


class Watched:
    """While a fault lasts: the exporter's RSS sampled every 0.2 s (killed past the ceiling),
    and a scrape every 0.25 s (10 s timeout) with `headers`, its latencies kept."""

    def __init__(self, p: Process, headers: dict[str, str] | None = None) -> None:
        self.p = p
        self.headers = headers or {}
        self.peak = 0.0
        self.killed = False
        self.latencies: list[float] = []
        self.failed = 0
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Watched:
        self._tasks = [asyncio.create_task(self._memory()), asyncio.create_task(self._scrapes())]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def _memory(self) -> None:
        while not self._stop.is_set():
            rss = rss_mib(self.p.proc.pid)
            self.peak = max(self.peak, rss)
            if rss > RSS_CEILING_MIB:
                self.killed = True
                self.p.kill()
                return
            await asyncio.sleep(0.2)

    async def _scrapes(self) -> None:
        async with aiohttp.ClientSession() as http:
            while not self._stop.is_set() and not self.killed:
                started = time.monotonic()
                try:
                    async with http.get(
                        f"{self.p.url}/metrics", headers=self.headers,
                        timeout=aiohttp.ClientTimeout(total=10),
                    ) as r:  # fmt: skip
                        await r.read()
                        ok = r.status == 200
                except (aiohttp.ClientError, TimeoutError):
                    ok = False
                if ok:
                    self.latencies.append(time.monotonic() - started)
                else:
                    self.failed += 1
                await asyncio.sleep(0.25)

    def memory(self) -> str:
        return f"over {RSS_CEILING_MIB:.0f} MiB (killed)" if self.killed else f"{self.peak:.0f} MiB"

    def scrapes(self) -> str:
        lat = sorted(self.latencies)
        if not lat:
            return f"0 scrapes answered, {self.failed} failed"
        p99 = _quantile(lat, 0.99)
        return f"{len(lat)} scrapes answered (p99 {p99:.0f} ms), {self.failed} failed"

    def percentiles(self) -> str:
        lat = sorted(self.latencies)
        if not lat:
            return "no scrape answered"
        return (f"scrape p50 {_quantile(lat, 0.5):.0f} ms, p99 {_quantile(lat, 0.99):.0f} ms, "
                f"slowest {lat[-1] * 1000:.0f} ms")  # fmt: skip


def _quantile(ordered: list[float], q: float) -> float:
    """The `q` quantile of sorted seconds, in ms."""
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000


Case = Callable[[Path, Path], Awaitable[Row]]
"""One fault run: (the tree to run the exporter from, a work folder of its own) -> its row."""


async def run_cases(cases: Mapping[str, Case], tree: Path, only: str = "") -> list[Row]:
    """Each case whose name holds `only`, in a folder of its own; its row printed as it ends."""
    rows = []
    for name, case in cases.items():
        if only.lower() not in name.lower():
            continue
        with tempfile.TemporaryDirectory(prefix="kde-faults-") as tmp:
            rows.append(await case(tree, Path(tmp)))
        print_table(rows[-1:])
    return rows


def cases_main(prog: str, cases: Mapping[str, Case], argv: list[str] | None = None) -> int:
    """`python -m PROG [--tree DIR] [--only WORD]`: the cases, then the whole table."""
    parser = argparse.ArgumentParser(prog=f"python -m {prog}")
    parser.add_argument("--tree", type=Path, default=Path.cwd(), help="source tree to run")
    parser.add_argument("--only", default="", help="the cases whose name holds this")
    args = parser.parse_args(argv)
    rows = asyncio.run(run_cases(cases, args.tree.resolve(), args.only))
    print()
    print_table(rows)
    return 0
