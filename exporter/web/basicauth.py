"""`Authorization: Basic` checked against bcrypt hashes, so that a password flood cannot starve
the real scraper nor tell which user names exist.

bcrypt costs tens of milliseconds by design, four times more per cost step
(docs/design-figures.md), so:

- **Only successes are cached** (by a SHA-256 of user, hash and password): a scraper pays for
  bcrypt once, and no number of wrong guesses can evict its entry (a cache of every result,
  oldest out first, let 128 guesses push it out and queue it behind the flood).
- **bcrypt work is bounded overall**: one check at a time, in a daemon thread, and at most
  `MAX_WAITING` waiting; a client that once passed goes before every other waiter (a
  scraper whose password was rotated is not queued behind the guessers). A check that
  would wait beyond the bound is refused without bcrypt.
- **and per client** (by peer address): one check in flight at a time, and failures from a
  token bucket (`FAILURE_BURST`, then one per `FAILURE_REFILL_SECONDS`). A refused check
  is answered 429 without running bcrypt and counted (`rate_limited`).
- **Unknown users cost what a known one costs**: they are checked against a dummy hash made
  at the highest cost among the configured users (a cost-10 dummy against cost-12 users
  answered unknown names in a quarter of the time: a user-name oracle).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from enum import Enum

import bcrypt

from exporter.runtime.threads import DaemonWorker

MAX_WAITING = 4
"""bcrypt checks that may wait for the one running (a few scrapers' first checks)."""
FAILURE_BURST = 3
FAILURE_REFILL_SECONDS = 2.0
SUCCESS_CACHE = 256
CLIENTS = 4096
"""Peers whose failure budget is remembered; the least recently seen is forgotten first."""


class Verdict(Enum):
    OK = "ok"
    DENIED = "denied"
    RATE_LIMITED = "rate_limited"


class _Client:
    __slots__ = ("at", "busy", "passed", "tokens")

    def __init__(self, now: float) -> None:
        self.busy = False
        self.passed = False
        self.tokens = float(FAILURE_BURST)
        self.at = now

    def refill(self, now: float) -> None:
        self.tokens = min(FAILURE_BURST, self.tokens + (now - self.at) / FAILURE_REFILL_SECONDS)
        self.at = now


class BasicAuth:
    """Checks credentials for one server; `check` is called per request on the event loop."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._passed: OrderedDict[bytes, None] = OrderedDict()
        self._clients: OrderedDict[str, _Client] = OrderedDict()
        self._worker = DaemonWorker("bcrypt")
        self._running = False
        self._waiting: deque[tuple[bool, asyncio.Future[None]]] = deque()
        self._dummies: dict[bytes, bytes] = {}
        self.checks = 0
        """bcrypt checks run (for tests and the bench: the work a flood caused)."""

    async def check(self, users: Mapping[str, bytes], header: str, peer: str) -> Verdict:
        credentials = _decode_basic(header)
        if credentials is None:
            return Verdict.DENIED
        user, password = credentials
        hashed = users.get(user)
        key = hashlib.sha256(b"\0".join((user.encode(), hashed or b"", password))).digest()
        if hashed is not None and key in self._passed:
            self._passed.move_to_end(key)
            if peer in self._clients:  # a scraper stays remembered (first in line) however
                self._clients.move_to_end(peer)  # many addresses guess meanwhile
            return Verdict.OK
        client = self._client(peer)
        if client.busy or client.tokens < 1.0:
            return Verdict.RATE_LIMITED
        client.busy = True
        try:
            if not await self._turn(client.passed):
                return Verdict.RATE_LIMITED
            try:
                target = hashed or self._dummy(users)
                ok = await self._worker.submit(lambda: _checkpw(password, target))
                self.checks += 1
            finally:
                self._release()
        finally:
            client.busy = False
        if ok and hashed is not None:
            client.passed = True
            self._passed[key] = None
            if len(self._passed) > SUCCESS_CACHE:
                self._passed.popitem(last=False)
            return Verdict.OK
        client.refill(self._clock())
        client.tokens -= 1.0
        return Verdict.DENIED

    def _client(self, peer: str) -> _Client:
        now = self._clock()
        client = self._clients.get(peer)
        if client is None:
            client = self._clients[peer] = _Client(now)
            if len(self._clients) > CLIENTS:
                self._clients.popitem(last=False)
        else:
            self._clients.move_to_end(peer)
            client.refill(now)
        return client

    async def _turn(self, trusted: bool) -> bool:
        """Wait for the bcrypt thread: False (refused) when too many already wait, unless
        the client passed before (it goes first)."""
        if not self._running:
            self._running = True
            return True
        if not trusted and len(self._waiting) >= MAX_WAITING:
            return False
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if trusted:
            self._waiting.appendleft((trusted, future))
        else:
            self._waiting.append((trusted, future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release()  # handed the turn, then cancelled: pass it on
            else:
                self._waiting.remove((trusted, future))
            raise
        return True

    def _release(self) -> None:
        while self._waiting:
            _, future = self._waiting.popleft()
            if not future.done():
                future.set_result(None)
                return
        self._running = False

    def _dummy(self, users: Mapping[str, bytes]) -> bytes:
        """A hash at the highest cost among `users` (`$2b$12$...`: cost 12)."""
        cost = max((h[4:6] for h in users.values()), default=b"10")
        dummy = self._dummies.get(cost)
        if dummy is None:
            rounds = int(cost) if cost.isdigit() else 10
            dummy = bcrypt.hashpw(b"not a password", bcrypt.gensalt(rounds=rounds))
            self._dummies[cost] = dummy
        return dummy


def _checkpw(password: bytes, hashed: bytes) -> bool:
    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:  # bcrypt 5 refuses passwords over 72 bytes: no hash can match them
        return False


def _decode_basic(header: str) -> tuple[str, bytes] | None:
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic" or not value:
        return None
    try:
        raw = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = raw.partition(b":")
    if not sep:
        return None
    try:
        return user.decode(), password
    except UnicodeDecodeError:
        return None
