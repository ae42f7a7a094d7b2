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

Owners above a ReplicaSet or Job (Deployment, CronJob) are not in the pod: they are still
read from the API server, one `get` per owner as watcher.py does (that code is inherited).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from google.protobuf.message import DecodeError

from exporter._proto.podsapi.corev1 import api_pb2 as corev1
from exporter._proto.podsapi.v1alpha1 import api_pb2 as pb
from exporter._proto.podsapi.v1alpha1 import api_pb2_grpc as pb_grpc
from exporter.kubeapi.client import KubeApi, OwnerRef, PodMeta
from exporter.kubeapi.listwatch import BACKOFF_SECONDS, pause
from exporter.kubeapi.watcher import PodWatcher
from exporter.kubeapi.workloads import LabelFilter
from exporter.model import KubeApiHealth
from exporter.runtime.backoff import Backoff
from exporter.runtime.log import StateLog
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
    `controller: true`, as watcher.py's `controller_of` picks it)."""
    meta = corev1.Pod.FromString(data).metadata
    owner = next(
        (OwnerRef(ref.kind, ref.name, ref.uid) for ref in meta.ownerReferences if ref.controller),
        None,
    )
    return PodMeta(meta.namespace, meta.name, meta.uid, tuple(sorted(meta.labels.items())), owner)


class KubeletPodWatcher(PodWatcher):
    """PodWatcher whose pods come from the kubelet's Pods API; `pod_infos`, `health` and the
    owner reads are PodWatcher's own."""

    def __init__(
        self,
        connect: Callable[[], KubeApi],
        node: str,
        labels: LabelFilter | None = None,
        *,
        socket: Path = Path(DEFAULTS.pods_api_socket),
        backoff: tuple[float, float] = BACKOFF_SECONDS,
        restart_grace: float = RESTART_GRACE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(connect, node, labels, backoff=backoff, clock=clock, rng=rng)
        self.socket = socket
        self.restart_grace = restart_grace
        self._states = StateLog(log)
        self.streams = 0
        """WatchPods calls made (the first, then one per reconnect)."""

    def health(self) -> KubeApiHealth:
        base = super().health()
        return KubeApiHealth(base.up, base.pods, base.requests_total, SOURCE_KUBELET)

    async def _watch_forever(self, stop: asyncio.Event) -> None:
        self.api = self._connect()  # for owner reads only; makes no request by itself
        retry = Backoff(*self.backoff)
        while not stop.is_set():
            try:
                if await self._stream(stop):
                    retry.success()
                if stop.is_set():
                    return
                raise StreamEnded("the kubelet ended the Pods API watch")
            except grpc.aio.AioRpcError as exc:
                self._failed(f"podsapi/{exc.code().name}", f"{exc.code().name}: {exc.details()}")
            except (StreamEnded, DecodeError) as exc:  # DecodeError: pod bytes that do not decode
                self._failed(f"podsapi/{type(exc).__name__}", str(exc))
            await pause(stop, self._jittered(retry.failure()))

    def _failed(self, key: str, why: str) -> None:
        self._up = False
        self._states.failed(
            key,
            f"kubelet Pods API at {self.socket} unavailable ({why}); reconnecting with back-off,"
            f" serving the {len(self.pods)} pods last synced meanwhile",
        )

    async def _stream(self, stop: asyncio.Event) -> bool:
        """One WatchPods stream until it ends; True if it reached INITIAL_SYNC_COMPLETE."""
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
        async with grpc.aio.insecure_channel(f"unix://{self.socket}", options=options) as channel:
            call = pb_grpc.PodsStub(channel).WatchPods(pb.WatchPodsRequest())
            self.streams += 1
            replay: dict[str, PodMeta] | None = {}  # None once the initial sync is complete
            stopping = asyncio.create_task(stop.wait())
            try:
                async for event in _Events(call, stopping):
                    if event.type == pb.INITIAL_SYNC_COMPLETE:
                        if replay is not None:
                            self._swap(replay)
                        replay = None
                        continue
                    pod = decode_pod(event.pod)
                    pods = self.pods if replay is None else replay
                    if event.type == pb.DELETED:
                        pods.pop(pod.uid, None)
                        self._infos.pop(pod.uid, None)
                    else:
                        pods[pod.uid] = pod
                        if replay is None:
                            self._want_owners((pod,))
            finally:
                stopping.cancel()
                call.cancel()
            return replay is None

    def _swap(self, replay: dict[str, PodMeta]) -> None:
        """The replay becomes the cache. After a reconnect, pods it lacks stay `restart_grace`
        longer unless an event names them: a restarted kubelet replays before its pod manager
        has its pods (the real 1.36 kubelet: INITIAL_SYNC_COMPLETE with no pod 0.3 s after its
        restart, then ADDED for each), as its PodResources List answers empty for ~1 s."""
        missing = {uid: pod for uid, pod in self.pods.items() if uid not in replay}
        if missing and self.synced.is_set():
            log.info("kubelet Pods API replayed %d pods; %d others kept %.0f s in case a "
                     "restarting kubelet adds them back", len(replay), len(missing),
                     self.restart_grace)  # fmt: skip
            asyncio.get_running_loop().call_later(self.restart_grace, self._expire, missing)
            replay = {**missing, **replay}
        self.pods = replay
        self._infos = {uid: v for uid, v in self._infos.items() if uid in replay}
        self._want_owners(replay.values())
        if not self._up:
            self._states.ok_all("podsapi/", f"kubelet Pods API at {self.socket} answering again")
            if not self.synced.is_set():
                log.info("reading the %d pods of node %s from the kubelet Pods API at %s",
                         len(replay), self.node, self.socket)  # fmt: skip
        self._up = True
        self.synced.set()

    def _expire(self, missing: dict[str, PodMeta]) -> None:
        """Drop the pods a replay lacked that no event has named since (still the same
        object in the cache): they were deleted while the stream was down."""
        for uid, pod in missing.items():
            if self.pods.get(uid) is pod:
                del self.pods[uid]
                self._infos.pop(uid, None)


class _Events:
    """The stream's events until it ends or `stopping` finishes (stop set)."""

    def __init__(
        self,
        call: grpc.aio.UnaryStreamCall[pb.WatchPodsRequest, pb.WatchPodsEvent],
        stopping: asyncio.Task[bool],
    ) -> None:
        self._events = aiter(call)
        self._stopping = stopping

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> pb.WatchPodsEvent:
        read = asyncio.ensure_future(anext(self._events))
        await asyncio.wait((read, self._stopping), return_when=asyncio.FIRST_COMPLETED)
        if not read.done():
            read.cancel()
            raise StopAsyncIteration
        return read.result()  # StopAsyncIteration at the stream's end
