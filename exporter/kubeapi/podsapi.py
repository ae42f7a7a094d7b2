"""This node's pods from the kubelet's Pods API (KEP-4188; alpha in 1.36, kubelet gate `PodsAPI`).

The kubelet serves `v1alpha1.Pods` on `ROOT_DIR/pods-api/pods-api.sock`. `WatchPods` answers
an ADDED event per pod it runs, then INITIAL_SYNC_COMPLETE (no pod), then ADDED, MODIFIED
and DELETED as pods change; each pod is `v1.Pod#Marshal()` bytes, of which only name,
namespace, UID, labels and owner references are decoded (proto/podsapi/corev1). The same
facts as the API server's pod watch (watcher.py), without a watch per node on the API server.

Resuming: the API has no resource version, so a broken stream (kubelet restart, socket
gone) is re-opened after a back-off (1 s doubling to 60 s, jittered) and its replay builds a
new cache, which replaces the old one only at INITIAL_SYNC_COMPLETE: meanwhile the old cache
keeps serving. A restarted kubelet replays no pods (its pod manager is not filled yet) and
adds them right after, so pods a replay lacks stay RESTART_GRACE_SECONDS longer unless an
event names them; pods deleted while the stream was down leave then. No pod loses its info
series during a kubelet restart. Each state change is logged once.

The stream is a feed of watcher.py's `PodWatcher`, driven by listwatch.py's loop like the API
server's pod watch: its "list" starts a replay, its events are decoded here, in one place:
pod bytes that do not decode (or hold a string that is not UTF-8) make the stream's answer
unusable (answers.py), as does a replay or a cache of more pods than `--kubernetes.max-pods`;
the stream is then dropped, the cache kept, and the loop reconnects with back-off. A stream
that ends is retried on the back-off schedule, which starts over only after a stream that
stayed in sync `Timing.stable` (2 minutes): a kubelet that replays and hangs up at once is
asked ever less often, not once a second.
Owners above a ReplicaSet or Job (Deployment, CronJob) are not in the pod: the PodWatcher
still reads them from the API server, one `get` per owner, whatever its feed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from google.protobuf.message import DecodeError

from exporter._proto.podsapi.corev1 import api_pb2 as corev1
from exporter._proto.podsapi.v1alpha1 import api_pb2 as pb
from exporter._proto.podsapi.v1alpha1 import api_pb2_grpc as pb_grpc
from exporter.kubeapi.answers import Unusable
from exporter.kubeapi.client import NotConfigured
from exporter.kubeapi.listwatch import Failure, Sync, Wait
from exporter.kubeapi.pods import OwnerRef, PodMeta, WatchEvent
from exporter.kubeapi.watcher import PodWatcher
from exporter.settings.config import DEFAULTS

log = logging.getLogger("exporter.kubeapi.podsapi")

SOURCE_KUBELET = "kubelet-pods-api"
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""A pod is a few kB (2,312 bytes for a one-container pod on the real 1.36 kubelet)."""


RESTART_GRACE_SECONDS = 10.0
"""How long pods missing from a replay after a reconnect are kept (a restarting kubelet
replays none, then adds its pods within about a second)."""


class StreamEnded(Exception):
    """The kubelet closed the watch stream (it does not, short of stopping)."""


def decode_pod(data: bytes) -> PodMeta:
    """`v1.Pod#Marshal()` bytes -> the metadata the info series needs (its controlling owner,
    `controller: true`, as watcher.py's `controller_of` picks it). Unusable: bytes that do
    not decode, a string that is not UTF-8 (which protobuf reads lazily: as an exception, or
    for a map's value as bytes)."""
    try:
        meta = corev1.Pod.FromString(data).metadata
        owner = next(
            (OwnerRef(_text(ref.kind), _text(ref.name), _text(ref.uid))
             for ref in meta.ownerReferences if ref.controller),
            None,
        )  # fmt: skip
        labels = tuple(sorted((_text(k), _text(v)) for k, v in meta.labels.items()))
        pod = PodMeta(_text(meta.namespace), _text(meta.name), _text(meta.uid), labels, owner)
    except (DecodeError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        why = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        message = f"a pod of {len(data)} bytes that does not decode ({why})"
        raise Unusable("decode", message) from exc
    if not pod.uid or not pod.name:
        raise Unusable("decode", "a pod without a name or a UID")
    return pod


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"a string that is not UTF-8: {value!r:.40}")
    return value


_KINDS = {pb.ADDED: "ADDED", pb.MODIFIED: "MODIFIED", pb.DELETED: "DELETED"}


def decode_event(event: pb.WatchPodsEvent) -> WatchEvent:
    """A stream event; INITIAL_SYNC_COMPLETE carries no pod, and a type this proto does not
    name (UNSPECIFIED, a newer kubelet's) is taken as the pod being there. DecodeError: pod
    bytes that do not decode."""
    if event.type == pb.INITIAL_SYNC_COMPLETE:
        return WatchEvent("INITIAL_SYNC_COMPLETE", "")
    return WatchEvent(_KINDS.get(event.type, "ADDED"), "", decode_pod(event.pod))


class KubeletPods:
    """A PodWatcher's pods from the kubelet's Pods API (`feed=partial(KubeletPods, socket=...)`).

    The API has no resource version: a stream that breaks is opened again after a back-off
    (the first one after a stream that had synced waits the schedule's first step; the
    stream's end is always a failure) and its replay is the resync."""

    name = "kubelet Pods API"
    source = SOURCE_KUBELET
    bounded = False
    failures: tuple[type[BaseException], ...] = (grpc.aio.AioRpcError, StreamEnded, NotConfigured)
    """NotConfigured: no API configuration for the owner reads, which only an operator fixes
    (asked again after the long wait)."""

    def __init__(
        self,
        pods: PodWatcher,
        *,
        socket: Path = Path(DEFAULTS.pods_api_socket),
        restart_grace: float = RESTART_GRACE_SECONDS,
    ) -> None:
        self.pods = pods
        self.socket = socket
        self.restart_grace = restart_grace
        self.sync = Sync(log, "podsapi/")
        self.streams = 0
        """WatchPods calls made (the first, then one per reconnect)."""
        self._replay: dict[str, PodMeta] | None = None
        """The pods the stream replays, apart until INITIAL_SYNC_COMPLETE; None after."""
        self._synced_at: float | None = None
        """When the current stream synced (None: it has not)."""

    async def list(self) -> str:
        """A new replay, kept apart from the cache (which keeps serving meanwhile). The owner
        reads' client is made first (it makes no request by itself)."""
        self.pods.client()
        self._replay = {}
        self._synced_at = None
        return ""

    async def watch(self, version: str, timeout: int) -> AsyncIterator[WatchEvent]:
        """One WatchPods stream: every event, then StreamEnded at its end."""
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
        async with grpc.aio.insecure_channel(f"unix://{self.socket}", options=options) as channel:
            call = pb_grpc.PodsStub(channel).WatchPods(pb.WatchPodsRequest())
            self.streams += 1
            try:
                async for event in call:
                    yield decode_event(event)
            finally:
                call.cancel()
        raise StreamEnded("the kubelet ended the Pods API watch")

    def apply(self, event: WatchEvent) -> str:
        if event.pod is None:  # INITIAL_SYNC_COMPLETE
            if self._replay is not None:
                self._swap(self._replay)
            self._replay = None
        elif self._replay is None:
            self.pods.apply(event.type, event.pod)
        elif event.type == "DELETED":
            self._replay.pop(event.pod.uid, None)
        else:
            if event.pod.uid not in self._replay:
                self.pods.check_count(len(self._replay) + 1)
            self._replay[event.pod.uid] = event.pod
        return ""

    def failure(self, exc: BaseException) -> Failure:
        if isinstance(exc, NotConfigured):
            line = f"{exc}; owners above ReplicaSets and Jobs cannot be read, Pods API not read"
            return Failure("NotConfigured", line, Wait.DENIED)
        if isinstance(exc, grpc.aio.AioRpcError):
            key, why = exc.code().name, f"{exc.code().name}: {exc.details()}"
        else:
            key, why = type(exc).__name__, str(exc)
        line = (
            f"kubelet Pods API at {self.socket} unavailable ({why}); reconnecting with back-off,"
            f" serving the {len(self.pods.pods)} pods last synced meanwhile"
        )
        return Failure(key, line, restart=isinstance(exc, StreamEnded) and self._stable())

    def _stable(self) -> bool:
        """The stream that ended had stayed in sync `Timing.stable` or longer."""
        timing = self.pods.timing
        return self._synced_at is not None and timing.clock() - self._synced_at >= timing.stable

    def _swap(self, replay: dict[str, PodMeta]) -> None:
        """The replay becomes the cache. After a reconnect, pods it lacks stay `restart_grace`
        longer unless an event names them: a restarted kubelet replays before its pod manager
        has its pods (the real 1.36 kubelet: INITIAL_SYNC_COMPLETE with no pod 0.3 s after its
        restart, then ADDED for each), as its PodResources List answers empty for ~1 s."""
        missing = {uid: pod for uid, pod in self.pods.pods.items() if uid not in replay}
        if missing and self.sync.synced.is_set():
            log.info("kubelet Pods API replayed %d pods; %d others kept %.0f s in case a "
                     "restarting kubelet adds them back", len(replay), len(missing),
                     self.restart_grace)  # fmt: skip
            asyncio.get_running_loop().call_later(self.restart_grace, self._expire, missing)
            replay = {**missing, **replay}
        self.pods.replace(replay)
        self._synced_at = self.pods.timing.clock()
        self.sync.answering(
            f"kubelet Pods API at {self.socket} answering again",
            lambda: (
                f"reading the {len(replay)} pods of node {self.pods.node} from the kubelet "
                f"Pods API at {self.socket}"
            ),
            event=True,
        )

    def _expire(self, missing: dict[str, PodMeta]) -> None:
        """Drop the pods a replay lacked that no event has named since (still the same
        object in the cache): they were deleted while the stream was down."""
        for uid, pod in missing.items():
            if self.pods.pods.get(uid) is pod:
                self.pods.apply("DELETED", pod)
