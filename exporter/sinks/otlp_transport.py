"""OTLP transports: the SDK's own gRPC or HTTP/protobuf metric exporter, wrapped to count results.

Endpoint, headers, TLS files, compression and temporality preference are the standard
`OTEL_EXPORTER_OTLP_*` variables, read by the SDK exporters themselves. Some things are
decided here instead:

- The timeout. The specification gives `OTEL_EXPORTER_OTLP_(METRICS_)TIMEOUT` in
  milliseconds; the Python SDK reads seconds (open-telemetry/opentelemetry-python#4044), so
  the spec's own example `10000` would let one export (retries included) hang for hours.
  We read milliseconds and hand the SDK seconds.
- Partial success. The SDK exporters treat an OTLP `partial_success` answer as success and
  drop it; we read the rejected-point count from the response (a gRPC client interceptor,
  a `requests` response hook) so rejections show in self-metrics.
- Two SDK/library quirks: the gRPC exporter raises on the valid compression `none`, and
  `requests` lets REQUESTS_CA_BUNDLE override OTEL_EXPORTER_OTLP_CERTIFICATE.
- The collector's answer is untrusted input: over OTLP/HTTP the exporter's session
  (otlp_http.py) gives each exchange one deadline and caps the answer's bytes; over gRPC the
  SDK's call deadline covers the whole exchange and gRPC refuses an answer over 4 MiB.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import grpc
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
    OTLPMetricExporter as GrpcMetricExporter,
)
from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
    OTLPMetricExporter as HttpMetricExporter,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

from exporter.model import Sample
from exporter.runtime.log import StateLog
from exporter.settings.config import OtlpConfig
from exporter.settings.table import OTLP_PROTOCOLS
from exporter.sinks.otlp_http import DEFAULT_TIMEOUT_SECONDS, http_session

log = logging.getLogger("exporter.otlp")

METRICS_PATH = "v1/metrics"
BATCHES = "kube_device_exporter.export.batches"

SDK_EXPORT_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.sdk.metrics._internal.export",
)
"""Where the SDK logs every failed export (and every retry): quieted while failing."""


def export_timeout(env: Mapping[str, str]) -> float:
    """Seconds one export may take, retries included, from the spec's millisecond variables."""
    for name in ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"):
        raw = env.get(name, "").strip()
        if not raw:
            continue
        try:
            millis = float(raw)
        except ValueError:
            millis = math.nan
        if math.isfinite(millis) and millis > 0:
            return millis / 1000.0
        log.warning("%s=%r is not a positive number of milliseconds; ignored", name, raw)
    return DEFAULT_TIMEOUT_SECONDS


def http_url(otlp: OtlpConfig) -> str:
    """The POST URL: a signal-specific endpoint as given, a base endpoint plus `/v1/metrics`."""
    if otlp.signal_endpoint:
        return otlp.endpoint
    return f"{otlp.endpoint.rstrip('/')}/{METRICS_PATH}"


class ExportStats:
    """Export results, written by the reader's thread and read by the poller's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.success = 0
        self.failure = 0
        self.rejected_points = 0
        self.refused: Counter[str] = Counter()
        """Answers dropped by the session's bounds, by reason (`bytes`, `time`)."""

    def refuse(self, reason: str) -> None:
        with self._lock:
            self.refused[reason] += 1

    def count(self, result: MetricExportResult) -> None:
        self.count_ok(result is MetricExportResult.SUCCESS)

    def count_ok(self, ok: bool) -> None:
        with self._lock:
            if ok:
                self.success += 1
            else:
                self.failure += 1

    def reject(self, points: int) -> None:
        with self._lock:
            self.rejected_points += points

    def read(self) -> tuple[int, int, int]:
        with self._lock:
            return self.success, self.failure, self.rejected_points

    def samples(self, sink: str, request: str) -> tuple[Sample, ...]:
        """`export_batches` of `sink`, and the answers refused for `request`."""
        success, failure, _ = self.read()
        with self._lock:
            refused = sorted(self.refused.items())
        out = [
            Sample(BATCHES, float(success), (("sink", sink), ("result", "success"))),
            Sample(BATCHES, float(failure), (("sink", sink), ("result", "failure"))),
        ]
        for reason, count in refused:
            attrs = (("peer", "otlp"), ("request", request), ("reason", reason))
            out.append(Sample("kube_device_exporter.peer.answers.refused", float(count), attrs))
        return tuple(out)


class QuietWhileFailing(logging.Filter):
    """Lets each distinct SDK log message through once per failure streak (they repeat
    every interval while a collector is down); a successful export opens the gate again."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[tuple[str, int, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, str(record.msg))
        if key in self._seen:
            return False
        self._seen.add(key)
        return True

    def reset(self) -> None:
        self._seen = set()


class CountingExporter(MetricExporter):
    """Delegates to an SDK exporter and counts what each export did."""

    def __init__(
        self, inner: MetricExporter, stats: ExportStats, quiet: QuietWhileFailing, target: str
    ) -> None:
        # The reader takes temporality and aggregation from its exporter: pass the inner
        # exporter's (resolved from OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE).
        super().__init__(
            preferred_temporality=inner._preferred_temporality,
            preferred_aggregation=inner._preferred_aggregation,
        )
        self.inner = inner
        self.stats = stats
        self._quiet = quiet
        self._target = target
        self._states = StateLog(log)

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        try:
            result = self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        except Exception as exc:  # the reader would log and drop it; count it first
            self.stats.count(MetricExportResult.FAILURE)
            self._states.failed("export", f"OTLP export to {self._target} failed: {exc!r}")
            raise
        self.stats.count(result)
        if result is MetricExportResult.SUCCESS:
            self._quiet.reset()
            self._states.ok("export", f"OTLP export to {self._target} succeeding again")
        else:
            self._states.failed(
                "export",
                f"OTLP export to {self._target} failing; retrying every interval "
                '(kube_device_exporter_export_batches_total{result="failure"} counts)',
            )
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)


def on_partial_success(
    stats: ExportStats, target: str
) -> Callable[[ExportMetricsServiceResponse], None]:
    states = StateLog(log)

    def seen(response: ExportMetricsServiceResponse) -> None:
        rejected = response.partial_success.rejected_data_points
        if rejected or response.partial_success.error_message:
            stats.reject(rejected)
            states.failed(
                "partial",
                f"OTLP receiver {target} rejected {rejected} data points: "
                f"{response.partial_success.error_message or '(no message)'}",
            )
        else:
            states.ok("partial", f"OTLP receiver {target} accepts every data point again")

    return seen


class _ResponseInterceptor(grpc.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, seen: Callable[[ExportMetricsServiceResponse], None]) -> None:
        self._seen = seen

    def intercept_unary_unary(
        self, continuation: Callable[[Any, Any], Any], client_call_details: Any, request: Any
    ) -> Any:
        outcome = continuation(client_call_details, request)
        if outcome.exception() is None:
            response = outcome.result()
            if isinstance(response, ExportMetricsServiceResponse):
                self._seen(response)
        return outcome


class _GrpcExporter(GrpcMetricExporter):
    """The SDK gRPC exporter with our interceptor on every channel it (re)creates."""

    def __init__(self, seen: Callable[[ExportMetricsServiceResponse], None], **kwargs: Any) -> None:
        self._interceptor = _ResponseInterceptor(seen)
        super().__init__(**kwargs)

    def _initialize_channel_and_stub(self) -> None:
        super()._initialize_channel_and_stub()  # type: ignore[no-untyped-call]
        # The mixin closes self._channel on UNAVAILABLE and shutdown: an intercepted
        # channel forwards close() to the real one.
        channel: Any = grpc.intercept_channel(self._channel, self._interceptor)  # type: ignore[arg-type]
        self._channel = channel
        self._client = self._stub(channel)


def _grpc_compression(env: Mapping[str, str]) -> grpc.Compression | None:
    """`none` is a valid OTEL_EXPORTER_OTLP_COMPRESSION that the SDK's gRPC exporter rejects
    with an exception; other values are left to the SDK."""
    for name in ("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION"):
        value = env.get(name, "").strip().lower()
        if value:
            return grpc.Compression.NoCompression if value == "none" else None
    return None


def build_exporter(
    otlp: OtlpConfig,
    env: Mapping[str, str],
    stats: ExportStats,
    quiet: QuietWhileFailing,
    timeout: float | None = None,
) -> CountingExporter:
    """The SDK exporter for `otlp.protocol`, configured from `env` where the SDK reads it;
    `timeout` (seconds): already read from `env` by the caller (its warning logged once)."""
    timeout = export_timeout(env) if timeout is None else timeout
    if otlp.protocol == "grpc":
        target = otlp.endpoint
        seen = on_partial_success(stats, target)
        inner: MetricExporter = _GrpcExporter(
            seen, endpoint=otlp.endpoint, timeout=timeout, compression=_grpc_compression(env)
        )
    elif otlp.protocol == "http/protobuf":
        target = http_url(otlp)
        seen = on_partial_success(stats, target)
        inner = HttpMetricExporter(
            endpoint=target,
            timeout=timeout,
            session=http_session(env, target, stats.refuse, seen),
        )
    else:
        raise ValueError(
            f"OTLP protocol must be one of {', '.join(OTLP_PROTOCOLS)}, not {otlp.protocol!r}"
        )
    return CountingExporter(inner, stats, quiet, target)
