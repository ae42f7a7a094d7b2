"""The process: signals, and an exit that leaves threads stuck in calls behind."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading

log = logging.getLogger("exporter")


def install_signal_handlers(stop: asyncio.Event) -> None:
    """SIGINT and SIGTERM stop; SIGHUP reloads (`Exporter.reload`, installed once the
    exporter runs) and until then is logged and ignored: its default action ends the
    process, which an operator's `kill -HUP` never means."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    with contextlib.suppress(NotImplementedError):
        loop.add_signal_handler(
            signal.SIGHUP, lambda: log.info("SIGHUP while starting: nothing to reload yet")
        )


def exit_now_if_stuck(code: int) -> int:
    """Interpreter exit waits for non-daemon threads; a library's own thread stuck in a
    driver call would hold the process past its grace period. Leave without waiting."""
    stuck = [
        t.name for t in threading.enumerate() if not t.daemon and t is not threading.main_thread()
    ]
    if stuck:
        log.warning("leaving threads still in calls behind: %s", ", ".join(stuck))
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
