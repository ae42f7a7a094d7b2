"""client-go's Reflector loop, shared by the pod watch (watcher.py) and the slice watch.

List once, then watch from the list's resourceVersion with bookmarks, so a watch the server
ends (its `timeoutSeconds`, 5 to 10 minutes, randomized like client-go's) resumes from the
newest version without a list; `410 Gone` (the version fell out of the watch cache) lists
again; any other failure backs off (1 s doubling to 60 s; 5 minutes after a failure only an
operator fixes, such as 401/403) and the cache is kept meanwhile. A watch that ends at once
with no event backs off too. What is listed, how an event is applied and what is logged
belong to each watcher: it hands them in as callables.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Generic, TypeVar

from exporter.kubeapi.client import UNAVAILABLE, ApiError, KubeApi
from exporter.runtime.backoff import Backoff
from exporter.runtime.log import StateLog

log = logging.getLogger("exporter.kubeapi")

WATCH_TIMEOUT_SECONDS = (300, 600)
"""client-go's reflector: minWatchTimeout 5 min, times 1 to 2 at random."""
WATCH_GRACE_SECONDS = 60.0
"""A watch the server did not end this long after its timeout is a dead connection."""
BACKOFF_SECONDS = (1.0, 60.0)
DENIED_BACKOFF_SECONDS = 300.0
SHORT_WATCH_SECONDS = 1.0
"""A watch that ends sooner with no event is a failure (client-go's "very short watch"): a
proxy cutting every watch at once must not turn into a loop of requests."""

Event = TypeVar("Event")


class ShortWatch(Exception):
    """The server ended a watch at once, without an event."""


class ListWatch(Generic[Event]):
    """One list-then-watch loop. The callables are the watcher's own:

    - `list_into(api)` lists and replaces the cache; the list's resourceVersion;
    - `events(api, version, timeout)` one watch request's events;
    - `apply(event)` applies one event (bookmarks too); its resourceVersion, "" if none;
    - `gone(exc)` marks the watcher down and logs the 410;
    - `failed(exc, denied)` marks it down; the line to log, once per state change, under
      `key` + the code or the exception's name in `states`. Denied (the long `denied_backoff`
      wait): 401/403, and the exceptions in `operator_only`, that only an operator fixes.

    `relist_at_once`: the first 410 since a success lists again at once and repeated ones
    back off on their own schedule (the pod watch); otherwise every 410 waits a short random
    part of the retry schedule (the slice watch)."""

    def __init__(
        self,
        name: str,
        connect: Callable[[], KubeApi],
        *,
        list_into: Callable[[KubeApi], Awaitable[str]],
        events: Callable[[KubeApi, str, int], AsyncIterator[Event]],
        apply: Callable[[Event], str],
        gone: Callable[[ApiError], None],
        failed: Callable[[BaseException, bool], str],
        states: StateLog,
        key: str,
        relist_at_once: bool,
        operator_only: tuple[type[BaseException], ...] = (),
        watch_timeout: tuple[int, int] = WATCH_TIMEOUT_SECONDS,
        watch_grace: float = WATCH_GRACE_SECONDS,
        short_watch: float = SHORT_WATCH_SECONDS,
        backoff: tuple[float, float] = BACKOFF_SECONDS,
        denied_backoff: float = DENIED_BACKOFF_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.name = name
        self._connect = connect
        self._list_into = list_into
        self._events = events
        self._apply = apply
        self._gone = gone
        self._failed = failed
        self._states = states
        self.key = key
        self.relist_at_once = relist_at_once
        self.operator_only = operator_only
        self.watch_timeout = watch_timeout
        self.watch_grace = watch_grace
        self.short_watch = short_watch
        self.backoff = backoff
        self.denied_backoff = denied_backoff
        self._clock = clock
        self._rng = rng or random.Random()

    async def run(self, stop: asyncio.Event) -> None:
        """List and watch until `stop` is set; errors it does not retry end it."""
        version = ""
        retry = Backoff(*self.backoff)
        relist = Backoff(*self.backoff)  # a watch cache that cannot serve the list's version
        gone = False  # a 410 since the last success: the next one waits
        while not stop.is_set():
            try:
                api = self._connect()
                if not version:
                    version = await self._list_into(api)
                version = await self._watch(api, version, stop)
                retry.success()
                relist.success()
                gone = False
            except ApiError as exc:
                if exc.code != 410:
                    denied = exc.code in (401, 403)
                    self._states.failed(f"{self.key}{exc.code}", self._failed(exc, denied))
                    await pause(stop, self._delay(retry, denied))
                    continue
                self._gone(exc)
                version = ""
                if not self.relist_at_once:
                    await pause(stop, retry.failure() * self._rng.uniform(0.0, 0.2))
                elif gone:
                    await pause(stop, self.jittered(relist.failure()))
                gone = True
            except ShortWatch as exc:
                log.debug("%s", exc)
                await pause(stop, self._delay(retry, denied=False))
            except UNAVAILABLE as exc:
                denied = isinstance(exc, self.operator_only)
                self._states.failed(f"{self.key}{type(exc).__name__}", self._failed(exc, denied))
                await pause(stop, self._delay(retry, denied))

    async def _watch(self, api: KubeApi, version: str, stop: asyncio.Event) -> str:
        """Apply events until the server ends the watch; the version to resume from."""
        timeout = self._rng.randint(*self.watch_timeout)
        started, events = self._clock(), 0
        async with asyncio.timeout(timeout + self.watch_grace):
            async for event in self._events(api, version, timeout):
                if stop.is_set():
                    break
                events += 1
                version = self._apply(event) or version
        if events == 0 and self._clock() - started < self.short_watch:
            elapsed = self._clock() - started
            raise ShortWatch(f"the {self.name} watch ended after {elapsed:.3f}s, no event")
        return version

    def _delay(self, retry: Backoff, denied: bool) -> float:
        """The next wait; a denied request still counts as a failure in the schedule."""
        wait = retry.failure()
        return self.jittered(self.denied_backoff if denied else wait)

    def jittered(self, seconds: float) -> float:
        """The agents of many nodes that failed together do not retry together."""
        return seconds * self._rng.uniform(0.8, 1.0)


async def pause(stop: asyncio.Event, seconds: float) -> None:
    """Wait `seconds`, or less if `stop` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
