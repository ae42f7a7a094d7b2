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

A kubelet that restarted is asked in the cycle that sees its new socket (the file's
identity changed: the settle logic's own test), which is the strongest sign that its answer
changed: a pod added while it was down is labelled from that cycle or the next one, not
`--kubernetes.poll-interval` later.

Where a pod feed runs (`--kubernetes.api`: the kubelet's Pods API, or the API server's pod
watch), a pod that starts, changes or leaves asks the kubelet too, between cycles: at most
every `SOONEST` seconds, after `DEBOUNCE` seconds in which the burst of events a new pod
makes (added, then its containers created and started) arrives; and when the answer
differs from the last, the poller runs the cycle then rather than at its next tick
(`news()`). A pod that holds a device but runs nothing on it is labelled a few seconds after
it starts, not up to 30 s later; a deleted pod leaves as soon as the kubelet drops it.
The poll a change asks for `SOONEST` seconds after the first is made between cycles too, at
its time, so that a longer `--collect-interval` does not delay it.

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
from collections.abc import Awaitable, Callable, Hashable
from typing import Protocol

from exporter.model import PodResourcesState
from exporter.podresources.client import PodResourcesClient, PodResourcesError
from exporter.runtime.log import StateLog

log = logging.getLogger("exporter.poller")

SOONEST = 5.0
"""Seconds from a poll a change asked for to the next one (a change in the devices, a pod
event, a new socket)."""
EARLY = 0.05
"""How much sooner than `SOONEST` a cycle may make that poll: a cycle's start is read a
little before the last poll's, and must not skip a poll for milliseconds."""
DEBOUNCE = 0.5
"""Seconds without a pod event before the poll the events ask for. A pod's events come in a
burst, and one poll after it sees the pod whole: on the real 1.36 kubelet a new pod's
ADDED, MODIFIED, MODIFIED came within 0.3 s (List had its device 0.01 s after ADDED), a
restarted kubelet's replay within 0.2 s, a deleted pod's last two 0.75 s apart (List had
dropped it at the first of them): docs/podresources.md."""
_UNSEEN = object()


class PodChanges(Protocol):
    """A feed of this node's pods (kubeapi/watcher.py's PodWatcher): how many pod events it
    has applied and when the last one was (monotonic seconds), and a wait for the next."""

    changes: int
    changed_at: float

    async def wait_change(self, seen: int) -> None:
        """Return once `changes` is no longer `seen`."""
        ...


class KubeletSchedule:
    """The kubelet side of the poller's cycle: one poll task at a time, run when due."""

    def __init__(
        self,
        client: PodResourcesClient | None,
        *,
        every: int,
        soonest: float = SOONEST,
        stale_after: float,
        pods: PodChanges | None = None,
        debounce: float = DEBOUNCE,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """`every`: cycles from one poll to the next while nothing changes (1: every
        cycle, counted in cycles so that a cycle started a little early is not skipped);
        `soonest`: seconds from a poll a change asked for to the next such poll; `pods`:
        the pod feed whose events ask for a poll (`debounce` seconds after one)."""
        self.client = client
        self.every = max(1, every)
        self.soonest = soonest
        self.stale_after = stale_after
        self.pods = pods
        self.debounce = debounce
        self._clock = clock
        self._sleep = sleep
        self._states = StateLog(log)
        self._task: asyncio.Future[PodResourcesState | None] | None = None
        self._state: PodResourcesState | None = None
        self._state_at = 0.0
        self._due_in = 0
        """Cycles until the next poll is due (0 or less: this cycle)."""
        self._soon_at = float("-inf")
        """When a poll a change asks for may start (`soonest` after the last such poll:
        the schedule's own polls do not delay one)."""
        self._asked = 0
        """Polls a change still asks for: the one at the change, and one to settle."""
        self._seen: Hashable = _UNSEEN
        self._pods_seen = pods.changes if pods is not None else 0
        self._pods_noticed: float | None = None
        """When the schedule first saw pod events it has not answered yet."""
        self.why: dict[str, int] = {}
        """What asked for each poll a change made (`devices`, `socket`, `pods`), counted."""
        self._begun_this_cycle = False
        self._why = "devices"
        self.polls = 0
        """Polls started so far."""

    def start(self) -> asyncio.Future[PodResourcesState | None]:
        """This cycle's poll when one is due; else the last one (done, or still in flight).
        Due: by the interval, for a change (at most every `soonest` seconds), or at once
        when the kubelet's socket is a new one."""
        self._begun_this_cycle = False
        task = self._task
        self._due_in -= 1
        restarted = task is not None and task.done() and self._socket_changed()
        self._pods_changed()
        due = self._due_in <= 0 or restarted or (self._asked > 0 and self._may_change())
        if task is None or (task.done() and due):
            task = self._begin()
        return task

    def _socket_changed(self) -> bool:
        """Whether the kubelet's socket is not the one the last poll found (a kubelet
        restarted since): a change that asks for a poll now and one to settle."""
        if self.client is None or not self.client.socket_changed():
            return False
        self._ask("socket")
        return True

    def _pods_changed(self) -> bool:
        """Whether the pod feed applied events since the last look and none in the last
        `debounce` seconds (the burst a new pod makes is over; a feed that never goes quiet
        is answered `soonest` seconds after it was first seen busy): a change."""
        pods = self.pods
        if pods is None or pods.changes == self._pods_seen:
            return False
        now = self._clock()
        if self._pods_noticed is None:
            self._pods_noticed = now
        quiet = now >= pods.changed_at + self.debounce - EARLY
        if not quiet and now < self._pods_noticed + self.soonest - EARLY:
            return False
        self._pods_seen, self._pods_noticed = pods.changes, None
        self._ask("pods")
        return True

    def _quiet_at(self, pods: PodChanges) -> float:
        """When `_pods_changed` will take the events seen so far."""
        noticed = self._clock() if self._pods_noticed is None else self._pods_noticed
        return min(pods.changed_at + self.debounce, noticed + self.soonest)

    def _ask(self, why: str) -> None:
        self._asked = 2
        self._why = why

    def _may_change(self) -> bool:
        return self._clock() >= self._soon_at - EARLY

    async def news(self) -> None:
        """Return when the next cycle should not wait for its tick: a poll made between
        cycles, for a pod event (`debounce` seconds after it) or for the poll that settles
        a change (at its time), answered differently from the last poll. Called while the
        poller waits between cycles, and cancelled when the next cycle is due."""
        while True:
            if self._asked == 0:
                pods = self.pods
                if pods is None:
                    await asyncio.Future()  # no pod feed: only the cycles ask
                    continue
                await pods.wait_change(self._pods_seen)
                if self._pods_noticed is None:
                    self._pods_noticed = self._clock()
                await self._sleep(max(0.0, self._quiet_at(pods) - self._clock()))
                if not self._pods_changed():
                    continue  # more events came meanwhile: wait for the quiet
            wait = self._soon_at - self._clock()
            if wait > 0:
                await self._sleep(wait)
            if self._task is not None and not self._task.done():
                await asyncio.shield(self._task)
            self._pods_changed()  # events during the wait: this poll answers them too
            before = self._state
            after = await asyncio.shield(self._begin())
            if after is not None and (
                before is None
                or (after.pods, after.allocatable) != (before.pods, before.allocatable)
            ):
                return

    def devices_seen(self, seen: Hashable) -> asyncio.Future[PodResourcesState | None] | None:
        """What the sources saw this cycle (their devices, their state, each device's
        processes), after they collected. When it differs from the last cycle's, a new
        poll, GetAllocatableResources included: now, if no change asked for one in the last
        `soonest` seconds (the cycle then waits for it, as for one started with the cycle),
        else as soon as one may; and one more `soonest` seconds later. None when the
        cycle's poll stays the one `start()` gave."""
        if seen == self._seen:
            return None
        first, self._seen = self._seen is _UNSEEN, seen
        if first:
            return None  # the first cycle asks the kubelet anyway
        if self._begun_this_cycle:
            self._asked = max(self._asked, 1)  # asked at the cycle's start: one to settle
            return None
        self._ask("devices")
        if self._task is not None and not self._task.done():
            return None  # an earlier poll is still out (a slow kubelet): the next, then
        if self._may_change():
            return self._begin()
        return None

    def _begin(self) -> asyncio.Future[PodResourcesState | None]:
        self._due_in = self.every
        changed = self._asked > 0  # this poll answers a change
        if changed:
            self._asked -= 1
            self._soon_at = self._clock() + self.soonest
            self.why[self._why] = self.why.get(self._why, 0) + 1
        self._begun_this_cycle = True
        self.polls += 1
        # A device or a new kubelet makes a plugin's verdict news; a pod event does not.
        fresh = changed and self._why != "pods"
        self._task = asyncio.ensure_future(self._poll(fresh_allocatable=fresh))
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
        if self.client.health().held or self.client.restarting():
            # After a kubelet restart its answers fill in (the client holds the last good
            # ones in place of empty ones): ask every cycle while the restart window lasts
            # and until the plugins are back (docs/podresources.md).
            self._due_in = 0
        self._states.ok_all("kubelet/", f"PodResources {state.api_version} answering")
        self._state, self._state_at = state, self._clock()
        return state
