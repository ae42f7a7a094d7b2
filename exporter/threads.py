"""Blocking calls that may never return (a hung driver) run in daemon threads.

`asyncio.to_thread` uses the loop's default executor, whose threads interpreter exit
joins: one driver call hung for minutes then holds SIGTERM for minutes. A daemon thread
does not hold the process; its result is handed back to the loop if the loop still runs.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def in_daemon_thread(fn: Callable[[], T], name: str = "blocking-call") -> asyncio.Future[T]:
    """Run `fn()` in a new daemon thread; the future resolves on the calling loop."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            result = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            error: BaseException | None = exc
            value: T | None = None
        else:
            error, value = None, result
        if not loop.is_closed():
            try:
                loop.call_soon_threadsafe(settle, value, error)
            except RuntimeError:
                return  # the loop closed between the check and the call: nobody waits

    threading.Thread(target=run, name=name, daemon=True).start()
    return future
