"""The pods of this node, kept current by one list and a watch (`--kubernetes.api`).

A background task, never part of a cycle: the poller reads the latest cache with
`pod_infos()`, which makes no request. The protocol is client-go's Reflector:

- list once (`fieldSelector=spec.nodeName=<node>`), then watch from the list's
  resourceVersion with bookmarks, so a watch the server ends (its `timeoutSeconds`, 5 to 10
  minutes, randomized like client-go's) resumes from the newest version without a list;
- `410 Gone` (the version fell out of the watch cache) re-lists and replaces the cache;
- any other failure backs off (1 s doubling to 60 s; 5 minutes after 401/403, which only an
  operator fixes) and is logged once per state change; the cache is kept meanwhile and the
  exporter goes on exporting what PodResources gives.

That loop is listwatch.py's, shared with the slice watch; this module says what is listed,
how an event changes the cache and what is logged.

Owners: a pod's controller is in its own metadata; the workload above a ReplicaSet or Job
(Deployment, CronJob) needs that owner's metadata, read once per owner UID and re-read
after `owner_ttl` while a pod still refers to it. Steady state is one watch request per
watch timeout plus the owner re-reads: see docs/kubernetes-api.md for the measured numbers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass

import httpx2 as httpx

from exporter.kubeapi.client import (
    OWNER_RESOURCES,
    ApiError,
    KubeApi,
    NotConfigured,
    OwnerRef,
    PodMeta,
    WatchEvent,
    describe,
)
from exporter.kubeapi.listwatch import (
    BACKOFF_SECONDS,
    DENIED_BACKOFF_SECONDS,
    SHORT_WATCH_SECONDS,
    WATCH_GRACE_SECONDS,
    WATCH_TIMEOUT_SECONDS,
    ListWatch,
)
from exporter.kubeapi.workloads import LabelFilter, pod_info
from exporter.model import KubeApiHealth, PodInfo
from exporter.runtime.log import StateLog

log = logging.getLogger("exporter.kubeapi")

OWNER_TTL_SECONDS = 3600.0
OWNER_RETRY_SECONDS = 60.0


@dataclass(slots=True)
class _Owner:
    parent: OwnerRef | None
    expires: float


class PodWatcher:
    def __init__(
        self,
        connect: Callable[[], KubeApi],
        node: str,
        labels: LabelFilter | None = None,
        *,
        watch_timeout: tuple[int, int] = WATCH_TIMEOUT_SECONDS,
        watch_grace: float = WATCH_GRACE_SECONDS,
        short_watch: float = SHORT_WATCH_SECONDS,
        backoff: tuple[float, float] = BACKOFF_SECONDS,
        denied_backoff: float = DENIED_BACKOFF_SECONDS,
        owner_ttl: float = OWNER_TTL_SECONDS,
        owner_retry: float = OWNER_RETRY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self._connect = connect
        self.node = node
        self.labels = labels or LabelFilter()
        self.backoff = backoff
        self.owner_ttl = owner_ttl
        self.owner_retry = owner_retry
        self._clock = clock
        self._rng = rng or random.Random()
        self.api: KubeApi | None = None
        self.pods: dict[str, PodMeta] = {}
        """uid -> metadata of every pod on this node."""
        self.owners: dict[str, _Owner] = {}
        """owner uid (ReplicaSet, Job) -> its controller, as last read."""
        self._infos: dict[str, tuple[PodMeta, OwnerRef | None, PodInfo]] = {}
        self._owner_wanted = asyncio.Event()
        self._up = False
        self._states = StateLog(log)
        self.synced = asyncio.Event()
        """Set once the first list has answered."""
        self._loop = ListWatch(
            "pod", self._client, list_into=self._list, events=self._events, apply=self._apply,
            gone=self._watch_gone, failed=self._watch_failed, states=self._states, key="api/",
            relist_at_once=True, operator_only=(NotConfigured,),
            watch_timeout=watch_timeout, watch_grace=watch_grace, short_watch=short_watch,
            backoff=backoff, denied_backoff=denied_backoff, clock=clock, rng=self._rng,
        )  # fmt: skip

    # --- read by the poller (the event loop, no request) ---------------------------------

    def pod_infos(self, holders: Iterable[tuple[str, str]]) -> tuple[PodInfo, ...]:
        """Info of the pods in `holders` ((namespace, name)) that the cache knows."""
        wanted = set(holders)
        by_name: dict[tuple[str, str], PodInfo] = {}
        for uid, pod in list(self.pods.items()):  # a copy: callers may be off the loop
            if (pod.namespace, pod.name) in wanted and not self._owner_pending(pod):
                by_name[(pod.namespace, pod.name)] = self._info(uid, pod)
        return tuple(by_name[key] for key in sorted(by_name))

    def _owner_pending(self, pod: PodMeta) -> bool:
        """The pod's ReplicaSet or Job has not been read yet: its series waits for it (a few
        ms after the pod appears) rather than name the ReplicaSet as the workload for a cycle
        and then the Deployment (seen on a real API server: the first cycle after the list
        raced the owner read)."""
        return bool(pod.owner and pod.owner.kind in OWNER_RESOURCES
                    and pod.owner.uid not in self.owners)  # fmt: skip

    def health(self) -> KubeApiHealth:
        requests = dict(self.api.requests) if self.api is not None else {}
        return KubeApiHealth(self._up, len(self.pods), requests)

    def _info(self, uid: str, pod: PodMeta) -> PodInfo:
        owner = self.owners.get(pod.owner.uid) if pod.owner else None
        parent = owner.parent if owner else None
        cached = self._infos.get(uid)
        if cached is not None and cached[0] is pod and cached[1] == parent:
            return cached[2]
        info = pod_info(pod, parent, self.labels)
        self._infos[uid] = (pod, parent, info)
        return info

    # --- the background tasks ------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        owners = asyncio.create_task(self._resolve_owners(stop))
        try:
            await self._watch_forever(stop)
        finally:
            owners.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await owners
            if self.api is not None:
                await self.api.close()

    async def _watch_forever(self, stop: asyncio.Event) -> None:
        await self._loop.run(stop)

    def _client(self) -> KubeApi:
        """The one client, made at the first attempt (a retry after NotConfigured makes it)."""
        if self.api is None:
            self.api = self._connect()
        return self.api

    def _watch_gone(self, exc: ApiError) -> None:
        self._up = False
        log.info("pod watch expired (410 Gone: %s); listing again", exc)

    def _watch_failed(self, exc: BaseException, denied: bool) -> str:
        self._up = False
        if isinstance(exc, ApiError):
            rbac = "; check the ServiceAccount's RBAC" if denied else ""
            why = f"Kubernetes API answers {exc}{rbac}"
        else:
            why = f"Kubernetes API unavailable ({describe(exc)})"
        return (
            f"{why}; pod UIDs, owners and labels are missing until it answers, devices are "
            "exported as PodResources gives them"
        )

    def _jittered(self, seconds: float) -> float:
        return self._loop.jittered(seconds)

    async def _list(self, api: KubeApi) -> str:
        pods, version = await api.list_pods(self.node)
        self.pods = {pod.uid: pod for pod in pods}
        self._infos = {uid: v for uid, v in self._infos.items() if uid in self.pods}
        self._want_owners(pods)
        self._synced()
        return version

    def _events(self, api: KubeApi, version: str, timeout: int) -> AsyncIterator[WatchEvent]:
        return api.watch_pods(self.node, version, timeout)

    def _apply(self, event: WatchEvent) -> str:
        self._synced()
        if event.pod is None:  # BOOKMARK: only the version moves
            return event.resource_version
        if event.type == "DELETED":
            self.pods.pop(event.pod.uid, None)
            self._infos.pop(event.pod.uid, None)
        else:
            self.pods[event.pod.uid] = event.pod
            self._want_owners((event.pod,))
        return event.resource_version

    def _synced(self) -> None:
        if not self._up:
            self._states.ok_all("api/", "Kubernetes API answering again")
            if not self.synced.is_set():
                log.info("watching the %d pods of node %s", len(self.pods), self.node)
        self._up = True
        self.synced.set()

    # --- owners ----------------------------------------------------------------------

    def _want_owners(self, pods: Iterable[PodMeta]) -> None:
        for pod in pods:
            if pod.owner and pod.owner.kind in OWNER_RESOURCES and pod.owner.uid not in self.owners:
                self._owner_wanted.set()
                return

    async def _resolve_owners(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._owner_wanted.wait(), timeout=self.owner_retry)
            self._owner_wanted.clear()
            if self.api is not None:
                await self._read_due_owners(self.api)

    async def _read_due_owners(self, api: KubeApi) -> None:
        now = self._clock()
        referenced = {
            pod.owner.uid: (pod.namespace, pod.owner)
            for pod in list(self.pods.values())
            if pod.owner and pod.owner.kind in OWNER_RESOURCES
        }
        for uid in [uid for uid in self.owners if uid not in referenced]:
            del self.owners[uid]
        for uid, (namespace, ref) in referenced.items():
            known = self.owners.get(uid)
            if known is not None and known.expires > now:
                continue
            try:
                parent = await api.controller_of(namespace, ref.kind, ref.name)
            except ApiError as exc:
                if exc.code != 404:  # 404: the owner is gone; its pods are going too
                    self._states.failed(
                        f"owner/{exc.code}",
                        f"cannot read {ref.kind} owners ({exc}): workloads above them "
                        "(Deployments, CronJobs) stay unnamed; check the ServiceAccount's RBAC",
                    )
                parent = known.parent if known else None
            except (httpx.HTTPError, OSError, ValueError) as exc:
                log.debug("reading %s %s/%s failed: %s", ref.kind, namespace, ref.name, exc)
                # Retried after owner_retry; meanwhile the pod's series names what is known.
                parent = known.parent if known else None
                self.owners[uid] = _Owner(parent, self._clock() + self.owner_retry)
                continue
            else:
                self._states.ok_all("owner/", "owners readable again")
            ttl = self.owner_ttl * self._rng.uniform(0.9, 1.1)
            self.owners[uid] = _Owner(parent, self._clock() + ttl)
