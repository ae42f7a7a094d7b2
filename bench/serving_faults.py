"""What keeps /metrics served (issue 41), against real exporter processes: the web config and
the RDMA pool config replaced by a FIFO or /dev/zero, SIGHUP storms and a file touched
twice a second, password floods on a scraper's first check (from other addresses and from
its own, behind one NAT), and clients that never read their answer. For each: the scrapes
meanwhile (a scraper with the right password), the exporter's RSS peak and SIGTERM.
`python -m bench.faults` runs it; alone:

    python -m bench.serving_faults [--tree DIR] [--only WORD]

`--tree DIR` runs the exporter processes from another checkout (the figures "before" in
docs/reliability.md come from the base commit run this way).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import bcrypt
import yaml

from bench.bignode import big_pods
from bench.fault_harness import (
    Case,
    Process,
    Row,
    Watched,
    cases_main,
    read_metrics,
    rss_mib,
    run_cases,
    value,
)
from exporter.runtime.heap import SHIPPED_ENV
from simulator.node import SimulatedNode
from simulator.scenario import load_scenario
from tests.support.waiting import within

BARE = ["--kubelet-socket", "/nonexistent/kubelet.sock", "--no-collector.nvml"]
RIGHT = {"Authorization": "Basic " + base64.b64encode(b"prometheus:pw").decode()}


def _web_exporter(tree: Path, work: Path, name: str, users: dict[str, bytes],
                  args: tuple[str, ...] = ()) -> tuple[Process, Path]:  # fmt: skip
    """An exporter whose web config holds `users` (name -> bcrypt hash), on no hardware and
    no kubelet, at 1 s cycles; the config's path."""
    path = work / f"{name}.yml"
    path.write_text(yaml.safe_dump({"basic_auth_users": {u: h.decode() for u, h in users.items()}}))
    p = Process(tree, work / f"{name}.log", [*BARE, "--path.sysfs", str(work), "--web.config.file",
                str(path), "--collect-interval", "1s", *args], {})  # fmt: skip
    return p, path


def _hashed(cost: int, password: bytes = b"pw") -> bytes:
    return bcrypt.hashpw(password, bcrypt.gensalt(cost))


async def _ready(p: Process, headers: dict[str, str], timeout: float = 20.0) -> float | None:
    async def ok() -> bool:
        try:
            async with (
                aiohttp.ClientSession() as http,
                http.get(
                    f"{p.url}/metrics", headers=headers, timeout=aiohttp.ClientTimeout(total=2)
                ) as r,
            ):
                return r.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    return await within(ok, timeout)


def _sigterm(p: Process) -> str:
    if p.proc.poll() is not None:
        return f"exited before ({p.proc.returncode})"
    took = p.sigterm(20.0)
    if took is None:
        return "SIGTERM: still running after 20 s (SIGKILL)"
    return f"SIGTERM to exit {took:.1f} s"


# --- the web config ---------------------------------------------------------------------


async def web_config_replaced(tree: Path, work: Path, by: str, hup: bool) -> Row:
    """The web config replaced by a FIFO (or a link to /dev/zero) while running; with `hup`,
    a SIGHUP then too."""
    p, path = _web_exporter(tree, work, f"replaced-{by}", {"prometheus": _hashed(4)})
    try:
        await _ready(p, RIGHT)
        async with Watched(p, RIGHT) as w:
            await asyncio.sleep(1.0)
            path.unlink()
            if by == "fifo":
                os.mkfifo(path)
            else:
                path.symlink_to("/dev/zero")
            if hup:
                await asyncio.sleep(0.5)
                p.proc.send_signal(signal.SIGHUP)
            await asyncio.sleep(10.0)
        healthz = await _status(p, "/healthz")
        sigterm = _sigterm(p)
    finally:
        p.kill()
    what = "a FIFO" if by == "fifo" else "a symlink to /dev/zero"
    return Row(
        f"--web.config.file replaced by {what} while running" + (", then SIGHUP" if hup else ""),
        f"during 10 s: {w.scrapes()}, peak RSS {w.memory()}; /healthz then: {healthz}; {sigterm}",
        "n/a",
    )


async def _status(p: Process, path: str, headers: dict[str, str] | None = None) -> str:
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.get(
                f"{p.url}{path}", headers=headers or {}, timeout=aiohttp.ClientTimeout(total=5)
            ) as r,
        ):
            return str(r.status)
    except (aiohttp.ClientError, TimeoutError) as exc:
        return type(exc).__name__ or "timeout"


async def web_config_fifo_at_start(tree: Path, work: Path) -> Row:
    path = work / "start.yml"
    os.mkfifo(path)
    started = time.monotonic()
    proc = subprocess.Popen(  # noqa: ASYNC220 - waited for with a timeout, alone
        [sys.executable, "-m", "exporter", *BARE, "--web.config.file", str(path),
         "--web.listen-address", "127.0.0.1:0"],
        cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=10)
        return Row(
            "--web.config.file is a FIFO at start",
            f"exit {proc.returncode} in {time.monotonic() - started:.1f} s: "
            f"{out.decode().strip().splitlines()[-1] if out.strip() else 'no output'}",
            "n/a",
        )
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        return Row("--web.config.file is a FIFO at start",
                   f"still running after 10 s, {len(out.splitlines())} lines of output (killed)",
                   "n/a")  # fmt: skip


async def sighup_storm(
    tree: Path, work: Path, *, users: int, cost: int, hups: int, rate: float
) -> Row:
    others = {f"user{i}": _hashed(cost, b"x") for i in range(users - 1)}
    passwords = {"prometheus": _hashed(cost)} | others
    p, _ = _web_exporter(tree, work, f"hup-{users}-{cost}", passwords)
    try:
        await _ready(p, RIGHT, 60.0)
        async with Watched(p, RIGHT) as w:
            for _ in range(hups):
                p.proc.send_signal(signal.SIGHUP)
                await asyncio.sleep(1.0 / rate)
            await asyncio.sleep(3.0)
        sigterm = _sigterm(p)
    finally:
        p.kill()
    return Row(
        f"{hups} SIGHUPs at {rate:g}/s, {users} user(s) at bcrypt cost {cost}",
        f"{w.scrapes()}; {w.percentiles()}; {sigterm}",
        "n/a",
    )


async def touched(tree: Path, work: Path) -> Row:
    p, path = _web_exporter(tree, work, "touched", {"prometheus": _hashed(10)})
    try:
        await _ready(p, RIGHT)
        async with Watched(p, RIGHT) as w:
            for _ in range(40):
                path.touch()
                await asyncio.sleep(0.5)
        sigterm = _sigterm(p)
    finally:
        p.kill()
    return Row("--web.config.file (one cost-10 user) touched every 0.5 s for 20 s",
               f"{w.scrapes()}; {w.percentiles()}; {sigterm}", "n/a")  # fmt: skip


# --- the RDMA pool config ---------------------------------------------------------------


async def rdma_pool_fifo(tree: Path, work: Path) -> Row:
    node = SimulatedNode(load_scenario("mixed"), work / "mixed")
    await node.start()
    node.advance()
    pools = next(part.pool_path for part in node.parts if hasattr(part, "pool_path"))
    p = Process(tree, work / "rdma.log", [*node.exporter_args(), "--collect-interval", "1s"],
                dict(node.env()))  # fmt: skip
    ok = "kube_device_exporter_source_success"
    try:
        async with aiohttp.ClientSession() as http:
            await within(lambda: _ok(http, p), 20)
            text = pools.read_bytes()
            pools.unlink()
            os.mkfifo(pools)
            await asyncio.sleep(5.0)
            during = value(await read_metrics(http, p.url), ok, source="rdma")
            pools.unlink()
            pools.write_bytes(text)
            back = await within(lambda: _rdma_ok(http, p), 15.0)
        sigterm = _sigterm(p)
    finally:
        p.kill()
        await node.stop()
    return Row(
        "--collector.rdma.pool-config replaced by a FIFO for 5 s, then the file again",
        f"rdma source_success {during} during; {sigterm}",
        f"rdma succeeding again {f'{back:.1f} s' if back is not None else 'not within 15 s'} "
        "after the file is back",
    )


async def _ok(http: aiohttp.ClientSession, p: Process) -> bool:
    return bool(await read_metrics(http, p.url))


async def _rdma_ok(http: aiohttp.ClientSession, p: Process) -> bool:
    m = await read_metrics(http, p.url)
    return value(m, "kube_device_exporter_source_success", source="rdma") == 1.0


# --- password floods on a first check ---------------------------------------------------


async def first_check_flood(tree: Path, work: Path, nat: bool) -> Row:
    """A cost-10 user; 250 guessers (new passwords, as fast as answered) from 127.0.0.2 and up,
    or with `nat` 50 from 127.0.0.1, the scraper's own address; after 2 s the scraper, never
    seen before, scrapes every 0.5 s for 15 s."""
    p, _ = _web_exporter(tree, work, "flood-nat" if nat else "flood", {"prometheus": _hashed(10)})
    stop = asyncio.Event()
    sent = 0

    async def guesser(n: int) -> None:
        nonlocal sent
        local = ("127.0.0.1" if nat else f"127.0.{n // 250}.{n % 250 + 2}", 0)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=local)) as http:
            while not stop.is_set():
                guess = {"Authorization": "Basic " + base64.b64encode(
                    f"prometheus:g{n}-{sent}".encode()).decode()}  # fmt: skip
                try:
                    async with http.get(f"{p.url}/metrics", headers=guess,
                                        timeout=aiohttp.ClientTimeout(total=30)) as r:  # fmt: skip
                        await r.read()
                except (aiohttp.ClientError, TimeoutError):
                    await asyncio.sleep(0.05)
                sent += 1

    try:
        await _ready(p, {})  # 401: serving
        await within(lambda: _status_is(p, "/healthz", "200"), 20)
        guessing = [asyncio.ensure_future(guesser(n)) for n in range(50 if nat else 250)]
        await asyncio.sleep(2.0)
        answered, first, tries = 0, None, 0
        started = time.monotonic()
        async with aiohttp.ClientSession() as http:
            while time.monotonic() - started < 15.0:
                tries += 1
                status = await _get_status(http, p, RIGHT)
                if status == "200":
                    answered += 1
                    first = first if first is not None else time.monotonic() - started
                await asyncio.sleep(0.5)
        stop.set()
        await asyncio.gather(*guessing)
        sigterm = _sigterm(p)
    finally:
        p.kill()
    who = "50 guessers behind the scraper's own address (NAT)" if nat else "250 guessing addresses"
    return Row(
        f"password flood, {who}; a scraper never seen before",
        f"{sent} guesses; the scraper: {answered} of {tries} scrapes answered 200, the first "
        f"after {f'{first:.1f} s' if first is not None else 'never'}; {sigterm}",
        "n/a",
    )


async def _status_is(p: Process, path: str, want: str) -> bool:
    return await _status(p, path) == want


async def _get_status(http: aiohttp.ClientSession, p: Process, headers: dict[str, str]) -> str:
    try:
        async with http.get(f"{p.url}/metrics", headers=headers,
                            timeout=aiohttp.ClientTimeout(total=10)) as r:  # fmt: skip
            await r.read()
            return str(r.status)
    except (aiohttp.ClientError, TimeoutError):
        return "failed"


# --- clients that never read --------------------------------------------------------------


async def stalled_readers(
    tree: Path, work: Path, readers: int, devices: int, scenario_name: str = "mixed"
) -> Row:
    """`readers` clients send GET /metrics and never read (a 4 KiB receive buffer), held 40 s
    (past the 30 s write timeout), on a bundled node plus `devices` allocated IDs."""
    scenario = load_scenario(scenario_name)
    if devices:
        scenario = dataclasses.replace(scenario, pods=scenario.pods + big_pods(devices, 1000))
    node = SimulatedNode(scenario, work / "stalled")
    node.kubelet.set_behaviour(rate_limit=False)
    await node.start()
    node.advance()
    p = Process(tree, work / "stalled.log", [*node.exporter_args(), "--collect-interval", "5s"],
                {**node.env(), **SHIPPED_ENV})  # fmt: skip
    held: list[socket.socket] = []
    try:
        async with aiohttp.ClientSession() as http:
            await within(lambda: _ok(http, p), 60)
            async with http.get(f"{p.url}/metrics") as r:
                size = len(await r.read())
        before = rss_mib(p.proc.pid)
        async with Watched(p) as w:
            for _ in range(readers):
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.connect(("127.0.0.1", p.port))
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                held.append(s)
            await asyncio.sleep(40.0)
        after = rss_mib(p.proc.pid)
        m = {} if w.killed else await _metrics(p)
        closed_total = "kube_device_exporter_http_connections_closed_total"
        closed = value(m, closed_total, reason="write_timeout")
        sigterm = _sigterm(p)
    finally:
        for s in held:
            s.close()
        p.kill()
        await node.stop()
    return Row(
        f"{readers} clients that never read a {size / 1e6:.2f} MB /metrics body, held 40 s",
        f"RSS {before:.0f} MiB before, peak {w.memory()}, {after:.0f} MiB after; {closed} "
        f"closed for the write timeout; {w.scrapes()}; {sigterm}",
        "n/a",
    )


async def _metrics(p: Process) -> dict[str, list[tuple[dict[str, str], float]]]:
    async with aiohttp.ClientSession() as http:
        return await read_metrics(http, p.url)


CASES: dict[str, Case] = {
    "web config: FIFO": lambda t, w: web_config_replaced(t, w, "fifo", hup=False),
    "web config: FIFO, SIGHUP": lambda t, w: web_config_replaced(t, w, "fifo", hup=True),
    "web config: /dev/zero": lambda t, w: web_config_replaced(t, w, "zero", hup=False),
    "web config: FIFO at start": web_config_fifo_at_start,
    "SIGHUP: 200 at 20/s": lambda t, w: sighup_storm(t, w, users=1, cost=10, hups=200, rate=20),
    "SIGHUP: 10, 8 users at cost 12": lambda t, w: sighup_storm(
        t, w, users=8, cost=12, hups=10, rate=20
    ),
    "web config: touched": touched,
    "rdma pool config: FIFO": rdma_pool_fifo,
    "auth flood: 250 addresses": lambda t, w: first_check_flood(t, w, nat=False),
    "auth flood: NAT": lambda t, w: first_check_flood(t, w, nat=True),
    "stalled readers: 400, the demo node": lambda t, w: stalled_readers(t, w, 400, 0, "demo"),
    "stalled readers: 500, node at the budget": lambda t, w: stalled_readers(t, w, 500, 40000),
}


async def run(tree: Path, only: str = "") -> list[Row]:
    return await run_cases(CASES, tree, only)


if __name__ == "__main__":
    sys.exit(cases_main("bench.serving_faults", CASES))
