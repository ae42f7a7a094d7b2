"""The poller: one pipeline run every `--collect-interval`, its snapshot swapped in whole.

Scrapes never come here: the sinks get the snapshot once per cycle (the pipeline's publish
stage). Collect runs on the event loop; every other step in one worker thread, so the event
loop keeps serving while a big node is worked through.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from asyncio import FIRST_COMPLETED
from collections.abc import Callable
from functools import partial
from typing import Any

from exporter.cycle.pipeline import Pipeline
from exporter.model import Snapshot
from exporter.runtime.log import StateLog
from exporter.runtime.threads import BoundedWorker
from exporter.settings.config import DEFAULTS

log = logging.getLogger("exporter.poller")


class Poller:
    def __init__(
        self,
        pipeline: Pipeline,
        *,
        interval: float = DEFAULTS.collect_interval,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pipeline = pipeline
        self.interval = interval
        self._clock = clock
        self._publisher = BoundedWorker("publish")
        self._cycles = 0
        self.snapshot: Snapshot | None = None
        self.ready = asyncio.Event()
        self.early = 0
        """Cycles run before their tick, for the kubelet's news."""
        self._states = StateLog(log)

    @property
    def restart_required(self) -> dict[str, str]:
        """source -> why only a new process can recover it (/healthz fails while set)."""
        return self.pipeline.collect.restart_required

    async def run_once(self) -> Snapshot:
        self._cycles += 1
        cycle = self.pipeline.new_cycle(self._cycles)
        await self.pipeline.run_collect(cycle)
        # A step stuck past this (a bug) fails the cycle; the worker stays with it.
        deadline = self.interval + self.pipeline.collect.source_timeout
        snapshot = await self._publisher.run(partial(self.pipeline.finish, cycle), deadline)
        self.snapshot = snapshot
        self.ready.set()
        return snapshot

    async def run_forever(self, stop: asyncio.Event) -> None:
        stopping = asyncio.ensure_future(stop.wait())  # one wait for the whole run
        try:
            while not stop.is_set():
                started = self._clock()
                try:
                    await self.run_once()
                except Exception:  # a bug in one cycle must not end the agent
                    log.exception("cycle failed")
                if self._cycles == 1:
                    # What lives after the first cycle (modules, sources, caches) lives for
                    # good: out of the collector's sight, later collections scan only what
                    # cycles make.
                    gc.collect()
                    gc.freeze()
                delay = max(0.0, self.interval - (self._clock() - started))
                await self._idle(stop, stopping, delay)
        finally:
            stopping.cancel()
            await asyncio.gather(stopping, return_exceptions=True)

    async def _idle(self, stop: asyncio.Event, stopping: asyncio.Future[Any], delay: float) -> None:
        """Until the next cycle: `delay` seconds, or less when the collect step has news (a
        pod event the kubelet answered: podresources/schedule.py), or until `stop`
        (`stopping`: the run's wait for it)."""
        until = self._clock() + delay
        news = asyncio.ensure_future(self.pipeline.collect.news())
        try:
            done, _ = await asyncio.wait(
                (stopping, news), timeout=delay, return_when=FIRST_COMPLETED
            )
        finally:
            news.cancel()
            await asyncio.gather(news, return_exceptions=True)
        if news in done and not news.cancelled() and news.exception() is not None:
            self._states.failed(
                "news", f"waiting for the kubelet's news failed: {news.exception()!r}"
            )
            with contextlib.suppress(TimeoutError):  # the cycle at its tick, as without news
                await asyncio.wait_for(stop.wait(), max(0.0, until - self._clock()))
        elif news in done:
            self.early += 1
            self._states.ok("news", "waiting for the kubelet's news works again")

    async def close(self, timeout: float = 3.0) -> dict[str, str]:
        """Close the sources and the kubelet channel; source -> why it did not close."""
        return await self.pipeline.collect.close(timeout)
