"""What the fault runs share (bench/faults.py runs them all): a row of the table they print,
an exporter process run from a source tree, and /metrics read back as it is polled.

Recovery is timed by polling /metrics every POLL seconds, so a figure of "1.0 s" at
`--collect-interval 1s` is one cycle.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
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
