"""Waiting in real time for what a live peer does (a server's watch, a receiver's batch, an
exporter's /metrics): `until` for tests, which fail past the timeout; `within` for the
bench, which reports how long it took or that it never happened."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable


async def within(
    check: Callable[[], object], timeout: float, interval: float = 0.1
) -> float | None:
    """Seconds until `check()` is true (awaited when it returns an awaitable), polled every
    `interval`; None once `timeout` has passed."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return time.monotonic() - started
        await asyncio.sleep(interval)
    return None


async def until(
    check: Callable[[], object],
    timeout: float = 5.0,
    what: str = "condition met",
    interval: float = 0.01,
) -> float:
    """Seconds until `check()` is true, as `within`; fails naming `what` past `timeout`."""
    took = await within(check, timeout, interval)
    if took is None:
        raise AssertionError(f"not within {timeout:g} s: {what}")
    return took
