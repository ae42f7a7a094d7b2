"""When the cycle asks the kubelet, and what it uses in between.

Pods change far more slowly than utilization, and each poll starts and stops gRPC's
threads (what that costs: docs/design-figures.md). So the kubelet is asked when what the
sources see changes, and otherwise at most every `--kubernetes.poll-interval` (in whole
cycles, rounded up); a cycle in between uses the last answer.

What the sources see: the devices, their state and XIDs, and each device's processes.
A device that goes bad makes the kubelet be asked too: its device plugin's verdict
(GetAllocatableResources) usually follows from the same event (NVIDIA's marks a GPU
unhealthy on an XID). A workload that starts a process on a device makes the cycle that
first sees it ask the kubelet, within that cycle, so its utilization goes to the right
pod from the first cycle on (a fixed schedule gave the last holder the time up to its
next poll).
The kubelet is asked once more `SOONEST` seconds later, because what follows a change
settles after it (a deleted pod leaves `List` about 3 s after deletion, control-plane.md).
A poll the sources ask for comes at most every `SOONEST` seconds: processes that come and
go every cycle cost what the fixed 5 s schedule cost. What waits for the interval: a pod
that holds a device but runs nothing on it, and a plugin's verdict on a device whose
state the exporter sees unchanged.

A failed poll is retried the next cycle, and so is a poll whose answer the client holds
back after a kubelet restart (the restart window, settle.py).

After each poll the channel is closed (the next poll opens a new one): an open grpc.aio
channel keeps gRPC's event-engine threads, its timer and its completion-queue poller
alive, and they wake many times a second with nothing to do; closed, gRPC stops them all,
and reopening costs no more CPU than keeping it (`python -m bench grpc-idle`;
docs/performance.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Hashable

from exporter.model import PodResourcesState
from exporter.podresources.client import PodResourcesClient, PodResourcesError
from exporter.runtime.log import StateLog

log = logging.getLogger("exporter.poller")

SOONEST = 5.0
"""Seconds from a poll to the next one that a change in the devices asks for."""
_UNSEEN = object()


class KubeletSchedule:
    """The kubelet side of the poller's cycle: one poll task at a time, run when due."""

    def __init__(
        self,
        client: PodResourcesClient | None,
        *,
        every: int,
        soonest: int = 1,
        stale_after: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`every`: cycles from one poll to the next while nothing changes (1: every
        cycle); `soonest`: cycles from one poll to one a change asks for. Counted in
        cycles, not seconds, so that a cycle started a little early is not skipped."""
        self.client = client
        self.every = max(1, every)
        self.soonest = max(1, min(soonest, self.every))
        self.stale_after = stale_after
        self._clock = clock
        self._states = StateLog(log)
        self._task: asyncio.Future[PodResourcesState | None] | None = None
        self._state: PodResourcesState | None = None
        self._state_at = 0.0
        self._due_in = 0
        """Cycles until the next poll is due (0 or less: this cycle)."""
        self._soon_in = 0
        """Cycles until a poll a change asks for may start (counted from the last such poll:
        the schedule's own polls do not delay one)."""
        self._asked = 0
        """Polls a change still asks for: the one at the change, and one to settle."""
        self._seen: Hashable = _UNSEEN
        self._begun_this_cycle = False
        self.polls = 0
        """Polls started so far."""

    def start(self) -> asyncio.Future[PodResourcesState | None]:
        """This cycle's poll when one is due; else the last one (done, or still in flight)."""
        self._begun_this_cycle = False
        task = self._task
        self._due_in -= 1
        self._soon_in -= 1
        due = self._due_in <= 0 or (self._asked > 0 and self._soon_in <= 0)
        if task is None or (task.done() and due):
            task = self._begin()
        return task

    def devices_seen(self, seen: Hashable) -> asyncio.Future[PodResourcesState | None] | None:
        """What the sources saw this cycle (their devices, their state, each device's
        processes), after they collected. When it differs from the last cycle's, a new
        poll, GetAllocatableResources included: now, if no change asked for one in the last
        `soonest` cycles (the cycle then waits for it, as for one started with the cycle),
        else as soon as one may; and one more `soonest` cycles later. None when the
        cycle's poll stays the one `start()` gave."""
        if seen == self._seen:
            return None
        first, self._seen = self._seen is _UNSEEN, seen
        if first:
            return None  # the first cycle asks the kubelet anyway
        if self._begun_this_cycle:
            self._asked = 1  # asked at the cycle's start, with the change: one to settle
            return None
        self._asked = 2
        if self._task is not None and not self._task.done():
            return None  # an earlier poll is still out (a slow kubelet): the next, then
        if self._soon_in <= 0:
            return self._begin()
        return None

    def _begin(self) -> asyncio.Future[PodResourcesState | None]:
        self._due_in = self.every
        changed = self._asked > 0  # this poll answers a change
        if changed:
            self._asked -= 1
            self._soon_in = self.soonest
        self._begun_this_cycle = True
        self.polls += 1
        self._task = asyncio.ensure_future(self._poll(fresh_allocatable=changed))
        return self._task

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

    async def _poll(self, *, fresh_allocatable: bool = False) -> PodResourcesState | None:
        if self.client is None:
            return None
        try:
            state = await self.client.poll(fresh_allocatable=fresh_allocatable)
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
