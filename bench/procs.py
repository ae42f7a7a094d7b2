"""Processes the bench measures: a simulated node (`kde-simulate --node-only`), exporters
reading it from their own processes, a static server, node_exporter. CPU and memory are
read from /proc, as `top` would, so nothing in the measured process helps measure it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from exporter.runtime.heap import SHIPPED_ENV
from simulator.ports import free_port

TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
)


def cpu_seconds(pid: int) -> float:
    """CPU time of a process: user + system of every thread it ran, the threads that ended
    included, in nanoseconds: the process's CPU clock (clock_gettime(2) on the clock id
    glibc's clock_getcpuclockid(3) makes of a PID, `_process_clock`). Not the sum of the
    live threads' /proc/PID/task/*/schedstat: threads end while the exporter runs (gRPC's,
    after each kubelet poll: the channel is closed between polls,
    exporter/podresources/schedule.py), and their CPU would be lost. Not /proc/PID/stat
    either, where it is counted in 10 ms ticks: an exporter at 30 s spends about ten of
    them in a 90 s window, so one tick moved a ratio by a tenth. That file stands in where
    the clock cannot be read (another user's process)."""
    try:
        return time.clock_gettime(_process_clock(pid))
    except OSError:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS


def _process_clock(pid: int) -> int:
    """The CPU-time clock id of a whole process, as glibc's clock_getcpuclockid(3) makes it
    (the kernel's CPUCLOCK_SCHED of the thread group, posix-cpu-timers.h)."""
    return ((~pid) << 3) | 2


_ENDED = (FileNotFoundError, ProcessLookupError)
"""What reading a thread's /proc/PID/task/TID files raises once it has ended: ENOENT, or
ESRCH for a thread that ended between opening a file and reading it (make bench stopped on
one)."""


def thread_cpu(pid: int) -> dict[tuple[int, str], float]:
    """(TID, name as the kernel shows it) -> CPU seconds on a CPU so far, of each live
    thread (/proc/PID/task/*/schedstat, nanoseconds)."""
    out: dict[tuple[int, str], float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(*_ENDED, ValueError, IndexError):  # just ended
            ns = int((task / "schedstat").read_text().split()[0])
            out[(int(task.name), (task / "comm").read_text().strip())] = ns / 1e9
    return out


def thread_sleeps(pid: int) -> dict[tuple[int, str], int]:
    """(TID, name) -> times each live thread went to sleep so far (voluntary context
    switches, /proc/PID/task/*/status): each one is a wake-up paid for later."""
    out: dict[tuple[int, str], int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(*_ENDED, ValueError, IndexError):  # just ended
            status = (task / "status").read_text()
            line = status.split("voluntary_ctxt_switches:", 1)[1].split("\n", 1)[0]
            out[(int(task.name), (task / "comm").read_text().strip())] = int(line)
    return out


def threads_and_switches(pid: int) -> tuple[int, int]:
    """(threads, context switches so far: voluntary + involuntary, all live threads), from
    /proc/PID/task/*/status. A voluntary switch is a thread going to sleep, so each is a
    wake-up undone; their rate is what an idle process costs the CPUs beyond its CPU time."""
    threads = switches = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(*_ENDED):  # a thread that just ended
            for line in (task / "status").read_text().splitlines():
                if "ctxt_switches:" in line:  # voluntary_ and nonvoluntary_
                    switches += int(line.split()[1])
            threads += 1
    return threads, switches


def rss_bytes(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE


class Process:
    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            list(argv),
            env={**os.environ, **(env or {})},
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.pid = self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class NodeProcess:
    """`kde-simulate SCENARIO --node-only`, and what it printed."""

    process: Process
    env: dict[str, str]
    args: list[str]

    @classmethod
    def start(cls, scenario: str, workdir: Path) -> NodeProcess:
        workdir.mkdir(parents=True, exist_ok=True)
        process = Process(
            [sys.executable, "-m", "simulator", scenario, "--node-only"],
            {"KDE_SIMULATE_WORKDIR": str(workdir)},
        )
        assert process.proc.stdout is not None
        for line in process.proc.stdout:
            if line.startswith("{"):
                spec = json.loads(line)
                return cls(process, spec["env"], spec["args"])
        process.stop()
        raise RuntimeError(f"simulate {scenario} --node-only printed no environment")

    def stop(self) -> None:
        self.process.stop()


class ExporterProcess:
    def __init__(
        self,
        node: NodeProcess,
        interval: str,
        *extra: str,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        """`cwd` (and PYTHONPATH in `env`): run another tree's `exporter` package."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.process = Process(
            [
                sys.executable,
                "-m",
                "exporter",
                *node.args,
                "--collect-interval",
                interval,
                "--web.listen-address",
                f"127.0.0.1:{self.port}",
                *extra,
            ],
            {**SHIPPED_ENV, **node.env, **(env or {})},  # as the image runs it
            cwd,
        )
        self.pid = self.process.pid
        self.ready_after = 0.0

    async def wait_ready(self, http: aiohttp.ClientSession, timeout: float = 60.0) -> float:
        """Seconds from process start to /readyz answering 200."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.proc.poll() is not None:
                raise RuntimeError(f"exporter exited with {self.process.proc.returncode}")
            try:
                async with http.get(f"{self.url}readyz") as r:
                    if r.status == 200:
                        self.ready_after = time.monotonic() - self.process.started
                        return self.ready_after
            except aiohttp.ClientError:
                pass  # not listening yet: try again shortly
            await asyncio.sleep(0.02)
        raise TimeoutError(f"exporter not ready within {timeout:g}s")

    async def scrape(self, http: aiohttp.ClientSession) -> bytes:
        headers = {"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"}
        async with http.get(f"{self.url}metrics", headers=headers) as r:
            return await r.read()

    async def counters(
        self, http: aiohttp.ClientSession, *, aside: bool = False
    ) -> tuple[float, int]:
        """(cycles run, series) from a Prometheus-style scrape; `aside`: from the text format
        instead, so that the read is not one more scrape of the format being measured (the
        exporter learns each format's scrape period from its scrapes: sinks/cadence.py)."""
        if aside:
            async with http.get(f"{self.url}metrics", headers={"Accept": "text/plain"}) as r:
                text = await r.text()
        else:
            text = (await self.scrape(http)).decode()
        cycles = re.search(r"^kube_device_exporter_cycles_total\{[^}]*\} (\S+)", text, re.M)
        series = re.search(r"^kube_device_exporter_series\{[^}]*\} (\S+)", text, re.M)
        assert cycles and series, "self-metrics missing from /metrics"
        return float(cycles.group(1)), int(float(series.group(1)))

    def stop(self) -> None:
        self.process.stop()
