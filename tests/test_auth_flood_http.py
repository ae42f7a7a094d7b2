"""A password flood over HTTP against the real exporter (issue 25, item 3): the real scraper,
authenticated once, keeps being answered well within its timeout while 250 clients guess.

Only the exporter and aiohttp are used, so the same file runs against older code too (the
flood made the scraper wait behind the bcrypt queue there: its cached success was evicted
by 128 wrong guesses)."""

from __future__ import annotations

import asyncio
import base64
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import bcrypt
import pytest
import yaml

from exporter.app import Exporter
from tests.support import StaticSource
from tests.support.exporter_config import config_for
from tests.support.fake_gpu import gpu_result

PASSWORD = b"s3cret"
COST = 8
"""12 ms a check here: 128 guesses (enough to evict a cache of 128) take 1.5 s, and a check
queued behind 250 guessers waits 3 s."""


def header(user: str, password: bytes) -> str:
    return "Basic " + base64.b64encode(user.encode() + b":" + password).decode()


FLOOD_CLIENTS = 250


@pytest.fixture
async def guarded(tmp_path: Path) -> AsyncIterator[Exporter]:
    """Basic auth only (no TLS: the flood is about bcrypt, not handshakes), at COST."""
    path = tmp_path / "web.yml"
    hashed = bcrypt.hashpw(PASSWORD, bcrypt.gensalt(COST)).decode()
    path.write_text(yaml.safe_dump({"basic_auth_users": {"prometheus": hashed}}))
    exp = Exporter(
        config_for(tmp_path / "none.sock", "--web.config.file", str(path)),
        sources={"fake": StaticSource(gpu_result())},
    )
    await exp.start()
    await exp.wait_ready(10)
    try:
        yield exp
    finally:
        await exp.stop()


async def flood(url: str, stop: asyncio.Event) -> int:
    """Wrong guesses from FLOOD_CLIENTS clients (127.0.0.2 and up), each as fast as it is
    answered, until `stop`; how many were sent."""
    sent = 0

    async def guesser(n: int) -> None:
        nonlocal sent
        connector = aiohttp.TCPConnector(local_addr=(f"127.0.{n // 250}.{n % 250 + 2}", 0))
        async with aiohttp.ClientSession(connector=connector) as http:
            while not stop.is_set():
                # a new password each time (a repeated one may be answered from a cache)
                auth = {"Authorization": header("prometheus", f"guess{n}-{sent}".encode())}
                try:
                    async with http.get(url, headers=auth) as r:
                        await r.read()
                except aiohttp.ClientError:
                    await asyncio.sleep(0.05)
                sent += 1

    await asyncio.gather(*(guesser(n) for n in range(FLOOD_CLIENTS)))
    return sent


@pytest.mark.slow
async def test_a_flood_of_wrong_guesses_never_starves_the_real_scraper(guarded: Exporter) -> None:
    url = f"{guarded.url}metrics"
    right = {"Authorization": header("prometheus", PASSWORD)}
    latencies: list[float] = []
    async with aiohttp.ClientSession() as http:
        async with http.get(url, headers=right) as r:
            assert r.status == 200
        stop = asyncio.Event()
        guessing = asyncio.ensure_future(flood(url, stop))
        await asyncio.sleep(2.0)  # 128 distinct guesses checked, and many more queued
        for _ in range(20):
            started = time.monotonic()
            async with http.get(url, headers=right, timeout=aiohttp.ClientTimeout(10)) as r:
                assert r.status == 200
                await r.read()
            latencies.append(time.monotonic() - started)
            await asyncio.sleep(0.25)
        stop.set()
        sent = await guessing
    stats = guarded.web_stats
    print(
        f"{sent} guesses from {FLOOD_CLIENTS} clients: scrapes p50 "
        f"{statistics.median(latencies) * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms; "
        f"401: {stats.unauthorized}, 429: {getattr(stats, 'rate_limited', None)}"
    )
    assert max(latencies) < 2.0, latencies
    rate_limited = getattr(stats, "rate_limited", 0)
    assert rate_limited > 0 and stats.unauthorized > 0, "failures are counted both ways"
