"""The ResourceClaims this node's containers hold, each read by name (`--kubernetes.dra`).

PodResources names every claim a container holds (namespace and name) and nothing else a
user asks about: a share's consumed capacity, admin access, the request each device serves,
the driver's device status (control-plane.md facts 12-15). Those are read here, one `get`
per claim PodResources lists, never a list or a watch:

- ResourceClaims have no field selector for a node (`spec.nodeName` is the pod's, and a
  claim may be shared by pods of several nodes), so a watch would carry every claim change
  of the cluster to every node: a cost per node that grows with the cluster. A `get` per
  claim costs what the node's own claims cost.
- RBAC: `get` on `resourceclaims`, nothing else (a ClusterRole: a node's claims live in any
  namespace; RBAC cannot narrow `get` to a node).
- When: at first sight; again after SETTLE (2 s, 10 s, 30 s: a driver writes the device
  status after prepare, DRANET when the pod's sandbox runs); then every REFRESH (5 min,
  jittered) for status changes; every 2 s while the claim is not allocated yet. An
  allocation never changes once made (the v1 API makes `status.allocation` immutable), so
  the refresh is only for `status.devices`. A claim PodResources stops listing is dropped.
  A 404 is a claim being deleted: dropped until it is listed again.
- Failures (403, 5xx, the API server away) keep every claim read so far, are logged once
  per state change and back off (1 s to 60 s; 5 min after 401/403), as the watches do
  (kubeapi/listwatch.py `Timing`); a claim that does not parse keeps its last good read.

Read by the poller through `current()` (no request, an immutable mapping replaced on the
event loop) and told what PodResources lists through `want()`, from the poller's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

from exporter.dra.claims import Claim, ClaimKey, parse_claim
from exporter.kubeapi.answers import SHAPE_ERRORS, Unusable
from exporter.kubeapi.client import UNAVAILABLE, ApiError, KubeApi, describe
from exporter.kubeapi.listwatch import Timing, pause
from exporter.runtime.backoff import Backoff
from exporter.runtime.log import StateLog

log = logging.getLogger("exporter.kubeapi.claims")


CLAIMS_PATH = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
SETTLE_SECONDS = (2.0, 10.0, 30.0)
REFRESH_SECONDS = 300.0
UNALLOCATED_SECONDS = 2.0
HOLD_SECONDS = 10.0
"""How long a claim first listed is held back from the join until its first read (so an
admin-access claim never shows as a holder for a cycle); past it, or while reads are
denied, it is joined as PodResources lists it."""
MAX_CLAIMS = 4096
"""Claims read per node at most; past it the rest are joined as PodResources lists them."""


class ClaimReader:
    """Reads the claims `want()` names; `current()` is what was last read of each."""

    def __init__(
        self,
        connect: Callable[[], KubeApi],
        *,
        timing: Timing | None = None,
        settle: tuple[float, ...] = SETTLE_SECONDS,
        refresh: float = REFRESH_SECONDS,
        hold: float = HOLD_SECONDS,
    ) -> None:
        self._connect = connect
        self.timing = timing or Timing()
        self.settle = settle
        self.refresh = refresh
        self.hold = hold
        self.states = StateLog(log)
        self.up = False
        """The last read worked."""
        self.denied = False
        """The last failure was 401/403: nothing is held back for reads that cannot come."""
        self.refused: Counter[str] = Counter()
        """Claim answers dropped at the decode boundary, by `Unusable.reason` (`decode` for
        a claim whose shape `parse_claim` cannot read)."""
        self._wanted: frozenset[ClaimKey] = frozenset()
        self._first_seen: dict[ClaimKey, float] = {}
        """When `want()` first named each claim (the poller's thread only)."""
        self._claims: dict[ClaimKey, Claim] = {}
        self._current: Mapping[ClaimKey, Claim] = MappingProxyType({})
        self._answered_keys: frozenset[ClaimKey] = frozenset()
        """The claims the API server has answered for (a 404 included)."""
        self._due: dict[ClaimKey, float] = {}
        self._reads: dict[ClaimKey, int] = {}
        self._bad: dict[ClaimKey, int] = {}
        """Answers refused in a row, per claim (its own back-off)."""
        self._retry = Backoff(*self.timing.backoff)
        self._resume = 0.0
        """No read before this (after a failure: its back-off, whatever wakes the reader)."""
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- the poller's side (its worker thread) ---------------------------------------

    def want(self, keys: Iterable[ClaimKey]) -> None:
        """The claims PodResources lists now; a change wakes the reader."""
        wanted = frozenset(sorted(keys)[:MAX_CLAIMS])
        now = self.timing.clock()
        for key in wanted - self._first_seen.keys():
            self._first_seen[key] = now
        for key in self._first_seen.keys() - wanted:
            del self._first_seen[key]
        if wanted == self._wanted:
            return
        self._wanted = wanted
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: shutting down
                loop.call_soon_threadsafe(wake.set)

    def current(self) -> Mapping[ClaimKey, Claim]:
        return self._current

    def pending(self, key: ClaimKey) -> bool:
        """Listed, not read yet, first listed less than `hold` ago, reads not denied."""
        first = self._first_seen.get(key)
        return (
            first is not None
            and key not in self._answered_keys
            and not self.denied
            and self.timing.clock() - first < self.hold
        )

    # --- the reader (the event loop) ---------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        while not stop.is_set():
            self._wake.clear()
            self._forget_unwanted()
            wait = await self._read_due(stop)
            if wait is None:
                continue
            waking = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait(
                    (waking, asyncio.ensure_future(pause(stop, wait))),
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                waking.cancel()

    def _forget_unwanted(self) -> None:
        wanted = self._wanted
        gone = [k for k in {*self._claims, *self._due} if k not in wanted]
        for key in gone:
            self._claims.pop(key, None)
            self._due.pop(key, None)
            self._reads.pop(key, None)
            self._bad.pop(key, None)
        if gone:
            self._publish()

    async def _read_due(self, stop: asyncio.Event) -> float | None:
        """Read every claim due; the seconds until the next is due (None: read again now)."""
        now = self.timing.clock()
        if now < self._resume:
            return self._resume - now
        for key in sorted(self._wanted):
            if stop.is_set():
                return None
            if self._due.get(key, 0.0) > now:
                continue
            failed = await self._read(key)
            if failed is not None:
                self._resume = self.timing.clock() + failed
                return failed
        upcoming = [self._due[k] for k in self._wanted if k in self._due]
        return max(0.05, min(upcoming) - self.timing.clock()) if upcoming else self.refresh

    async def _read(self, key: ClaimKey) -> float | None:
        """Read one claim; the back-off wait when the API server failed, else None."""
        namespace, name = key
        path = CLAIMS_PATH.format(namespace=namespace, name=name)
        try:
            obj = await self._connect().get_object("resourceclaims", path)
        except ApiError as exc:
            if exc.code == 404:
                self._answered(key, None)
                return None
            denied = exc.code in (401, 403)
            rbac = "; check the ServiceAccount's RBAC (the dra component)" if denied else ""
            return self._failed(
                f"claims/{exc.code}", f"cannot read ResourceClaims ({exc}){rbac}", denied
            )
        except UNAVAILABLE as exc:
            return self._failed(
                f"claims/{type(exc).__name__}", f"ResourceClaims unavailable ({describe(exc)})"
            )
        except Unusable as exc:
            self._refused(key, exc.reason, f"refused: {exc}")
            return None
        try:
            claim = parse_claim(obj)
        except SHAPE_ERRORS as exc:
            self._refused(key, "decode", f"not understood: {exc!r}")
            return None
        self.states.ok(f"claim/{namespace}/{name}", f"ResourceClaim {namespace}/{name} read")
        self._bad.pop(key, None)
        self._answered(key, claim)
        return None

    def _refused(self, key: ClaimKey, reason: str, why: str) -> None:
        """One claim's answer dropped at the boundary: counted, said once, its last read
        kept and asked again on its own back-off (the other claims' reads go on)."""
        namespace, name = key
        self.refused[reason] += 1
        line = f"ResourceClaim {namespace}/{name} {why}; its last read is kept"
        self.states.failed(f"claim/{namespace}/{name}", line)
        fails = self._bad.get(key, 0) + 1
        self._bad[key] = fails
        first, most = self.timing.backoff
        wait = self.timing.jittered(min(most, first * 2 ** min(fails - 1, 16)))
        self._due[key] = self.timing.clock() + wait

    def _answered(self, key: ClaimKey, claim: Claim | None) -> None:
        if not self.up:
            self.states.ok_all("claims/", "ResourceClaims readable again")
        self.up, self.denied = True, False
        self._retry.success()
        reads = self._reads.get(key, 0) + 1
        self._reads[key] = reads
        if claim is None:
            self._claims.pop(key, None)
            wait = self.refresh
        else:
            self._claims[key] = claim
            if not claim.allocated:
                wait = UNALLOCATED_SECONDS
            elif reads <= len(self.settle):
                wait = self.settle[reads - 1]
            else:
                wait = self.timing.jittered(self.refresh)
        self._due[key] = self.timing.clock() + wait
        self._publish()

    def _failed(self, state: str, line: str, denied: bool = False) -> float:
        self.up = False
        self.denied = denied
        self.states.failed(state, line + "; claims read so far are kept")
        wait = self._retry.failure()
        return self.timing.jittered(self.timing.denied_backoff if denied else wait)

    def _publish(self) -> None:
        self._current = MappingProxyType(dict(self._claims))
        self._answered_keys = frozenset(self._reads)
