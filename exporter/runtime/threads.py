"""Blocking calls that may never return (a hung driver) run in daemon threads.

`asyncio.to_thread` uses the loop's default executor, whose threads interpreter exit
joins: one driver call hung for minutes then holds SIGTERM for minutes. A daemon thread
does not hold the process; its result is handed back to the loop if the loop still runs.

A source is called every cycle, so it gets a `DaemonWorker`: one daemon thread that lives
as long as the source and runs its calls one at a time (starting a thread per call cost
more CPU per cycle than a small source's whole collect). The poller never queues a call
behind a stuck one (it skips a source whose last call is still running), so a worker
stuck in a driver call strands nothing but that call.

Every thread here carries its name into the kernel too (`/proc/PID/task/TID/comm`), so
`top -H`, `ps -L` and the benchmark's per-thread table (`python -m bench threads`) say
which part of the exporter a thread's CPU belongs to.
"""

from __future__ import annotations

import asyncio
import ctypes
import queue
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_PR_SET_NAME = 15
"""prctl(2): set the calling thread's name (16 bytes with the NUL)."""


def _prctl() -> Any:
    if sys.platform != "linux":
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()


class Thread(threading.Thread):
    """A daemon thread whose name the kernel shows (cut to its 15 bytes)."""

    def __init__(self, target: Callable[..., Any], name: str, args: tuple[Any, ...] = ()) -> None:
        super().__init__(target=target, args=args, name=name, daemon=True)

    def run(self) -> None:
        if _PRCTL is not None:
            _PRCTL(_PR_SET_NAME, self.name.encode()[:15], 0, 0, 0)
        super().run()


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
    Thread(_run_and_settle, name, (fn, loop, future)).start()
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
            self._thread = Thread(self._serve, self.name)
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


class Stuck(TimeoutError):
    """The worker's last call has not returned: the new one was not queued behind it."""


class BoundedWorker:
    """One daemon thread whose calls each have a deadline, for a step with no worker of its
    own (the publish step, the attribution's host reads). A call that overruns stays in the
    thread; the caller gets `TimeoutError`, and `Stuck` at once for every call until that one
    returns: nothing piles up behind a read that never comes back. The thread ends after
    `idle_exit` seconds without a call (a new one starts with the next)."""

    def __init__(self, name: str, idle_exit: float = 60.0) -> None:
        self.name = name
        self.idle_exit = idle_exit
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread = False
        self._running: Future[Any] | None = None

    def start(self, fn: Callable[[], T]) -> Future[T]:
        """`fn()` in the worker thread; `Stuck` when the last call is still in it."""
        if self._running is not None and not self._running.done():
            raise Stuck(f"{self.name}: the last call has not returned")
        future: Future[T] = Future()
        self._running = future
        with self._lock:
            self._jobs.put((fn, future))
            if not self._thread:
                self._thread = True
                Thread(self._serve, self.name).start()
        return future

    def call(self, fn: Callable[[], T], timeout: float) -> T:
        """From a thread: `fn()`'s result within `timeout` seconds, or TimeoutError."""
        return self.start(fn).result(timeout)  # concurrent.futures' TimeoutError is the builtin

    async def run(self, fn: Callable[[], T], timeout: float) -> T:
        """From the event loop: the same, awaited (the loop keeps serving meanwhile)."""
        return await asyncio.wait_for(asyncio.wrap_future(self.start(fn)), timeout)

    def _serve(self) -> None:
        while True:
            try:
                fn, future = self._jobs.get(timeout=self.idle_exit)
            except queue.Empty:
                with self._lock:
                    if self._jobs.empty():
                        self._thread = False
                        return
                continue
            if not future.set_running_or_notify_cancel():
                continue  # given up on before it started
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
                future.set_exception(exc)


class DaemonExecutor(ThreadPoolExecutor):
    """The event loop's default executor (`asyncio.to_thread`), on daemon threads.

    `asyncio.run` ends by waiting for the default executor's threads (for ever on 3.11), and
    interpreter exit joins every ThreadPoolExecutor thread: one call stuck in a host read
    would hold SIGTERM past any grace period. These threads are daemons, registered nowhere,
    and `shutdown` never waits for a call in progress; idle threads are reused, as in
    ThreadPoolExecutor, up to `max_workers` (more calls queue). A ThreadPoolExecutor only
    because the loop accepts nothing else: `submit` and `shutdown` are its own."""

    def __init__(self, max_workers: int = 8, name: str = "executor") -> None:
        super().__init__(max_workers=1)  # its state stays unused: no thread is started
        self.max_workers = max_workers
        self.name = name
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue()
        )
        self._idle = threading.Semaphore(0)
        self._started = 0
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        self._jobs.put((future, lambda: fn(*args, **kwargs)))
        if not self._idle.acquire(blocking=False):
            with self._lock:
                if self._started < self.max_workers:
                    self._started += 1
                    name = f"{self.name}-{self._started}"
                    Thread(self._serve, name).start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Idle threads end; a thread in a call is left to it (never waited for)."""
        with self._lock:
            for _ in range(self._started):
                self._jobs.put(None)
            self._started = 0

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, fn = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - handed to the awaiting caller
                    future.set_exception(exc)
            self._idle.release()


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
