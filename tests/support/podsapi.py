"""A kubelet Pods API (v1alpha1.Pods, KEP-4188) for the simulated tier: WatchPods over a unix
socket, in the test's event loop.

What it copies, and from where:
- the stream: an ADDED event per pod it holds, then INITIAL_SYNC_COMPLETE with no pod, then
  ADDED/MODIFIED/DELETED as pods change (proto/podsapi/v1alpha1/api.proto, the kubelet's own
  comment on WatchPods and on WatchPodsEvent.pod; observed on the real 1.36 kubelet: tests/test_real_cluster_podsapi.py, docs/kubernetes-api.md);
- pods are `v1.Pod#Marshal()` bytes; it writes only the metadata fields of
  proto/podsapi/corev1 (the real kubelet's pods carry spec and status too: the real-cluster
  test, tests/test_real_cluster_podsapi.py, decodes those);
- GetPod of an unknown UID: NOT_FOUND "pod with UID X not found" (the real 1.36 kubelet,
  tests/test_real_cluster_podsapi.py);
- a kubelet restart ends every stream with UNAVAILABLE and removes the socket until it serves
  again: `stop()` then `start()`; the restarted real kubelet replays no pod, then adds its pods
  (tests/test_real_cluster_podsapi.py): a test empties `pods` before `start()` and `add`s them.
`hold_sync` keeps INITIAL_SYNC_COMPLETE back until `release_sync()` (a test's own control, so
the time between the replay and the sync marker can be looked at).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from exporter._proto.podsapi.corev1 import api_pb2 as corev1
from exporter._proto.podsapi.v1alpha1 import api_pb2 as pb
from exporter._proto.podsapi.v1alpha1 import api_pb2_grpc as pb_grpc


def encode(obj: dict[str, Any]) -> bytes:
    """A pod dict (tests.support.kubeapi.pod) as v1.Pod protobuf bytes (metadata only)."""
    meta = obj["metadata"]
    refs = [
        corev1.OwnerReference(kind=r["kind"], name=r["name"], uid=r["uid"],
                              apiVersion=r["apiVersion"], controller=r.get("controller", False))
        for r in meta.get("ownerReferences", ())
    ]  # fmt: skip
    return corev1.Pod(
        metadata=corev1.ObjectMeta(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"],
                                   labels=meta.get("labels", {}), ownerReferences=refs)
    ).SerializeToString()  # fmt: skip


class FakePodsApi(pb_grpc.PodsServicer):
    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.pods: dict[str, dict[str, Any]] = {}
        self.watches = 0
        self.hold_sync = False
        self._sync = asyncio.Event()
        self._queues: list[asyncio.Queue[pb.WatchPodsEvent]] = []
        self._server: grpc.aio.Server | None = None

    async def start(self) -> FakePodsApi:
        self._server = grpc.aio.server()
        pb_grpc.add_PodsServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{self.socket}")
        await self._server.start()
        return self

    async def stop(self) -> None:
        """As a kubelet stopping: streams end (UNAVAILABLE), the socket goes."""
        if self._server is not None:
            await self._server.stop(grace=0)
            self._server = None
        self._queues.clear()
        self.socket.unlink(missing_ok=True)

    def release_sync(self) -> None:
        self._sync.set()

    def add(self, obj: dict[str, Any]) -> None:
        kind = pb.MODIFIED if obj["metadata"]["uid"] in self.pods else pb.ADDED
        self.pods[obj["metadata"]["uid"]] = obj
        self._send(pb.WatchPodsEvent(type=kind, pod=encode(obj)))

    def delete(self, obj: dict[str, Any]) -> None:
        self.pods.pop(obj["metadata"]["uid"])
        self._send(pb.WatchPodsEvent(type=pb.DELETED, pod=encode(obj)))

    def _send(self, event: pb.WatchPodsEvent) -> None:
        for queue in self._queues:
            queue.put_nowait(event)

    async def ListPods(
        self, request: pb.ListPodsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListPodsResponse:
        return pb.ListPodsResponse(pods=[encode(obj) for obj in self.pods.values()])

    async def GetPod(
        self, request: pb.GetPodRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.GetPodResponse:
        if request.podUID not in self.pods:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"pod with UID {request.podUID} not found"
            )
        return pb.GetPodResponse(pod=encode(self.pods[request.podUID]))

    async def WatchPods(
        self, request: pb.WatchPodsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.WatchPodsEvent]:
        self.watches += 1
        queue: asyncio.Queue[pb.WatchPodsEvent] = asyncio.Queue()
        self._queues.append(queue)
        for obj in list(self.pods.values()):
            yield pb.WatchPodsEvent(type=pb.ADDED, pod=encode(obj))
        if self.hold_sync:
            await self._sync.wait()
        yield pb.WatchPodsEvent(type=pb.INITIAL_SYNC_COMPLETE)
        while True:
            yield await queue.get()
