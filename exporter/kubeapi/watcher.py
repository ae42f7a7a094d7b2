"""The pods of this node, kept current in the background (`--kubernetes.api`).

A background task, never part of a cycle: the poller reads the latest cache with
`pod_infos()`, which makes no request. A feed keeps the cache, driven by listwatch.py's loop:
`ApiPods` here, client-go's Reflector on the API server —

- list once (`fieldSelector=spec.nodeName=<node>`), then watch from the list's
  resourceVersion with bookmarks, so a watch the server ends (its `timeoutSeconds`, 5 to 10
  minutes, randomized like client-go's) resumes from the newest version without a list;
- `410 Gone` (the version fell out of the watch cache) re-lists and replaces the cache;
- any other failure backs off (1 s doubling to 60 s; 5 minutes after 401/403, which only an
  operator fixes) and is logged once per state change; the cache is kept meanwhile and the
  exporter goes on exporting what PodResources gives —

or, where the kubelet serves its Pods API, podsapi.py's `KubeletPods`.

Owners: a pod's controller is in its own metadata; the workload above a ReplicaSet or Job
(Deployment, CronJob) needs that owner's metadata, read once per owner UID and re-read
after `owner_ttl` while a pod still refers to it, whatever the feed. Steady state is one
watch request per watch timeout plus the owner re-reads: see docs/kubernetes-api.md for the
measured numbers.

Bounds: the cache holds at most `max_pods` pods (`--kubernetes.max-pods`): a list or an
event past it is an unusable answer (answers.py), the cache as it was kept. No answer and no
bug ends the feed's loop or the owner reads: both log once per state and retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import httpx2 as httpx

from exporter.kubeapi.answers import Unusable
from exporter.kubeapi.client import (
    OWNER_RESOURCES,
    UNAVAILABLE,
    ApiError,
    KubeApi,
    NotConfigured,
    describe,
)
from exporter.kubeapi.listwatch import (
    Failure,
    ListWatch,
    Sync,
    Timing,
    Wait,
    Watched,
    api_key,
    api_wait,
)
from exporter.kubeapi.pods import OwnerRef, PodMeta, WatchEvent
from exporter.kubeapi.workloads import LabelFilter, pod_info
from exporter.model import KubeApiHealth, PodInfo
from exporter.settings.config import DEFAULTS

log = logging.getLogger("exporter.kubeapi")

OWNER_TTL_SECONDS = 3600.0
OWNER_RETRY_SECONDS = 60.0


@dataclass(slots=True)
class _Owner:
    parent: OwnerRef | None
    expires: float


class PodFeed(Watched[WatchEvent], Protocol):
    """Where a PodWatcher's pods come from; it writes them with `replace` and `apply`."""

    source: str
    """`KubeApiHealth.source`."""


class PodWatcher:
    """This node's pods, as one feed keeps them (`feed(watcher)`; the API server's pod
    watch by default), and the owners above their ReplicaSets and Jobs."""

    def __init__(
        self,
        connect: Callable[[], KubeApi],
        node: str,
        labels: LabelFilter | None = None,
        *,
        feed: Callable[[PodWatcher], PodFeed] | None = None,
        timing: Timing | None = None,
        owner_ttl: float = OWNER_TTL_SECONDS,
        owner_retry: float = OWNER_RETRY_SECONDS,
        max_pods: int = DEFAULTS.kubernetes_max_pods,
    ) -> None:
        self._connect = connect
        self.node = node
        self.max_pods = max_pods
        """Pods the cache may hold (--kubernetes.max-pods); 0: no limit."""
        self.owners_refused: Counter[str] = Counter()
        """Owner answers dropped at the boundary, by `Unusable.reason`."""
        self.labels = labels or LabelFilter()
        self.timing = timing or Timing()
        self.owner_ttl = owner_ttl
        self.owner_retry = owner_retry
        self.api: KubeApi | None = None
        self.pods: dict[str, PodMeta] = {}
        """uid -> metadata of every pod on this node."""
        self.owners: dict[str, _Owner] = {}
        """owner uid (ReplicaSet, Job) -> its controller, as last read."""
        self._infos: dict[str, tuple[PodMeta, OwnerRef | None, PodInfo]] = {}
        self._owner_wanted = asyncio.Event()
        self.changes = 0
        """Pod events applied so far (a pod added, changed, deleted; a list or replay that
        differs from the cache): the kubelet's schedule asks PodResources on them
        (podresources/schedule.py's `PodChanges`)."""
        self.changed_at = 0.0
        """When the last of them was applied (monotonic seconds)."""
        self._changed = asyncio.Event()
        self.feed: PodFeed = (feed or ApiPods)(self)
        self._loop = ListWatch(self.feed, self.timing)

    @property
    def synced(self) -> asyncio.Event:
        """Set once the feed first synced."""
        return self.feed.sync.synced

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
        refused = {(self.feed.source, "pods", reason): n
                   for reason, n in self.feed.sync.refused.items()}  # fmt: skip
        refused |= {("kubernetes-api", "owners", reason): n
                    for reason, n in self.owners_refused.items()}  # fmt: skip
        return KubeApiHealth(self.feed.sync.up, len(self.pods), requests, self.feed.source,
                             refused)  # fmt: skip

    def _info(self, uid: str, pod: PodMeta) -> PodInfo:
        owner = self.owners.get(pod.owner.uid) if pod.owner else None
        parent = owner.parent if owner else None
        cached = self._infos.get(uid)
        if cached is not None and cached[0] is pod and cached[1] == parent:
            return cached[2]
        info = pod_info(pod, parent, self.labels)
        self._infos[uid] = (pod, parent, info)
        return info

    # --- written by the feed -----------------------------------------------------------

    def client(self) -> KubeApi:
        """The one client, made at the first attempt (a retry after NotConfigured makes it)."""
        if self.api is None:
            self.api = self._connect()
        return self.api

    async def wait_change(self, seen: int) -> None:
        """Return once `changes` is no longer `seen`."""
        while self.changes == seen:
            self._changed.clear()
            await self._changed.wait()

    def _note_change(self) -> None:
        self.changes += 1
        self.changed_at = time.monotonic()
        self._changed.set()

    def replace(self, pods: dict[str, PodMeta]) -> None:
        """The feed's whole list (or replay) becomes the cache; Unusable (the cache as it
        was) past `max_pods`. Its first is the feed starting, not a change on the node: the
        first poll has those pods already."""
        self.check_count(len(pods))
        if pods != self.pods and self.synced.is_set():
            self._note_change()
        self.pods = pods
        self._infos = {uid: v for uid, v in self._infos.items() if uid in pods}
        self._want_owners(pods.values())

    def apply(self, kind: str, pod: PodMeta) -> None:
        """One pod added or changed, or (`kind` DELETED) gone. Every event is a change: a
        pod's status (its containers started, so its devices allocated) is not in its
        metadata."""
        if kind == "DELETED":
            self.pods.pop(pod.uid, None)
            self._infos.pop(pod.uid, None)
        else:
            if pod.uid not in self.pods:
                self.check_count(len(self.pods) + 1)
            self.pods[pod.uid] = pod
            self._want_owners((pod,))
        self._note_change()

    def check_count(self, pods: int) -> None:
        """Unusable when `pods` is more than this node can run (--kubernetes.max-pods)."""
        if self.max_pods and pods > self.max_pods:
            raise Unusable(
                "objects",
                f"more than {self.max_pods} pods on node {self.node} "
                "(over --kubernetes.max-pods): answer dropped",
            )

    # --- the background tasks ------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """The feed's loop and the owner reads until `stop` (the client closed then)."""
        owners = asyncio.create_task(self._resolve_owners(stop))
        try:
            await self._watch_forever(stop)
        finally:
            owners.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await owners
            if self.api is not None and stop.is_set():  # ended for a bug: started again, with it
                await self.api.close()

    async def _watch_forever(self, stop: asyncio.Event) -> None:
        await self._loop.run(stop)

    # --- owners ----------------------------------------------------------------------

    def _want_owners(self, pods: Iterable[PodMeta]) -> None:
        for pod in pods:
            if pod.owner and pod.owner.kind in OWNER_RESOURCES and pod.owner.uid not in self.owners:
                self._owner_wanted.set()
                return

    async def _resolve_owners(self, stop: asyncio.Event) -> None:
        states = self.feed.sync.states
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._owner_wanted.wait(), timeout=self.owner_retry)
            self._owner_wanted.clear()
            if self.api is None:
                continue
            try:
                await self._read_due_owners(self.api)
            except Exception as exc:  # noqa: BLE001 - a bug must not end the owner reads
                states.failed(
                    f"owner/error/{type(exc).__name__}",
                    f"reading owners failed unexpectedly ({type(exc).__name__}: {exc}); "
                    f"asking again in {self.owner_retry:g}s",
                    trace=exc,
                )

    async def _read_due_owners(self, api: KubeApi) -> None:
        now = self.timing.clock()
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
                    self.feed.sync.states.failed(
                        f"owner/{exc.code}",
                        f"cannot read {ref.kind} owners ({exc}): workloads above them "
                        "(Deployments, CronJobs) stay unnamed; check the ServiceAccount's RBAC",
                    )
                parent = known.parent if known else None
            except Unusable as exc:
                self.owners_refused[exc.reason] += 1
                self.feed.sync.states.failed(
                    f"owner/unusable/{exc.reason}",
                    f"{ref.kind} owner answer unusable ({exc}); asking again in "
                    f"{self.owner_retry:g}s",
                )
                parent = known.parent if known else None
                self.owners[uid] = _Owner(parent, self.timing.clock() + self.owner_retry)
                continue
            except (httpx.HTTPError, OSError) as exc:
                log.debug("reading %s %s/%s failed: %s", ref.kind, namespace, ref.name, exc)
                # Retried after owner_retry; meanwhile the pod's series names what is known.
                parent = known.parent if known else None
                self.owners[uid] = _Owner(parent, self.timing.clock() + self.owner_retry)
                continue
            else:
                self.feed.sync.states.ok_all("owner/", "owners readable again")
            ttl = self.owner_ttl * self.timing.rng.uniform(0.9, 1.1)
            self.owners[uid] = _Owner(parent, self.timing.clock() + ttl)


class ApiPods:
    """The pods from the API server: a list, then a watch, metadata only (whole pods with
    `--kubernetes.dra`, which reads their claims' health)."""

    name = "pod"
    source = "kubernetes-api"
    bounded = True
    failures: tuple[type[BaseException], ...] = (ApiError, *UNAVAILABLE)

    def __init__(self, pods: PodWatcher) -> None:
        self.pods = pods
        self.sync = Sync(log, "api/")

    async def list(self) -> str:
        pods, version = await self.pods.client().list_pods(self.pods.node)
        self.pods.replace({pod.uid: pod for pod in pods})
        self._answering()
        return version

    def watch(self, version: str, timeout: int) -> AsyncIterator[WatchEvent]:
        # Accepted from our version: in sync (up) before the first event comes.
        return self.pods.client().watch_pods(self.pods.node, version, timeout, self._answering)

    def apply(self, event: WatchEvent) -> str:
        if event.pod is not None:  # a BOOKMARK only moves the version
            self.pods.apply(event.type, event.pod)
        self._answering(event=True)
        return event.resource_version

    def failure(self, exc: BaseException) -> Failure:
        wait = api_wait(exc, gone=Wait.RELIST, operator_only=(NotConfigured,))
        if wait is Wait.RELIST:
            return Failure("410", f"pod watch expired (410 Gone: {exc}); listing again", wait)
        if isinstance(exc, ApiError):
            rbac = "; check the ServiceAccount's RBAC" if wait is Wait.DENIED else ""
            why = f"Kubernetes API answers {exc}{rbac}"
        else:
            why = f"Kubernetes API unavailable ({describe(exc)})"
        line = (
            f"{why}; pod UIDs, owners and labels are missing until it answers, devices are "
            "exported as PodResources gives them"
        )
        return Failure(api_key(exc), line, wait)

    def _answering(self, *, event: bool = False) -> None:
        self.sync.answering(
            "Kubernetes API answering again",
            lambda: f"watching the {len(self.pods.pods)} pods of node {self.pods.node}",
            event=event,
        )
