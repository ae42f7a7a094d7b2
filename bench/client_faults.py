"""Client faults: `kde-simulate demo` attacked with concurrent scrapers, idle, slowloris and
malformed connections, then soaked; and an exporter at a file-descriptor limit below its
connection cap. Each row says what was done, what happened and how long the exporter took
to be whole again (bench/faults.py prints them)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.fault_harness import POLL, Row
from simulator.ports import free_port

DEMO = ["simulator", "demo"]
"""`kde-simulate demo`; each Target list starts with the module `python -m` runs."""

BARE = ["exporter", "--kubelet-socket", "/nonexistent/kubelet.sock", "--no-collector.nvml"]
"""An exporter with no simulated node in its process (whose files would share its fd limit)."""


class Target:
    def __init__(self, log: Path, args: list[str], fd_limit: int | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        self._log = log.open("w")
        limit = ["prlimit", f"--nofile={fd_limit}:{fd_limit}"] if fd_limit else []
        self.proc = subprocess.Popen(
            [*limit, sys.executable, "-m", *args,
             "--web.listen-address", f"127.0.0.1:{self.port}"],
            stdout=self._log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def log_lines(self) -> int:
        self._log.flush()
        return len(self.log_path.read_text().splitlines())

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)
        self._log.close()


async def scrape(http: aiohttp.ClientSession, url: str) -> tuple[bool, float]:
    started = time.monotonic()
    try:
        async with http.get(f"{url}/metrics", timeout=aiohttp.ClientTimeout(total=10)) as r:
            await r.read()
            return r.status == 200, time.monotonic() - started
    except (aiohttp.ClientError, TimeoutError):
        return False, time.monotonic() - started


async def wait_ready(url: str) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(300):
            ok, _ = await scrape(http, url)
            if ok:
                return
            await asyncio.sleep(0.1)
    raise RuntimeError("exporter did not become ready")


async def scrapers(t: Target, n: int, rounds: int) -> Row:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        results = []
        for _ in range(rounds):
            results += await asyncio.gather(*(scrape(http, t.url) for _ in range(n)))
    errors = sum(not ok for ok, _ in results)
    worst = max(s for _, s in results)
    return Row(
        f"{n} concurrent scrapers x {rounds} rounds",
        f"{errors} errors in {len(results)} scrapes; slowest {worst * 1000:.0f} ms",
        "n/a (no degradation)",
    )


async def _hold_then_scrape(
    t: Target, n: int
) -> tuple[list[tuple[asyncio.StreamReader, asyncio.StreamWriter]], tuple[bool, float]]:
    """Open up to `n` idle connections (those refused are skipped), then one scrape."""
    conns = []
    for _ in range(n):
        with contextlib.suppress(OSError):
            conns.append(await asyncio.open_connection("127.0.0.1", t.port))
    async with aiohttp.ClientSession() as http:
        return conns, await scrape(http, t.url)


async def idle_connections(t: Target, n: int) -> Row:
    conns, (ok, took) = await _hold_then_scrape(t, n)
    fds = t.fds()
    started = time.monotonic()
    closed = 0
    for reader, _ in conns:
        with contextlib.suppress(OSError, TimeoutError):
            await asyncio.wait_for(reader.read(), 30)
        closed += 1
    gone = time.monotonic() - started
    for _, writer in conns:
        writer.close()
    return Row(
        f"{n} idle connections (nothing sent)",
        f"scrape during: {'200' if ok else 'FAILED'} in {took * 1000:.0f} ms; exporter fds "
        f"{fds} (cap 512 connections); all {closed} closed by the server",
        f"{gone:.1f} s until the last idle connection was closed (header timeout 10 s)",
    )


async def slowloris(t: Target, n: int, seconds: float) -> Row:
    conns = [await asyncio.open_connection("127.0.0.1", t.port) for _ in range(n)]
    for _, w in conns:
        w.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: ")
    started = time.monotonic()
    alive = n
    async with aiohttp.ClientSession() as http:
        ok, took = await scrape(http, t.url)
        while alive and time.monotonic() - started < seconds:
            alive = 0
            for _, w in conns:
                if not w.is_closing():
                    with contextlib.suppress(OSError):
                        w.write(b"a")
                        await w.drain()
                        alive += 1
            await asyncio.sleep(1.0)
    took_all = time.monotonic() - started
    for _, w in conns:
        w.close()
    return Row(
        f"slowloris: {n} connections sending one header byte a second",
        f"scrape during: {'200' if ok else 'FAILED'} in {took * 1000:.0f} ms; "
        f"{n - alive} of {n} cut off",
        f"{took_all:.1f} s until all were closed (header timeout 10 s)",
    )


async def malformed(t: Target, n: int) -> Row:
    before = t.log_lines()
    bad = [
        b"GET /\x00 HTTP/1.1\r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
    ]
    for i in range(n):
        with contextlib.suppress(OSError):
            reader, writer = await asyncio.open_connection("127.0.0.1", t.port)
            writer.write(bad[i % len(bad)])
            with contextlib.suppress(OSError, TimeoutError):
                await asyncio.wait_for(reader.read(), 5)
            writer.close()
    async with aiohttp.ClientSession() as http:
        ok, _ = await scrape(http, t.url)
    return Row(
        f"{n} malformed requests (NUL byte, PRI, Content-Length with Transfer-Encoding)",
        f"{t.log_lines() - before} log lines; scrape after: {'200' if ok else 'FAILED'}",
        "immediate (each connection answered 400 and closed)",
    )


async def fd_exhaustion(log: Path, fd_limit: int, n: int, seconds: float) -> Row:
    """The exporter at a file-descriptor limit below its connection cap: accept() fails."""
    t = Target(log, BARE, fd_limit=fd_limit)
    try:
        await wait_ready(t.url)
        before = t.log_lines()
        conns, (ok, took) = await _hold_then_scrape(t, n)
        await asyncio.sleep(seconds)
        lines = t.log_lines() - before
        for _, writer in conns:
            writer.close()
        started = time.monotonic()
        async with aiohttp.ClientSession() as http:
            for _ in range(int(60 / POLL)):
                if (await scrape(http, t.url))[0]:
                    break
                await asyncio.sleep(POLL)
        recovered = time.monotonic() - started
    finally:
        t.stop()
    return Row(
        f"file descriptors exhausted: {n} connections held for {seconds:g} s at a limit of "
        f"{fd_limit}",
        f"scrape during: {'200' if ok else 'FAILED'} in {took * 1000:.0f} ms (the cap drops "
        f"under the fd limit, the longest-idle connections make room); {lines} log lines",
        f"{recovered:.1f} s from the connections closing to a scrape answered",
    )


async def soak(t: Target, seconds: float) -> Row:
    rss0, fds0 = t.rss_mib(), t.fds()
    errors = count = 0
    started = time.monotonic()
    async with aiohttp.ClientSession() as http:
        while time.monotonic() - started < seconds:
            ok, _ = await asyncio.wait_for(scrape(http, t.url), 15)
            errors += not ok
            count += 1
            await asyncio.sleep(0.1)
    return Row(
        f"soak: a scrape every 100 ms for {seconds:.0f} s",
        f"{errors} errors in {count} scrapes; RSS {rss0:.1f} -> {t.rss_mib():.1f} MiB; "
        f"fds {fds0} -> {t.fds()}",
        "n/a",
    )


async def client_faults(long: bool) -> list[Row]:
    """Every client fault, the long versions with `long` (make soak)."""
    with tempfile.TemporaryDirectory(prefix="kde-faults-") as tmp:
        t = Target(Path(tmp) / "exporter.log", DEMO)
        try:
            await wait_ready(t.url)
            rows = [
                await scrapers(t, 200, 20 if long else 3),
                await idle_connections(t, 1000),
                await slowloris(t, 200, 40),
                await malformed(t, 3000 if long else 300),
            ]
            rows.append(await soak(t, 600.0 if long else 30.0))
        finally:
            t.stop()
        rows.append(await fd_exhaustion(Path(tmp) / "fd.log", 128, 300, 40.0 if long else 10.0))
    return rows
