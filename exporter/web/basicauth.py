"""`Authorization: Basic` checked against bcrypt hashes, so that a password flood cannot starve
the real scraper nor tell which user names exist.

bcrypt costs tens of milliseconds by design, four times more per cost step
(docs/design-figures.md), and before it runs a right password and a guess look alike. So
credentials are told apart by what a guesser cannot do cheaply: come back with the same
password.

- **Every checked credential is remembered by a keyed hash** (HMAC-SHA256 of user, bcrypt
  hash and password under a key made at start, so the memory holds nothing a guesser could
  crack offline): a success (256 kept) is answered at once from then on, for the process's
  life and across reloads that keep its hash, and no number of wrong guesses can evict it;
  a failure (4,096 kept) is answered 401 at once, so repeating a wrong guess costs nothing.
- **A credential presented again goes before new ones**: the keyed hashes of credentials
  presented in the last one to two minutes are kept in a Bloom filter of two 2 MiB halves
  (the older half dropped each minute: bounded whatever arrives; at 6,000 new guesses a
  second about 1 in 10,000 is mistaken for a repeat). A scraper's second scrape is such a
  repeat; a guesser's new passwords never are. bcrypt runs one check at a time, in a daemon
  thread, taking waiters in three lanes, each FIFO with at most `MAX_WAITING` waiting: a
  client address that passed before (its password was rotated), a repeated credential, a new
  one. A check that would wait beyond its lane's bound is refused (429) without bcrypt.
- **Failures are limited per client address and lane**: one check in flight, and failures
  from a token bucket (`FAILURE_BURST`, then one per `FAILURE_REFILL_SECONDS`) for new
  credentials and another for repeated ones, so guessers behind a scraper's own address
  (one NAT) spend the first and leave the scraper's repeats their own.
- **Unknown users cost what a known one costs**: they are checked against a dummy hash made
  at the highest cost among the configured users (a cost-10 dummy against cost-12 users
  answered unknown names in a quarter of the time: a user-name oracle).

So a scraper with the right password gets through on its first scrape when the new lane has
room, else on its second: within two scrapes, whatever number of addresses guess. The limit
(docs/security.md): a guesser who knows this, presents each guess twice and fills the repeat
lane from many addresses can delay a scraper's first check, never one that passed.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from enum import Enum

import bcrypt

from exporter.runtime.threads import DaemonWorker

MAX_WAITING = 4
"""bcrypt checks that may wait in each lane for the one running."""
FAILURE_BURST = 3
FAILURE_REFILL_SECONDS = 2.0
SUCCESS_CACHE = 256
FAILURE_CACHE = 4096
CLIENTS = 4096
"""Peers whose failure budget is remembered; the least recently seen is forgotten first."""
SEEN_BITS = 1 << 24
"""Bits of each half of the Bloom filter of presented credentials (2 MiB)."""
SEEN_SECONDS = 60.0
"""How long a half takes new credentials before it becomes the older one."""

PASSED, REPEATED, NEW = 0, 1, 2
"""The lanes, in the order bcrypt takes them."""


class Verdict(Enum):
    OK = "ok"
    DENIED = "denied"
    RATE_LIMITED = "rate_limited"


class _Client:
    __slots__ = ("at", "busy", "passed", "tokens")

    def __init__(self, now: float) -> None:
        self.busy = [False, False, False]
        self.passed = False
        self.tokens = [float(FAILURE_BURST)] * 3
        self.at = now

    def refill(self, now: float) -> None:
        grown = (now - self.at) / FAILURE_REFILL_SECONDS
        self.tokens = [min(FAILURE_BURST, t + grown) for t in self.tokens]
        self.at = now


class _Seen:
    """Keyed hashes presented in the last `period` to twice that, in two Bloom filters."""

    def __init__(self, clock: Callable[[], float], period: float = SEEN_SECONDS) -> None:
        self._clock = clock
        self._period = period
        self._halves = [bytearray(SEEN_BITS // 8), bytearray(SEEN_BITS // 8)]
        self._since = clock()

    def add(self, key: bytes) -> bool:
        """Note `key`; whether it was noted before (in either half)."""
        now = self._clock()
        if now - self._since >= self._period:
            self._halves = [bytearray(SEEN_BITS // 8), self._halves[0]]
            self._since = now
        bits = [int.from_bytes(key[i : i + 4], "little") % SEEN_BITS for i in range(0, 16, 4)]
        seen = any(all(half[b >> 3] >> (b & 7) & 1 for b in bits) for half in self._halves)
        current = self._halves[0]
        for b in bits:
            current[b >> 3] |= 1 << (b & 7)
        return seen


class BasicAuth:
    """Checks credentials for one server; `check` is called per request on the event loop."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._secret = secrets.token_bytes(32)
        self._passed: OrderedDict[bytes, None] = OrderedDict()
        self._failed: OrderedDict[bytes, None] = OrderedDict()
        self._seen = _Seen(clock)
        self._clients: OrderedDict[str, _Client] = OrderedDict()
        self._worker = DaemonWorker("bcrypt")
        self._running = False
        self._waiting: tuple[deque[asyncio.Future[None]], ...] = (deque(), deque(), deque())
        self._dummies: dict[bytes, bytes] = {}
        self.checks = 0
        """bcrypt checks run (for tests and the bench: the work a flood caused)."""

    async def check(self, users: Mapping[str, bytes], header: str, peer: str) -> Verdict:
        credentials = _decode_basic(header)
        if credentials is None:
            return Verdict.DENIED
        user, password = credentials
        hashed = users.get(user)
        key = self._key(user, hashed, password)
        if hashed is not None and key in self._passed:
            self._passed.move_to_end(key)
            if peer in self._clients:  # a scraper stays remembered (first in line) however
                self._clients.move_to_end(peer)  # many addresses guess meanwhile
            return Verdict.OK
        if key in self._failed:
            self._failed.move_to_end(key)
            return Verdict.DENIED
        repeated = self._seen.add(key)
        client = self._client(peer)
        lane = PASSED if client.passed else REPEATED if repeated else NEW
        if client.busy[lane] or client.tokens[lane] < 1.0:
            return Verdict.RATE_LIMITED
        client.busy[lane] = True
        try:
            if not await self._turn(lane):
                return Verdict.RATE_LIMITED
            try:
                ok = False  # failed while this one waited: no bcrypt for it again
                if key not in self._failed:
                    target = hashed or self._dummy(users)
                    ok = await self._worker.submit(lambda: _checkpw(password, target))
                    self.checks += 1
            finally:
                self._release()
        finally:
            client.busy[lane] = False
        if ok and hashed is not None:
            client.passed = True
            _remember(self._passed, key, SUCCESS_CACHE)
            return Verdict.OK
        _remember(self._failed, key, FAILURE_CACHE)
        client.refill(self._clock())
        client.tokens[lane] -= 1.0
        return Verdict.DENIED

    def _key(self, user: str, hashed: bytes | None, password: bytes) -> bytes:
        message = b"\0".join((user.encode(), hashed or b"", password))
        return hmac.new(self._secret, message, hashlib.sha256).digest()

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

    async def _turn(self, lane: int) -> bool:
        """Wait for the bcrypt thread in `lane`: False (refused) when that lane is full."""
        if not self._running:
            self._running = True
            return True
        waiting = self._waiting[lane]
        if len(waiting) >= MAX_WAITING:
            return False
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release()  # handed the turn, then cancelled: pass it on
            else:
                waiting.remove(future)
            raise
        return True

    def _release(self) -> None:
        for waiting in self._waiting:
            while waiting:
                future = waiting.popleft()
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


def _remember(cache: OrderedDict[bytes, None], key: bytes, size: int) -> None:
    cache[key] = None
    cache.move_to_end(key)
    if len(cache) > size:
        cache.popitem(last=False)


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
