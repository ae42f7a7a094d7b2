"""This node's ResourceSlices, kept current by one list and a watch; DeviceTaintRules, listed.

Beside the pod watch (`--kubernetes.api`), the same Reflector loop (kubeapi/listwatch.py),
of which this watcher is the `Watched`: list
`/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName=<node>` page by page,
then watch from the list's resourceVersion with bookmarks; a watch the server ends resumes
from the newest version; `410 Gone` re-lists; other failures back off (1 s to 60 s, 5 min
after 401/403) and are logged once per state change, the cache kept meanwhile. Read only:
list and watch on `resourceslices` (and list on `devicetaintrules`), nothing else.

ResourceSlices are cluster-scoped; `spec.nodeName` is one of their selectable fields
(pkg/registry/resource/resourceslice/strategy.go `toSelectableFields`), so the server
sends this node's slices only. Slices of network-attached devices (`allNodes`,
`nodeSelector`) name no node and are never this node's to watch.

DeviceTaintRules are `resource.k8s.io/v1beta2` in 1.36 and not served by default
(control-plane.md, DRA item 8): they are listed every `rule_interval`; a 404 means the
cluster does not serve them and is asked again after 5 minutes, logged once.

Bounds and shapes (kubeapi/answers.py): at most `max_slices` slices (`--kubernetes.max-
resource-slices`) in a list or the cache; a watch event or a rule list of a shape the API
does not have is an unusable answer, the last good slices and rules kept. A slice whose
devices the parser does not understand is left out alone (a newer driver's), logged once.
Neither loop ends for an answer or a bug.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

from exporter.dra.slices import Slice, TaintRule, parse_slice, parse_taint_rule
from exporter.kubeapi.answers import SHAPE_ERRORS, Limits, Unusable, decoded, get, text
from exporter.kubeapi.client import UNAVAILABLE, ApiError, KubeApi, describe
from exporter.kubeapi.listwatch import (
    Failure,
    ListWatch,
    Sync,
    Timing,
    Wait,
    api_key,
    api_wait,
    pause,
)
from exporter.settings.config import DEFAULTS

log = logging.getLogger("exporter.kubeapi.slices")

SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
RULES_PATH = "/apis/resource.k8s.io/v1beta2/devicetaintrules"
RULE_INTERVAL_SECONDS = 60.0
RULES_ABSENT_SECONDS = 300.0

ObjectEvent = tuple[str, str, dict[str, Any]]
"""A watch event of a whole object: (type, resourceVersion, object)."""


class SliceWatcher:
    """This node's slices and the cluster's taint rules, as the poller reads them; the
    `Watched` of its own slice loop."""

    name = "ResourceSlice"
    bounded = True
    failures: tuple[type[BaseException], ...] = (ApiError, *UNAVAILABLE)

    def __init__(
        self,
        connect: Callable[[], KubeApi],
        node: str,
        *,
        timing: Timing | None = None,
        rule_interval: float = RULE_INTERVAL_SECONDS,
        rules_absent: float = RULES_ABSENT_SECONDS,
        max_slices: int = DEFAULTS.kubernetes_max_resource_slices,
    ) -> None:
        self._connect = connect
        self.node = node
        self.limits = Limits(objects=max_slices)
        """Slices a list or the cache may hold (--kubernetes.max-resource-slices)."""
        self.rules_refused: Counter[str] = Counter()
        """Taint rule answers dropped at the boundary, by `Unusable.reason`."""
        self.timing = timing or Timing()
        self.rule_interval = rule_interval
        self.rules_absent = rules_absent
        self.slices: dict[str, Slice] = {}
        self.rules: tuple[TaintRule, ...] = ()
        self.rules_served: bool | None = None
        """None until the first answer; False when the cluster does not serve the kind."""
        self.generation = 0
        """Moves on every change of `slices` or `rules` (the join's cache key)."""
        self.sync = Sync(log, "slices/")
        self._current: tuple[int, tuple[Slice, ...], tuple[TaintRule, ...]] = (0, (), ())
        self._loop: ListWatch[ObjectEvent] = ListWatch(self, self.timing)

    @property
    def up(self) -> bool:
        return self.sync.up

    def refused(self) -> dict[tuple[str, str, str], int]:
        """(peer, request, reason) -> answers dropped at the boundary."""
        out = {("kubernetes-api", "resourceslices", r): n for r, n in self.sync.refused.items()}
        return out | {("kubernetes-api", "devicetaintrules", r): n
                      for r, n in self.rules_refused.items()}  # fmt: skip

    @property
    def synced(self) -> asyncio.Event:
        return self.sync.synced

    def current(self) -> tuple[int, tuple[Slice, ...], tuple[TaintRule, ...]]:
        """What the cache holds now; no request. One immutable tuple, replaced on the event
        loop at each change, so the poller's worker thread reads it whole."""
        return self._current

    def _publish(self) -> None:
        self.generation += 1
        self._current = (self.generation, tuple(self.slices.values()), self.rules)

    async def run(self, stop: asyncio.Event) -> None:
        rules = asyncio.create_task(self._rules_forever(stop))
        try:
            await self._loop.run(stop)
        finally:
            rules.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await rules

    # --- slices: the loop's Watched ---------------------------------------------------

    async def list(self) -> str:
        items, version = await self._connect().list_objects(
            "resourceslices",
            SLICES_PATH,
            self._params(),
            self.limits,
            "--kubernetes.max-resource-slices",
        )
        slices = {}
        for obj in items:
            parsed = self._parse(obj)
            if parsed is not None:
                slices[parsed.name] = parsed
        self.slices = slices
        self._changed()
        return version

    def watch(self, version: str, timeout: int) -> AsyncIterator[ObjectEvent]:
        params = {**self._params(), "resourceVersion": version}
        return self._connect().watch_objects("resourceslices", SLICES_PATH, params, timeout,
                                             self._in_sync)  # fmt: skip

    def apply(self, event: ObjectEvent) -> str:
        kind, version, obj = event
        if kind == "BOOKMARK":
            self._in_sync(event=True)
            return version
        name = text(get(obj, "metadata", "name"), "a ResourceSlice's metadata.name", required=True)
        if kind == "DELETED":
            self.slices.pop(name, None)
        else:
            parsed = self._parse(obj)
            if parsed is None:
                return version
            if parsed.name not in self.slices:
                self.limits.count(len(self.slices) + 1, "ResourceSlices",
                                  "--kubernetes.max-resource-slices")  # fmt: skip
            self.slices[parsed.name] = parsed
        self._changed(event=True)
        return version

    def failure(self, exc: BaseException) -> Failure:
        wait = api_wait(exc, gone=Wait.RELIST_SOON)
        if wait is Wait.RELIST_SOON:
            return Failure("410", "ResourceSlice watch expired (410 Gone); listing again", wait)
        if isinstance(exc, ApiError):
            line = (
                f"cannot watch ResourceSlices ({exc})"
                + ("; check the ServiceAccount's RBAC (the dra component)" if wait is Wait.DENIED
                   else "")
                + "; DRA devices are joined by name only until it answers"
            )  # fmt: skip
        else:
            line = (
                f"ResourceSlices unavailable ({describe(exc)}); DRA devices are joined by "
                "name only until they are"
            )
        return Failure(api_key(exc), line, wait)

    def _params(self) -> dict[str, str]:
        return {"fieldSelector": f"spec.nodeName={self.node}"}

    def _parse(self, obj: dict[str, Any]) -> Slice | None:
        try:
            return parse_slice(obj)
        except SHAPE_ERRORS as exc:
            name = (obj.get("metadata") or {}).get("name", "?") if isinstance(
                obj.get("metadata"), dict) else "?"  # fmt: skip
            message = f"ResourceSlice {name} not understood: {exc!r}"
            self.sync.states.failed(f"parse/{name}", message)
            return None

    def _changed(self, *, event: bool = False) -> None:
        self._publish()
        self._in_sync(event=event)

    def _in_sync(self, *, event: bool = False) -> None:
        self.sync.answering(
            "ResourceSlices readable again",
            lambda: f"watching the {len(self.slices)} ResourceSlices of node {self.node}",
            event=event,
        )

    # --- taint rules ------------------------------------------------------------------

    async def _rules_forever(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                wait = await self._read_rules()
            except Exception as exc:  # noqa: BLE001 - no answer and no bug ends the rule reads
                self.sync.states.failed(
                    f"rules/error/{type(exc).__name__}",
                    f"reading DeviceTaintRules failed unexpectedly ({exc!r}); the last rules kept",
                    trace=exc,
                )
                wait = self.rule_interval
            await pause(stop, self.timing.jittered(wait))

    async def _read_rules(self) -> float:
        """List the rules once; the wait before the next list."""
        try:
            items, _ = await self._connect().list_objects("devicetaintrules", RULES_PATH, {})
            try:
                parsed = [parse_taint_rule(o) for o in items]
            except SHAPE_ERRORS as exc:
                raise decoded("a DeviceTaintRule", exc) from exc
        except ApiError as exc:
            return self._rules_refused(exc)
        except Unusable as exc:
            self.rules_refused[exc.reason] += 1
            self.sync.states.failed(
                f"rules/unusable/{exc.reason}",
                f"DeviceTaintRules answer unusable ({exc}); the last rules kept",
            )
            return self.rule_interval
        except UNAVAILABLE as exc:
            self.sync.states.failed(
                f"rules/{type(exc).__name__}", f"DeviceTaintRules unavailable ({describe(exc)})"
            )
            return self.rule_interval
        rules = tuple(sorted(parsed, key=lambda r: r.name))
        self.rules_served = True
        self.sync.states.ok_all("rules/", "DeviceTaintRules readable again")
        if rules != self.rules:
            self.rules = rules
            self._publish()
        return self.rule_interval

    def _rules_refused(self, exc: ApiError) -> float:
        """The wait after the API server refused the list: 404 is a cluster that does not
        serve the kind (its rules gone with it), else the last rules read are kept."""
        if exc.code != 404:
            self.sync.states.failed(f"rules/{exc.code}", f"cannot list DeviceTaintRules ({exc})")
            return self.timing.denied_backoff if exc.code in (401, 403) else self.rule_interval
        if self.rules_served is not False:
            log.info(
                "DeviceTaintRules are not served by this cluster (resource.k8s.io/"
                "v1beta2 off); only the slices' own taints are exported"
            )
        self.rules_served = False
        if self.rules:  # the kind was turned off: its rules are gone with it
            self.rules = ()
            self._publish()
        return self.rules_absent
