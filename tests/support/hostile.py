"""Hostile peers of the tests' own (issue 41): a Kubernetes API server, a kubelet Pods API and
a kubelet PodResources that answer what no real one does (wrong shapes, bytes that do not
decode, answers without end), switched on and off while the exporter runs, so that a test
or the bench (bench/peer_faults.py) can break a peer, mend it, and see the exporter come
back. The OTLP collectors that drip or never end their answer are tests/otlp_receivers.py's
(`Behaviour.answer`).

What each attack sends is named after what the issue's attack suite saw break; none of it
is a claim about a real peer, which is why the stand-ins of simulator/ stay kind.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from aiohttp import web

from exporter._proto.podsapi.corev1 import api_pb2 as corev1
from exporter._proto.podsapi.v1alpha1 import api_pb2 as pb
from simulator.apiserver import RESOURCES, ApiServer
from tests.support.kubeapi import pod
from tests.support.podsapi import FakePodsApi, encode

Attack = Callable[[web.Request], Awaitable[web.StreamResponse]]
"""Answers one request in place of the server."""


# --- the API server ------------------------------------------------------------------------


def _what(request: web.Request) -> tuple[str, str]:
    """(verb, resource) of a request, as ApiServer counts them."""
    for resource, (path, _, _) in RESOURCES.items():
        if request.path == path:
            return ("watch" if request.query.get("watch") == "true" else "list"), resource
    return "get", request.match_info.get("resource", "")


class HostileApiServer(ApiServer):
    """ApiServer, but a request whose (verb, resource) has an attack gets the attack's answer
    (`attack()`, `mend()`); every request is still counted in `requests`."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.attacks: dict[tuple[str, str], Attack] = {}

    def attack(self, verb: str, resource: str, attack: Attack) -> None:
        self.attacks[(verb, resource)] = attack

    def mend(self) -> None:
        self.attacks.clear()

    def _routes(self, app: web.Application) -> None:
        @web.middleware
        async def hostile(
            request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
        ) -> web.StreamResponse:
            what = _what(request)
            attack = self.attacks.get(what)
            if attack is None:
                return await handler(request)
            self.requests.append(what)
            return await attack(request)

        app.middlewares.append(hostile)
        super()._routes(app)


def answer(body: object, status: int = 200) -> Attack:
    """One JSON answer (bytes as they are)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()

    async def send(request: web.Request) -> web.StreamResponse:
        return web.Response(body=data, status=status, content_type="application/json")

    return send


def list_of(*items: object, version: str = "5000") -> Attack:
    """A list whose items are `items`, whatever their shape."""
    return answer({"kind": "List", "apiVersion": "v1", "items": list(items),
                   "metadata": {"resourceVersion": version}})  # fmt: skip


def pages_forever(per_page: int = 500) -> Attack:
    """A list that always has another page: `per_page` new pods of NODE on each, and a
    `continue` token."""
    serial = itertools.count()

    async def send(request: web.Request) -> web.StreamResponse:
        page = next(serial)
        items = [pod(f"p{page}-{i}", "flood") for i in range(per_page)]
        body = {"kind": "PodList", "apiVersion": "v1", "items": items,
                "metadata": {"resourceVersion": "5000", "continue": f"page-{page + 1}"}}  # fmt: skip
        return web.Response(body=json.dumps(body).encode(), content_type="application/json")

    return send


def watch_lines(*lines: bytes, hold: float = 30.0) -> Attack:
    """A watch that sends `lines` (each ended by a newline), then holds the stream open
    `hold` seconds."""

    async def send(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        for line in lines:
            await response.write(line + b"\n")
        await asyncio.sleep(hold)
        return response

    return send


def endless_line(chunk: int = 64 * 1024) -> Attack:
    """A watch whose first line never ends: `chunk` bytes at a time, no newline, until the
    client goes."""

    async def send(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        piece = b'{"type":"ADDED","object":{"metadata":{"name":"' + b"x" * chunk
        try:
            while True:
                await response.write(piece)
                piece = b"x" * chunk
        except (ConnectionError, RuntimeError):
            return response

    return send


def drip(body: bytes, every: float) -> Attack:
    """An answer of `body` (its length announced) sent one byte every `every` seconds."""

    async def send(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = len(body)
        await response.prepare(request)
        try:
            for i in range(len(body)):
                await response.write(body[i : i + 1])
                await asyncio.sleep(every)
        except (ConnectionError, RuntimeError):
            pass
        return response

    return send


BAD_POD_LISTS: dict[str, list[object]] = {
    "labels are a list": [{"metadata": {"name": "a", "namespace": "x", "uid": "u-a",
                                        "labels": ["team", "vision"]}}],
    "an item is a string": ["a pod"],
    "metadata is a number": [{"metadata": 7}],
    "the uid is missing": [{"metadata": {"name": "a", "namespace": "x"}}],
    "an owner reference is a string": [{"metadata": {"name": "a", "namespace": "x",
                                                     "uid": "u-a", "ownerReferences": ["rs"]}}],
}  # fmt: skip
"""Pod list items that no API server sends, by what is wrong with them."""

BAD_WATCH_LINES: dict[str, bytes] = {
    "a JSON array": b'["ADDED", {"metadata": {}}]',
    "not JSON": b"\x89PNG\r\n\x1a\n",
    "the object is an array": b'{"type": "ADDED", "object": [1, 2]}',
    "labels are a string": json.dumps({"type": "MODIFIED", "object": {"metadata": {
        "name": "a", "namespace": "x", "uid": "u-a", "labels": "team=vision"}}}).encode(),
    "not UTF-8": b'{"type": "ADDED", "object": {"metadata": {"name": "\xff\xfe"}}}',
}  # fmt: skip
"""Watch lines that no API server sends."""


# --- the kubelet's Pods API --------------------------------------------------------------

Script = Callable[["HostilePodsApi"], AsyncIterator[pb.WatchPodsEvent]]


class HostilePodsApi(FakePodsApi):
    """FakePodsApi, but while `script` is set each WatchPods stream is what it yields."""

    def __init__(self, socket: Path) -> None:
        super().__init__(socket)
        self.script: Script | None = None
        self._ends: set[asyncio.Event] = set()

    def stop_streams(self) -> None:
        """End every open stream with UNAVAILABLE, as a kubelet restart does: the next ones
        follow `script` as it is then."""
        for end in self._ends:
            end.set()

    async def WatchPods(
        self, request: pb.WatchPodsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.WatchPodsEvent]:
        end = asyncio.Event()
        self._ends.add(end)
        if self.script is None:
            source = super().WatchPods(request, context)
        else:
            self.watches += 1
            source = self.script(self)
        try:
            events = source.__aiter__()
            while True:
                ahead = asyncio.ensure_future(events.__anext__())
                ending = asyncio.ensure_future(end.wait())
                await asyncio.wait((ahead, ending), return_when=asyncio.FIRST_COMPLETED)
                ending.cancel()
                if end.is_set():
                    ahead.cancel()
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "the kubelet restarted")
                try:
                    yield ahead.result()
                except StopAsyncIteration:
                    return
        finally:
            self._ends.discard(end)

    def replay(self) -> list[pb.WatchPodsEvent]:
        """ADDED for each pod it holds."""
        return [pb.WatchPodsEvent(type=pb.ADDED, pod=encode(o)) for o in self.pods.values()]


SYNCED = pb.WatchPodsEvent(type=pb.INITIAL_SYNC_COMPLETE)


def pod_bytes_with_label(obj: dict[str, Any], key: bytes, value: bytes) -> bytes:
    """A pod's `v1.Pod` bytes with one more label whose key and value are these raw bytes
    (protobuf will not write a string that is not UTF-8: the map entry is added by hand)."""
    meta = corev1.Pod.FromString(encode(obj)).metadata.SerializeToString()
    entry = _field(1, key) + _field(2, value)
    meta += _field(11, entry)  # ObjectMeta.labels, map<string, string>
    return _field(1, meta)  # Pod.metadata


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def bad_pod(data: bytes) -> Script:
    """The replay, one pod of `data` (bytes that do not decode as it should), the sync marker,
    then nothing."""

    async def stream(api: HostilePodsApi) -> AsyncIterator[pb.WatchPodsEvent]:
        for event in api.replay():
            yield event
        yield pb.WatchPodsEvent(type=pb.ADDED, pod=data)
        yield SYNCED
        await asyncio.Event().wait()

    return stream


def endless_new_pods(*, synced_first: bool, per_event_labels: int = 8) -> Script:
    """ADDED events of pods with new UIDs, without end: before the sync marker (which never
    comes), or after it."""

    async def stream(api: HostilePodsApi) -> AsyncIterator[pb.WatchPodsEvent]:
        if synced_first:
            for event in api.replay():
                yield event
            yield SYNCED
        labels = {f"label-{i}": "v" * 40 for i in range(per_event_labels)}
        for n in itertools.count():
            obj = pod(f"flood-{n}", "flood", uid=f"flood-{n}", labels=labels)
            yield pb.WatchPodsEvent(type=pb.ADDED, pod=encode(obj))
            if n % 100 == 0:
                await asyncio.sleep(0)

    return stream


def replay_and_hang_up() -> Script:
    """The replay and the sync marker, then the end of the stream, at once, every time."""

    async def stream(api: HostilePodsApi) -> AsyncIterator[pb.WatchPodsEvent]:
        for event in api.replay():
            yield event
        yield SYNCED

    return stream


# --- the kubelet's PodResources ------------------------------------------------------------


class RawKubelet:
    """PodResources v1 `List` and `GetAllocatableResources` on a unix socket, answering the
    bytes in `answers` (a method's answer: bytes, or a callable making them per call);
    `calls` counts each method's calls."""

    def __init__(self, socket: Path, answers: dict[str, bytes | Callable[[], bytes]]) -> None:
        self.socket = socket
        self.answers = answers
        self.calls: Counter[str] = Counter()
        self._server: grpc.aio.Server | None = None

    async def start(self) -> RawKubelet:
        server = grpc.aio.server()
        handlers = {
            method: grpc.unary_unary_rpc_method_handler(self._handler(method))
            for method in ("List", "GetAllocatableResources")
        }
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("v1.PodResourcesLister", handlers),)
        )
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        self._server = server
        return self

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=0)
            self._server = None

    def _handler(self, method: str) -> Callable[[bytes, Any], Awaitable[bytes]]:
        async def handle(request: bytes, context: Any) -> bytes:
            self.calls[method] += 1
            made = self.answers.get(method, b"")
            return made() if callable(made) else made

        return handle


def endless_varint(size: int) -> bytes:
    """A List answer that is one field's tag and then a length varint `size` bytes long (all
    continuation bits)."""
    return b"\x0a" + b"\xff" * size


def pod_name_not_utf8() -> bytes:
    """A List answer with one pod whose name is not UTF-8 (proto3 strings must be)."""
    name = b"\xff\xfename"
    pod_resources = _field(1, name) + _field(2, b"default")
    return _field(1, pod_resources)


def v1_list(pods: tuple[Any, ...]) -> bytes:
    """A well-formed v1 List answer of `pods` (model Pods), as the simulated kubelet sends."""
    from exporter._proto.podresources.v1 import api_pb2 as v1_pb2
    from simulator.kubelet_wire import pod_to_v1

    return v1_pb2.ListPodResourcesResponse(
        pod_resources=[pod_to_v1(p) for p in pods]
    ).SerializeToString()
