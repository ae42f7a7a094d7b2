"""A source's calls run in one long-lived daemon thread (threads.DaemonWorker)."""

from __future__ import annotations

import threading

import pytest

from exporter.runtime.threads import DaemonWorker


async def test_calls_run_in_order_in_one_daemon_thread() -> None:
    worker = DaemonWorker("collect-test")
    seen = [await worker.submit(threading.current_thread) for _ in range(3)]
    assert len(set(seen)) == 1  # no thread started per call
    (thread,) = set(seen)
    assert thread.daemon and thread.name == "collect-test"
    assert thread is not threading.current_thread()

    def fail() -> None:
        raise OSError("driver says no")

    with pytest.raises(OSError, match="driver says no"):
        await worker.submit(fail)
    assert await worker.submit(lambda: 42) == 42  # an error does not end the worker
    worker.stop()
    thread.join(timeout=5)
    assert not thread.is_alive()
    # A worker stopped is started again by the next call.
    again = await worker.submit(threading.current_thread)
    assert again is not thread and again.is_alive()
    worker.stop()


async def test_a_stuck_call_strands_only_itself() -> None:
    release = threading.Event()
    worker = DaemonWorker("collect-stuck")
    stuck = worker.submit(lambda: release.wait(30))
    worker.stop()  # what the poller does on close: the stuck call is left behind
    other = DaemonWorker("collect-other")
    assert await other.submit(lambda: "fine") == "fine"
    assert not stuck.done()
    release.set()
    assert await stuck is True
    other.stop()
