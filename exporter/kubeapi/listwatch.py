"""One resumable list-watch (client-go's Reflector loop) for everything the exporter watches.

List, then watch from the list's version; a watch the peer ends resumes from the newest
version seen (an event's or a bookmark's) without a list; `410 Gone` (the version fell out
of the watch cache) lists again; any other failure backs off (1 s doubling to 60 s; 5
minutes after a failure only an operator fixes, such as 401/403), logged once per state
change, the cache kept meanwhile. A peer with no versions (the kubelet's Pods API) has no
resume: every reconnect lists again, by replaying.

What is listed and watched, how an event is decoded and applied, and what a failure means
belong to the watched thing (`Watched`: the API server's pods, kubeapi/watcher.py; the
kubelet's, kubeapi/podsapi.py; the ResourceSlices, dra/slicewatch.py). How long the loop
waits is `Timing`, defaults once. Every failure of a list or a watch is caught here, in one
place, and no exception ends the loop while the process runs: an answer the watched thing
cannot use (`answers.Unusable`: a shape the API does not have, bytes that do not decode, an
answer over a bound) is counted in `Sync.refused` and retried like an unavailable peer, and
anything else, a bug, is logged with its traceback once and retried the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Generic, Protocol, TypeVar

from exporter.kubeapi.answers import Unusable
from exporter.kubeapi.client import ApiError
from exporter.runtime.backoff import Backoff
from exporter.runtime.log import StateLog

log = logging.getLogger("exporter.kubeapi")

Event = TypeVar("Event")


@dataclass(frozen=True, slots=True)
class Timing:
    """How long the loop waits, and how randomly (client-go's reflector's numbers)."""

    watch_timeout: tuple[int, int] = (300, 600)
    """The `timeoutSeconds` a watch asks for: minWatchTimeout 5 min, times 1 to 2 at random."""
    watch_grace: float = 60.0
    """A watch the server did not end this long after its timeout is a dead connection."""
    short_watch: float = 1.0
    """A watch that ends sooner with no event is a failure (client-go's "very short watch"):
    a proxy cutting every watch at once must not turn into a loop of requests."""
    backoff: tuple[float, float] = (1.0, 60.0)
    """The first wait after a failure, doubling to the second."""
    denied_backoff: float = 300.0
    """The wait after a failure only an operator fixes (401/403, no configuration)."""
    stable: float = 120.0
    """A stream that stayed in sync this long before it ended starts the retry schedule over
    (client-go's reflector resets its back-off after 2 minutes without one); one that ends
    sooner, however often it synced, goes on with the schedule."""
    clock: Callable[[], float] = time.monotonic
    rng: random.Random = field(default_factory=random.Random)

    def jittered(self, seconds: float) -> float:
        """The agents of many nodes that failed together do not retry together."""
        return seconds * self.rng.uniform(0.8, 1.0)


class Wait(Enum):
    """What a failure waits for before the next attempt."""

    RETRY = auto()
    """The retry schedule's next wait."""
    DENIED = auto()
    """`denied_backoff` (the failure still counts in the retry schedule)."""
    RELIST = auto()
    """The version is gone: list again, at once after a success, on a schedule of its own
    when that 410s again (the pod watch, as client-go)."""
    RELIST_SOON = auto()
    """The version is gone: list again after a short random part of the retry schedule
    (the slice watch)."""


@dataclass(frozen=True, slots=True)
class Failure:
    """What the watched thing makes of an exception its list or watch raised."""

    key: str
    """The state's key in `Sync.states`, after its prefix: one log line per change."""
    line: str
    """What to log: a warning once per state; for a relist, an info line each time."""
    wait: Wait = Wait.RETRY
    restart: bool = False
    """The stream stayed in sync `Timing.stable` or longer before it ended: the retry
    schedule starts over (the Pods API)."""
    trace: BaseException | None = None
    """An error nobody expected: logged with its traceback (once per state)."""

    @property
    def relists(self) -> bool:
        return self.wait in (Wait.RELIST, Wait.RELIST_SOON)


class Sync:
    """Whether a watched thing is in sync with its peer, each change logged once."""

    def __init__(self, logger: logging.Logger, key: str) -> None:
        self.states = StateLog(logger)
        self.key = key
        """The prefix of this watch's keys in `states`."""
        self.up = False
        """The last list or watch worked."""
        self.synced = asyncio.Event()
        """Set at the first sync; never cleared."""
        self.refused: Counter[str] = Counter()
        """Answers dropped at the boundary, by `Unusable.reason`."""
        self._lingering = False
        """The last failure was an unusable answer or a bug: a list or an accepted watch
        makes the thing up again, but only an event used ends the failure said (a peer that
        lists well and breaks every watch is one warning, not two lines per attempt)."""

    def answering(self, again: str, first: Callable[[], str], *, event: bool = False) -> None:
        """In sync: say `again` after a failure (`event`: an event was used), `first()` at the
        first sync."""
        if self.up and not (event and self._lingering):
            return
        if event or not self._lingering:
            self.states.ok_all(self.key, again)
            self._lingering = False
        if not self.synced.is_set():
            self.states.logger.info("%s", first())
        self.up = True
        self.synced.set()

    def down(self, failure: Failure) -> None:
        """Out of sync: a warning once per state, or the relist said."""
        self.up = False
        if failure.relists:
            self.states.logger.info("%s", failure.line)
        else:
            self._lingering = failure.key.startswith(("unusable/", "error/"))
            self.states.failed(self.key + failure.key, failure.line, trace=failure.trace)


class Watched(Protocol[Event]):
    """One watched thing, as the loop drives it."""

    name: str
    """For the log: "the {name} watch ended..."."""
    sync: Sync
    failures: tuple[type[BaseException], ...]
    """What its list or watch raises when the peer is unavailable for now, for `failure` to
    say what it means; `Unusable` and anything else are the loop's to say."""
    bounded: bool
    """The peer ends each watch after the `timeoutSeconds` asked (the API server); False: a
    stream it never ends by itself (the kubelet's)."""

    async def list(self) -> str:
        """Replace the cache with what the peer holds; the version to watch from."""
        ...

    def watch(self, version: str, timeout: int) -> AsyncIterator[Event]:
        """One watch's events from `version`, decoded."""
        ...

    def apply(self, event: Event) -> str:
        """Apply one event to the cache; the version after it ("": the one before)."""
        ...

    def failure(self, exc: BaseException) -> Failure:
        """What `exc`, one of `failures`, means."""
        ...


class ShortWatch(Exception):
    """The server ended a watch at once, without an event."""


class ListWatch(Generic[Event]):
    """The loop of one watched thing."""

    def __init__(self, watched: Watched[Event], timing: Timing) -> None:
        self.watched = watched
        self.timing = timing

    async def run(self, stop: asyncio.Event) -> None:
        """List and watch until `stop` is set (a list or watch in flight then ends at once),
        whatever the peer answers."""
        looping = asyncio.ensure_future(self._loop(stop))
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait((looping, stopping), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not looping.done():
                looping.cancel()
                await asyncio.wait((looping,))  # its cleanup (a response closed) before ours
        if not looping.cancelled():
            looping.result()

    async def _loop(self, stop: asyncio.Event) -> None:
        version = ""
        retry = Backoff(*self.timing.backoff)
        relist = Backoff(*self.timing.backoff)  # a watch cache that cannot serve the list's
        gone = False  # a 410 since the last success: the next one waits
        while not stop.is_set():
            try:
                if not version:
                    version = await self.watched.list()
                version = await self._watch(version, stop)
                retry.success()
                relist.success()
                gone = False
                continue
            except ShortWatch as exc:
                log.debug("%s", exc)
                wait: float | None = self._delay(retry, denied=False)
            except Exception as exc:  # noqa: BLE001 - no answer and no bug ends the watch
                failure = self._failure(exc)
                self.watched.sync.down(failure)
                wait = self._wait(failure, retry, relist if gone else None)
                if failure.relists:
                    version, gone = "", True
                elif isinstance(exc, Unusable):
                    version = ""  # resumed, the watch would replay what broke: list again
            if wait is not None:
                await pause(stop, wait)

    def _failure(self, exc: Exception) -> Failure:
        """What `exc` means: the watched thing's word for its failures; an unusable answer
        or anything else (a bug), the loop's."""
        name = self.watched.name
        if isinstance(exc, Unusable):
            self.watched.sync.refused[exc.reason] += 1
            line = (
                f"{name} answer unusable ({exc}); keeping what was last read, asking again "
                "with back-off"
            )
            return Failure(f"unusable/{exc.reason}", line)
        if isinstance(exc, self.watched.failures):
            return self.watched.failure(exc)
        what = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        line = (
            f"the {name} watch failed unexpectedly ({type(exc).__name__}: {what}); keeping what "
            "was last read, asking again with back-off"
        )
        return Failure(f"error/{type(exc).__name__}", line, trace=exc)

    async def _watch(self, version: str, stop: asyncio.Event) -> str:
        """Apply events until the peer ends the watch; the version to resume from."""
        bounded = self.watched.bounded
        timeout = self.timing.rng.randint(*self.timing.watch_timeout) if bounded else 0
        started, events = self.timing.clock(), 0
        async with asyncio.timeout(timeout + self.timing.watch_grace if bounded else None):
            async for event in self.watched.watch(version, timeout):
                if stop.is_set():
                    break
                events += 1
                version = self.watched.apply(event) or version
        elapsed = self.timing.clock() - started
        if events == 0 and elapsed < self.timing.short_watch:
            name = self.watched.name
            raise ShortWatch(f"the {name} watch ended after {elapsed:.3f}s, no event")
        return version

    def _wait(self, failure: Failure, retry: Backoff, relist: Backoff | None) -> float | None:
        """The wait after `failure`; `relist`: the schedule of a 410 repeated since the
        last success (None: the first, which lists again at once)."""
        if failure.wait is Wait.RELIST:
            return None if relist is None else self.timing.jittered(relist.failure())
        if failure.wait is Wait.RELIST_SOON:
            return retry.failure() * self.timing.rng.uniform(0.0, 0.2)
        if failure.restart:
            retry.success()
        return self._delay(retry, failure.wait is Wait.DENIED)

    def _delay(self, retry: Backoff, denied: bool) -> float:
        """The next wait; a denied request still counts as a failure in the schedule."""
        wait = retry.failure()
        return self.timing.jittered(self.timing.denied_backoff if denied else wait)


def api_wait(
    exc: BaseException, *, gone: Wait, operator_only: tuple[type[BaseException], ...] = ()
) -> Wait:
    """The wait after an API server's failure: `gone` after its 410; long after 401/403
    and the exceptions in `operator_only`; else the retry schedule's."""
    if isinstance(exc, ApiError):
        if exc.code == 410:
            return gone
        denied = exc.code in (401, 403)
    else:
        denied = isinstance(exc, operator_only)
    return Wait.DENIED if denied else Wait.RETRY


def api_key(exc: BaseException) -> str:
    """An API server failure's state: its HTTP code, or the exception's name."""
    return str(exc.code) if isinstance(exc, ApiError) else type(exc).__name__


async def supervise(
    name: str,
    run: Callable[[asyncio.Event], Awaitable[None]],
    stop: asyncio.Event,
    timing: Timing | None = None,
) -> None:
    """`run(stop)` until `stop` is set, started again whenever it ends before: what keeps a
    watcher alive while the process runs should one of the loops above have a bug that lets
    an error through. Each end is logged once per state (with its traceback) and the next
    start waits the retry schedule, which starts over after a run of `timing.stable`."""
    timing = timing or Timing()
    retry = Backoff(*timing.backoff)
    states = StateLog(log)
    while not stop.is_set():
        started = timing.clock()
        trace: BaseException | None = None
        try:
            await run(stop)
        except Exception as exc:  # noqa: BLE001 - the one place a watcher's end is caught
            trace = exc
        if stop.is_set():
            return
        if timing.clock() - started >= timing.stable:
            retry.success()
        wait = timing.jittered(retry.failure())
        why = f"{type(trace).__name__}: {trace}" if trace is not None else "it returned"
        states.failed(
            "ended",
            f"{name} ended ({why.splitlines()[0][:200]}); started again in {wait:.0f}s",
            trace=trace,
        )
        await pause(stop, wait)


async def pause(stop: asyncio.Event, seconds: float) -> None:
    """Wait `seconds`, or less if `stop` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
