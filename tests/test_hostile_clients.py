"""Hostile clients (issue 14, item 2): idle, half-sent and malformed connections, a cap;
clients that never read their answer (issue 41).

Bounded versions of the attack (loopback only, limits shortened so each test takes about a
second); the long versions with the figures docs/reliability.md quotes are in bench/client_faults.py
(`make soak`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from exporter.app import Exporter
from exporter.model import Device, DeviceReading, Sample, SourceResult
from exporter.web.server import ServerLimits
from exporter.web.stats import ServerStats
from tests.support import StaticSource
from tests.support.exporter_config import config_for
from tests.support.fake_gpu import gpu_result
from tests.support.waiting import until

LIMITS = ServerLimits(max_connections=20, header_timeout=0.5, idle_timeout=1.0, quiet_after=60)


@pytest.fixture
async def exporter(tmp_path: Path) -> AsyncIterator[Exporter]:
    exp = Exporter(config_for(tmp_path / "none.sock"), sources={"fake": StaticSource(gpu_result())})
    exp.web_limits = LIMITS
    exp.web_stats = ServerStats(LIMITS.quiet_after)
    await exp.start()
    await exp.wait_ready(10)
    try:
        yield exp
    finally:
        await exp.stop()


async def connect(exp: Exporter) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    assert exp.port is not None
    return await asyncio.open_connection("127.0.0.1", exp.port)


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> float:
    """Seconds until the server closed the connection (EOF or reset)."""
    started = time.monotonic()
    try:
        while await asyncio.wait_for(reader.read(4096), seconds):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - started


async def scrape(exp: Exporter) -> int:
    async with aiohttp.ClientSession() as http, http.get(f"{exp.url}metrics") as resp:
        await resp.read()
        return resp.status


@pytest.mark.slow
async def test_an_idle_connection_is_closed_after_the_header_timeout(exporter: Exporter) -> None:
    reader, writer = await connect(exporter)
    took = await closed_within(reader, 5)
    writer.close()
    assert 0.4 <= took <= 1.5
    assert exporter.web_stats.closed["header_timeout"] == 1


@pytest.mark.slow
async def test_slowloris_is_closed_although_it_keeps_sending(exporter: Exporter) -> None:
    reader, writer = await connect(exporter)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: ")

    async def trickle() -> None:
        for _ in range(40):
            writer.write(b"a")
            await asyncio.sleep(0.05)

    trickling = asyncio.create_task(trickle())
    took = await closed_within(reader, 5)
    trickling.cancel()
    writer.close()
    assert took <= 1.5, "one byte every 50 ms must not keep a request head open"
    assert exporter.web_stats.closed["header_timeout"] == 1


@pytest.mark.slow
async def test_a_keep_alive_connection_idles_out(exporter: Exporter) -> None:
    reader, writer = await connect(exporter)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 200")
    took = await closed_within(reader, 5)
    writer.close()
    assert took <= 2.0


async def test_idle_connections_at_the_cap_never_lock_out_a_scraper(exporter: Exporter) -> None:
    idle = [await connect(exporter) for _ in range(3 * LIMITS.max_connections)]
    assert await scrape(exporter) == 200
    assert exporter.web_stats.open <= LIMITS.max_connections
    assert exporter.web_stats.closed["evicted"] >= 2 * LIMITS.max_connections
    for _, writer in idle:
        writer.close()


async def test_malformed_requests_are_counted_and_logged_once(
    exporter: Exporter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    bad = [
        b"GET /\x00 HTTP/1.1\r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
    ]
    for _ in range(10):
        for request in bad:
            reader, writer = await connect(exporter)
            writer.write(request)
            await closed_within(reader, 5)
            writer.close()
    assert exporter.web_stats.malformed.total == 30
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert "malformed HTTP requests" in lines[0].getMessage()
    assert not any(r.exc_info for r in caplog.records if r.name.startswith(("aiohttp", "exporter")))
    assert await scrape(exporter) == 200


async def test_accept_errors_are_counted_and_logged_once(
    exporter: Exporter, caplog: pytest.LogCaptureFixture
) -> None:
    """What asyncio reports when accept() fails with EMFILE, thousands of times: counted, logged
    once, and idle connections are closed to free descriptors for the retry."""
    idle = [await connect(exporter) for _ in range(10)]
    await asyncio.sleep(0.1)
    loop = asyncio.get_running_loop()
    handler = loop.get_exception_handler()
    assert handler is not None
    for _ in range(5000):
        handler(
            loop,
            {
                "message": "socket.accept() out of system resource",
                "exception": OSError(24, "Too many open files"),
            },
        )
    assert exporter.web_stats.accept_errors.total == 5000
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1
    assert exporter.web_stats.closed["evicted"] == 10
    for _, writer in idle:
        writer.close()


async def test_many_concurrent_scrapers_all_answered(exporter: Exporter) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def one() -> int:
            async with http.get(f"{exporter.url}metrics") as resp:
                await resp.read()
                return resp.status

        statuses = await asyncio.gather(*(one() for _ in range(LIMITS.max_connections)))
    assert statuses == [200] * LIMITS.max_connections


class _BrokenRendering:
    def cached(self, *, openmetrics: bool, gzipped: bool) -> bool:
        return True

    def body(self, *, openmetrics: bool, gzipped: bool) -> tuple[bytes, str]:
        raise RuntimeError("a bug in a handler")


async def test_a_failing_handler_logs_its_traceback_once(
    exporter: Exporter, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline = exporter.poller.pipeline  # keep the broken rendering in place:
    pipeline.steps = tuple(s for s in pipeline.steps if s.name != "prometheus")
    sink = type(exporter.prometheus)
    monkeypatch.setattr(sink, "rendered", property(lambda self: _BrokenRendering()))
    monkeypatch.setattr(sink, "cached", property(lambda self: True))
    for _ in range(20):
        assert await scrape(exporter) == 500
    assert exporter.web_stats.handler_errors.total == 20
    logged = [r for r in caplog.records if r.levelno >= logging.WARNING and r.exc_info]
    assert len(logged) == 1 and "a bug in a handler" in logged[0].getMessage()
    async with aiohttp.ClientSession() as http, http.get(f"{exporter.url}healthz") as resp:
        assert resp.status == 200


async def test_hoarded_keep_alive_connections_make_room_for_a_scraper(exporter: Exporter) -> None:
    held = []
    for _ in range(2 * LIMITS.max_connections):
        reader, writer = await connect(exporter)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        held.append((reader, writer))
    for reader, _ in held[-LIMITS.max_connections :]:
        assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).startswith(
            b"HTTP/1.1 200"
        )
    assert await scrape(exporter) == 200, "keep-alive connections idle between requests"
    assert exporter.web_stats.closed["connection_limit"] == 0
    for _, writer in held:
        writer.close()


def big_result(devices: int) -> SourceResult:
    """A node of `devices` GPUs, each with a few series: a /metrics body of some MB."""
    readings = tuple(
        DeviceReading(
            Device(f"GPU-{i:08d}-0000-4000-8000-{i:012d}", "gpu", "nvidia", "H100", "fake"),
            tuple(Sample(m, float(i)) for m in ("hw.power", "hw.energy", "hw.gpu.memory.usage")),
        )
        for i in range(devices)
    )
    return SourceResult("fake", readings)


@pytest.mark.slow
async def test_clients_that_never_read_hold_a_slice_of_the_body_each_not_a_copy(
    tmp_path: Path,
) -> None:
    """40 clients ask for a body of several MB and never read it (a 4 KiB receive window):
    the server queues at most a slice and the transport's mark for each (it held most of the
    body for each before issue 41: 500 such clients took 3.2 GiB), a scraper is answered
    meanwhile, and each is closed after the write timeout."""
    limits = ServerLimits(max_connections=64, write_timeout=1.0, quiet_after=60)
    exp = Exporter(config_for(tmp_path / "none.sock"), sources={"fake": StaticSource(
        big_result(6000))})  # fmt: skip
    exp.web_limits, exp.web_stats = limits, ServerStats(limits.quiet_after)
    await exp.start()
    held: list[socket.socket] = []
    try:
        await exp.wait_ready(10)
        async with aiohttp.ClientSession() as http, http.get(f"{exp.url}metrics") as resp:
            size = len(await resp.read())
        assert size > 2_000_000
        for _ in range(40):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                s.connect(("127.0.0.1", exp.port))
            held.append(s)
        server = exp._server
        assert server is not None
        await until(lambda: len(server.connections) == 40)
        for conn in server.connections:  # as under TCP memory pressure (the bench's 500): the
            assert conn.raw is not None  # kernel takes little, the process the rest
            conn.raw.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        for s in held:
            s.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.sleep(0.6)  # each answer started: the body is built on the first ask
        queued = [c.raw.get_write_buffer_size() for c in server.connections if c.raw]
        assert len(queued) == 40 and max(queued) <= 200 * 1024, (size, sorted(queued)[-3:])
        assert await scrape(exp) == 200
        await until(lambda: exp.web_stats.closed["write_timeout"] == 40, timeout=5.0)
    finally:
        for s in held:
            s.close()
        await exp.stop()
