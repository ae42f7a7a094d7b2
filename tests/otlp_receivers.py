"""Real OTLP receivers for tests: the gRPC MetricsService and LogsService, and the OTLP/HTTP
endpoints (`/v1/metrics`, `/v1/logs`).

Both run in their own threads (the SDK exports synchronously from whichever thread asks,
so a receiver on the test's event loop would deadlock a `force_flush`). Both record every
request with its headers, and answer as `behaviour` says: accept, UNAVAILABLE / 503,
partial success, an authentication error, or hang before answering.
"""

from __future__ import annotations

import asyncio
import gzip
import ssl
import threading
import zlib
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from aiohttp import web
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2 as logs_pb
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc as logs_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as pb
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as pb_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass
class Behaviour:
    answer: str = "ok"
    """ok | unavailable (gRPC UNAVAILABLE, HTTP 503) | partial | hang; HTTP only: drip (200
    and a body announced long, one byte every `drip_seconds`) | endless (200 and a body
    that never ends): answers no collector gives, what the exporter must bound (issue 41)"""
    drip_seconds: float = 0.5
    rejected: int = 0
    """Data points reported rejected with `partial`."""
    hang_seconds: float = 5.0
    required_headers: dict[str, str] = field(default_factory=dict)
    """Answer UNAUTHENTICATED / 401 when one of these is missing."""


@dataclass(frozen=True)
class Received:
    request: pb.ExportMetricsServiceRequest
    headers: dict[str, str]
    answer: str


class _Record:
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.received: list[Received] = []
        self.behaviour = Behaviour()
        self.release = threading.Event()
        """Set to end every hang at once (teardown)."""
        self.logs: list[logs_pb.ExportLogsServiceRequest] = []
        """Every log export (accepted, or dripped or never ended as `behaviour` says)."""

    def add_logs(self, request: logs_pb.ExportLogsServiceRequest) -> None:
        with self.cond:
            self.logs.append(request)
            self.cond.notify_all()

    def add(self, item: Received) -> None:
        with self.cond:
            self.received.append(item)
            self.cond.notify_all()

    def answer_for(self, headers: dict[str, str]) -> str:
        b = self.behaviour
        if any(headers.get(k.lower()) != v for k, v in b.required_headers.items()):
            return "unauthenticated"
        return b.answer

    def response(self, answer: str) -> pb.ExportMetricsServiceResponse:
        response = pb.ExportMetricsServiceResponse()
        if answer == "partial":
            response.partial_success.rejected_data_points = self.behaviour.rejected
            response.partial_success.error_message = "test receiver rejects some points"
        return response


class Receiver:
    """Common surface of both receivers."""

    endpoint: str
    protocol: str
    _record: _Record

    def stop(self) -> None:
        raise NotImplementedError

    @property
    def behaviour(self) -> Behaviour:
        return self._record.behaviour

    @behaviour.setter
    def behaviour(self, value: Behaviour) -> None:
        self._record.behaviour = value

    @property
    def received(self) -> list[Received]:
        with self._record.cond:
            return list(self._record.received)

    def accepted(self) -> list[pb.ExportMetricsServiceRequest]:
        return [r.request for r in self.received if r.answer in ("ok", "partial")]

    def wait_for(self, count: int, timeout: float = 10.0) -> list[Received]:
        """Block until `count` requests arrived (any answer); the list so far on timeout."""
        with self._record.cond:
            self._record.cond.wait_for(lambda: len(self._record.received) >= count, timeout)
            return list(self._record.received)

    def clear(self) -> None:
        with self._record.cond:
            self._record.received.clear()

    def log_records(self) -> list[tuple[dict[str, Any], Any]]:
        """(resource attributes, LogRecord) of every log record received so far."""
        with self._record.cond:
            requests = list(self._record.logs)
        return [
            ({kv.key: _value(kv.value) for kv in rl.resource.attributes}, record)
            for request in requests
            for rl in request.resource_logs
            for sl in rl.scope_logs
            for record in sl.log_records
        ]

    def wait_for_log_records(self, count: int, timeout: float = 10.0) -> None:
        """Block until `count` log records arrived (or `timeout`)."""
        with self._record.cond:
            self._record.cond.wait_for(
                lambda: (
                    sum(
                        len(sl.log_records)
                        for r in self._record.logs
                        for rl in r.resource_logs
                        for sl in rl.scope_logs
                    )
                    >= count
                ),
                timeout,
            )


# --- gRPC ---------------------------------------------------------------------------


class _MetricsService(pb_grpc.MetricsServiceServicer):
    def __init__(self, record: _Record) -> None:
        self.record = record

    def Export(self, request: Any, context: Any) -> pb.ExportMetricsServiceResponse:
        headers = {k: v for k, v in context.invocation_metadata() if isinstance(v, str)}
        answer = self.record.answer_for(headers)
        self.record.add(Received(request, headers, answer))
        if answer == "hang":
            self.record.release.wait(self.record.behaviour.hang_seconds)
        if answer == "unavailable":
            context.abort(grpc.StatusCode.UNAVAILABLE, "test receiver is unavailable")
        if answer == "unauthenticated":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing credentials")
        return self.record.response(answer)


class _LogsService(logs_grpc.LogsServiceServicer):
    def __init__(self, record: _Record) -> None:
        self.record = record

    def Export(self, request: Any, context: Any) -> logs_pb.ExportLogsServiceResponse:
        self.record.add_logs(request)
        return logs_pb.ExportLogsServiceResponse()


class GrpcReceiver(Receiver):
    def __init__(self, port: int = 0, tls: tuple[bytes, bytes] | None = None) -> None:
        self._record = _Record()
        self.protocol = "grpc"
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_MetricsServiceServicer_to_server(  # type: ignore[no-untyped-call]
            _MetricsService(self._record), self._server
        )
        logs_grpc.add_LogsServiceServicer_to_server(  # type: ignore[no-untyped-call]
            _LogsService(self._record), self._server
        )
        if tls is None:
            self.port = self._server.add_insecure_port(f"127.0.0.1:{port}")
            self.endpoint = f"http://127.0.0.1:{self.port}"
        else:
            key, cert = tls
            creds = grpc.ssl_server_credentials([(key, cert)])
            self.port = self._server.add_secure_port(f"127.0.0.1:{port}", creds)
            self.endpoint = f"https://127.0.0.1:{self.port}"
        self._server.start()

    def stop(self) -> None:
        self._record.release.set()
        self._server.stop(grace=None).wait()


# --- HTTP ---------------------------------------------------------------------------


class HttpReceiver(Receiver):
    """aiohttp on its own loop thread, POST /v1/metrics (gzip and deflate bodies too)."""

    def __init__(
        self, port: int = 0, tls: ssl.SSLContext | None = None, path: str = "/v1/metrics"
    ) -> None:
        self._record = _Record()
        self.protocol = "http/protobuf"
        self.path = path
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._runner: web.AppRunner | None = None
        self.port = asyncio.run_coroutine_threadsafe(self._start(port, tls), self._loop).result(10)
        scheme = "https" if tls else "http"
        self.endpoint = f"{scheme}://127.0.0.1:{self.port}"

    async def _start(self, port: int, tls: ssl.SSLContext | None) -> int:
        app = web.Application()
        app.router.add_post(self.path, self._handle)
        app.router.add_post("/v1/logs", self._handle_logs)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port, ssl_context=tls)
        await site.start()
        return int(self._runner.addresses[0][1])

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        encoding = request.headers.get("Content-Encoding", "")
        # aiohttp may already have decoded the body; decode what is still compressed.
        if encoding == "gzip" and body[:2] == b"\x1f\x8b":
            body = gzip.decompress(body)
        elif encoding == "deflate" and body[:1] == b"\x78":
            body = zlib.decompress(body)
        parsed = pb.ExportMetricsServiceRequest()
        parsed.ParseFromString(body)
        headers = {k.lower(): v for k, v in request.headers.items()}
        answer = self._record.answer_for(headers)
        self._record.add(Received(parsed, headers, answer))
        if answer == "hang":
            await asyncio.to_thread(self._record.release.wait, self._record.behaviour.hang_seconds)
        if answer == "unavailable":
            return web.Response(status=503, text="test receiver is unavailable")
        if answer == "unauthenticated":
            return web.Response(status=401, text="missing credentials")
        if answer in ("drip", "endless"):
            return await self._hostile(request, answer)
        return web.Response(
            body=self._record.response(answer).SerializeToString(),
            content_type="application/x-protobuf",
        )

    async def _hostile(self, request: web.Request, answer: str) -> web.StreamResponse:
        """A 200 whose body drips (announced 1 MB long) or never ends, until the client goes."""
        response = web.StreamResponse(headers={"Content-Type": "application/x-protobuf"})
        if answer == "drip":
            response.content_length = 1_000_000
        await response.prepare(request)
        chunk = b"\0" if answer == "drip" else b"\0" * 65536
        try:
            while not self._record.release.is_set():
                await response.write(chunk)
                if answer == "drip":
                    await asyncio.sleep(self._record.behaviour.drip_seconds)
        except (ConnectionError, RuntimeError):
            pass
        return response

    async def _handle_logs(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.headers.get("Content-Encoding", "") == "gzip" and body[:2] == b"\x1f\x8b":
            body = gzip.decompress(body)
        parsed = logs_pb.ExportLogsServiceRequest()
        parsed.ParseFromString(body)
        self._record.add_logs(parsed)
        if self._record.behaviour.answer in ("drip", "endless"):
            return await self._hostile(request, self._record.behaviour.answer)
        return web.Response(
            body=logs_pb.ExportLogsServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    def stop(self) -> None:
        self._record.release.set()
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


# --- reading what arrived -----------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """One received data point, flattened."""

    metric: str
    unit: str
    description: str
    type: str
    """gauge | sum"""
    monotonic: bool | None
    temporality: int | None
    """1 delta, 2 cumulative (AggregationTemporality)"""
    attributes: dict[str, Any]
    value: float
    start_ns: int
    time_ns: int
    resource: dict[str, Any]
    scope: str


def _value(v: AnyValue) -> Any:
    return getattr(v, v.WhichOneof("value") or "string_value")


def flatten(request: pb.ExportMetricsServiceRequest) -> Iterator[Point]:
    for rm in request.resource_metrics:
        resource = {kv.key: _value(kv.value) for kv in rm.resource.attributes}
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data") or ""
                data = getattr(m, kind)
                monotonic = data.is_monotonic if kind == "sum" else None
                temporality = data.aggregation_temporality if kind == "sum" else None
                for dp in data.data_points:
                    value = dp.as_double if dp.WhichOneof("value") == "as_double" else dp.as_int
                    yield Point(
                        metric=m.name,
                        unit=m.unit,
                        description=m.description,
                        type=kind,
                        monotonic=monotonic,
                        temporality=temporality,
                        attributes={kv.key: _value(kv.value) for kv in dp.attributes},
                        value=float(value),
                        start_ns=dp.start_time_unix_nano,
                        time_ns=dp.time_unix_nano,
                        resource=resource,
                        scope=sm.scope.name,
                    )


def points_of(requests: list[pb.ExportMetricsServiceRequest]) -> list[Point]:
    return [p for r in requests for p in flatten(r)]
