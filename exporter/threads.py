"""Blocking calls that may never return (a hung driver) run in daemon threads.

`asyncio.to_thread` uses the loop's default executor, whose threads interpreter exit
joins: one driver call hung for minutes then holds SIGTERM for minutes. A daemon thread
does not hold the process; its result is handed back to the loop if the loop still runs.

A source is called every cycle, so it gets a `DaemonWorker`: one daemon thread that lives
as long as the source and runs its calls one at a time (starting a thread per call cost
more CPU per cycle than a small source's whole collect). The poller never queues a call
behind a stuck one (it skips a source whose last call is still running), so a worker
stuck in a driver call strands nothing but that call.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_Job = tuple[Callable[[], Any], asyncio.AbstractEventLoop, "asyncio.Future[Any]"]


def _run_and_settle(
    fn: Callable[[], T], loop: asyncio.AbstractEventLoop, future: asyncio.Future[T]
) -> None:
    """In the worker thread: run `fn`, hand its result or error to `future` on `loop`."""
    try:
        result = fn()
    except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
        error: BaseException | None = exc
        value: T | None = None
    else:
        error, value = None, result

    def settle() -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)  # type: ignore[arg-type]

    if not loop.is_closed():
        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:
            return  # the loop closed between the check and the call: nobody waits


def in_daemon_thread(fn: Callable[[], T], name: str = "blocking-call") -> asyncio.Future[T]:
    """Run `fn()` in a new daemon thread; the future resolves on the calling loop."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    threading.Thread(
        target=_run_and_settle, args=(fn, loop, future), name=name, daemon=True
    ).start()
    return future


class DaemonWorker:
    """One daemon thread, started on the first call, that runs calls in order."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Run `fn()` in the worker thread; the future resolves on the calling loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
            self._thread.start()
        self._jobs.put((fn, loop, future))
        return future

    def stop(self) -> None:
        """The thread ends after the call it is in, if any (a stuck one is left behind)."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            _run_and_settle(*job)


class Timed(Generic[T]):
    """Runs `fn` and times it in the thread that runs it: the time a source's collect()
    takes in its worker, not the time the event loop took to notice (the same for every
    source). `seconds` is None until the call has ended."""

    def __init__(self, fn: Callable[[], T], clock: Callable[[], float]) -> None:
        self.fn = fn
        self.clock = clock
        self.seconds: float | None = None

    def __call__(self) -> T:
        started = self.clock()
        try:
            return self.fn()
        finally:
            self.seconds = self.clock() - started
