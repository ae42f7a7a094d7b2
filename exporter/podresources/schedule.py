"""When the cycle asks the kubelet, and what it uses in between.

Pods change far more slowly than utilization, and each `List` wakes gRPC's threads (the
kubelet's part was 43 % of a dense 1 s cycle, docs/performance.md): the kubelet is asked
at most every `--kubernetes.poll-interval` (in whole cycles, rounded up), and a cycle in
between uses the last answer. A new or gone pod's labels then lag by up to that long.
A failed poll is retried the next cycle, as before, and so is a poll whose answer the
client holds back after a kubelet restart (the restart window, settle.py).

After each poll the channel is closed (the next poll opens a new one): an open grpc.aio
channel keeps gRPC's event-engine threads, its timer and its completion-queue poller
alive, and they wake 18 to 58 times a second with nothing to do; closed, gRPC stops them
all. Measured against the simulated kubelet (`python -m bench grpc-idle`, two processes
side by side): with a `List` every 1 s, 2.41 ms of CPU per call kept open against 2.48 ms
closed between, 58 context switches a second against 11; every 2 s, 3.21 against 2.72 ms
and 41 against 5; every 10 s, 6.77 against 3.04 ms and 18 against 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from exporter.log import StateLog
from exporter.model import PodResourcesState
from exporter.podresources.client import PodResourcesClient, PodResourcesError

log = logging.getLogger("exporter.poller")


class KubeletSchedule:
    """The kubelet side of the poller's cycle: one poll task at a time, run when due."""

    def __init__(
        self,
        client: PodResourcesClient | None,
        *,
        every: int,
        stale_after: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`every`: cycles from one poll to the next (1: every cycle). Counted in cycles,
        not seconds, so that a cycle started a little early (cycles drift) is not skipped."""
        self.client = client
        self.every = max(1, every)
        self.stale_after = stale_after
        self._clock = clock
        self._states = StateLog(log)
        self._task: asyncio.Future[PodResourcesState | None] | None = None
        self._state: PodResourcesState | None = None
        self._state_at = 0.0
        self._due_in = 0
        """Cycles until the next poll is due (0 or less: this cycle)."""
        self.polls = 0
        """Polls started so far."""

    def start(self) -> asyncio.Future[PodResourcesState | None]:
        """This cycle's poll when one is due; else the last one (done, or still in flight)."""
        task = self._task
        self._due_in -= 1
        if task is None or (task.done() and self._due_in <= 0):
            self._due_in = self.every
            self.polls += 1
            task = self._task = asyncio.ensure_future(self._poll())
        return task

    async def state(
        self, task: asyncio.Future[PodResourcesState | None], started: float, budget: float
    ) -> tuple[PodResourcesState | None, bool]:
        """The poll's answer if it comes within `budget` seconds of `started`; else the
        last good state, so a slow kubelet delays pod labels, never the device readings."""
        if task.done():
            return self._current_state() if task.cancelled() else task.result(), True
        try:
            state = await asyncio.wait_for(
                asyncio.shield(task), max(0.0, started + budget - self._clock())
            )
        except TimeoutError:
            self._states.failed("kubelet/SLOW", f"PodResources slower than {budget:g}s")
            return self._current_state(), False
        return state, True

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.client is not None:
            await self.client.close()

    def _current_state(self) -> PodResourcesState | None:
        if self._state is not None and self._clock() - self._state_at > self.stale_after:
            log.warning("dropping PodResources data older than %.0fs", self.stale_after)
            self._state = None
        return self._state

    async def _poll(self) -> PodResourcesState | None:
        if self.client is None:
            return None
        try:
            state = await self.client.poll()
        except PodResourcesError as exc:
            self._due_in = 0  # retried the next cycle
            if exc.code != "BACKOFF":
                self._states.failed(
                    f"kubelet/{exc.code}", f"PodResources unavailable ({exc}); retrying every cycle"
                )
            return self._current_state()
        finally:
            await self.client.close_channel()
        if self.client.health().held:
            # After a kubelet restart the client holds the last good answers in place of
            # empty ones: ask every cycle until the plugins are back (docs/podresources.md).
            self._due_in = 0
        self._states.ok_all("kubelet/", f"PodResources {state.api_version} answering")
        self._state, self._state_at = state, self._clock()
        return state
