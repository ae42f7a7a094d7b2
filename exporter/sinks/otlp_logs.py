"""Device events as OpenTelemetry log records, pushed beside the metrics (docs/events.md).

One log record per event (exporter/derive/events.py), with the metrics' resource (`service.*`,
`k8s.node.name`, `host.name`), the device's identity, the event's code, class and severity
(exporter/derive/devicecodes.py), and the pods it hit as parallel string arrays
(`k8s.namespace.name`, `k8s.pod.name`, `k8s.container.name`; `k8s.pod.uid` where known):
a shared GPU's XID is one record naming every holder, not one per holder, so a query for
"which pods did this XID hit" reads one record.

The SDK's LoggerProvider with a BatchLogRecordProcessor: `publish()` only queues (it runs in
the poller's worker thread); the processor exports from its own thread, so a slow or dead
collector never holds up a cycle. Where the records go: the metrics' `--otlp.endpoint` and
`--otlp.protocol` (OTLP/HTTP appends `/v1/logs`); with only
OTEL_EXPORTER_OTLP_METRICS_ENDPOINT set, the SDK's own OTEL_EXPORTER_OTLP_LOGS_ENDPOINT.
Over OTLP/HTTP through the metrics' bounded session (otlp_transport.py: one deadline per
exchange, the answer's bytes capped); each export counted in
`kube_device_exporter_export_batches_total{sink="otlp-logs"}`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from opentelemetry._logs import SeverityNumber
from opentelemetry.sdk._logs import LoggerProvider, ReadableLogRecord
from opentelemetry.sdk._logs.export import (
    BatchLogRecordProcessor,
    LogRecordExporter,
    LogRecordExportResult,
)

from exporter import __version__
from exporter.derive.events import DeviceEvent
from exporter.model import Sample
from exporter.settings.config import Config
from exporter.sinks.otlp import SCOPE, build_resource
from exporter.sinks.otlp_http import http_session
from exporter.sinks.otlp_transport import ExportStats, export_timeout

log = logging.getLogger("exporter.otlp")

EVENT_NAME = "kube_device_exporter.device.event"
LOGS_PATH = "v1/logs"


def attributes(event: DeviceEvent) -> dict[str, Any]:
    """The record's attributes: device identity, the event, and every holder."""
    device = event.device
    attrs: dict[str, Any] = {
        "hw.id": device.id,
        "hw.type": device.type,
        "hw.vendor": device.vendor,
        "hw.model": device.model,
        "hw.event.code": event.code,
        "hw.event.class": event.info.klass,
        "hw.event.count": event.count,
    }
    if device.parent:
        attrs["hw.parent"] = device.parent
    if event.xid is not None:
        attrs["hw.gpu.xid"] = event.xid
    if event.holders:
        attrs["k8s.namespace.name"] = [h.namespace for h in event.holders]
        attrs["k8s.pod.name"] = [h.pod for h in event.holders]
        attrs["k8s.container.name"] = [h.container for h in event.holders]
    if event.pod_uids:
        uids = {(ns, pod): uid for ns, pod, uid in event.pod_uids}
        attrs["k8s.pod.uid"] = [uids.get((h.namespace, h.pod), "") for h in event.holders]
    return attrs


class CountingLogExporter(LogRecordExporter):
    """Delegates to the SDK's log exporter and counts what each export did."""

    def __init__(self, inner: LogRecordExporter, stats: ExportStats) -> None:
        self.inner = inner
        self.stats = stats

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        try:
            result = self.inner.export(batch)
        except Exception:
            self.stats.count_ok(False)
            raise
        self.stats.count_ok(result is LogRecordExportResult.SUCCESS)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()  # type: ignore[no-untyped-call]

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def build_log_exporter(
    config: Config, env: dict[str, str], stats: ExportStats | None = None
) -> LogRecordExporter | None:
    """The SDK's OTLP log exporter for the metrics' endpoint and protocol; None when only a
    metrics-specific endpoint is known and no logs endpoint is set."""
    otlp = config.otlp
    timeout = export_timeout(env)
    endpoint: str | None = otlp.endpoint
    if otlp.signal_endpoint:
        if not (
            env.get("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        ):
            return None
        endpoint = None  # the SDK reads the logs (or the base) endpoint itself
    if otlp.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter

        return OTLPLogExporter(endpoint=endpoint, timeout=timeout)
    from opentelemetry.exporter.otlp.proto.http._log_exporter import (
        OTLPLogExporter as HttpLogExporter,
    )

    url = f"{endpoint.rstrip('/')}/{LOGS_PATH}" if endpoint else None
    refused = stats.refuse if stats is not None else lambda reason: None
    session = http_session(env, url or "OTLP logs", refused)
    return HttpLogExporter(endpoint=url, timeout=timeout, session=session)


class OtlpLogSink:
    """Publishes device events as log records; `start()` before the first, `shutdown()` last."""

    def __init__(self, config: Config, exporter: LogRecordExporter | None = None) -> None:
        self.config = config
        self._exporter = exporter
        self._provider: LoggerProvider | None = None
        self._logger: Any = None
        self.stats = ExportStats()

    def self_samples(self) -> tuple[Sample, ...]:
        """Its exports, as `kube_device_exporter_export_batches_total{sink="otlp-logs"}`."""
        return self.stats.samples("otlp-logs", "logs") if self._provider is not None else ()

    def start(self) -> None:
        exporter = self._exporter or build_log_exporter(self.config, dict(os.environ), self.stats)
        if exporter is not None:
            exporter = CountingLogExporter(exporter, self.stats)
        if exporter is None:
            log.warning(
                "device events are not pushed as OTLP logs: only "
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is set; set OTEL_EXPORTER_OTLP_LOGS_ENDPOINT"
            )
            return
        self._provider = LoggerProvider(
            resource=build_resource(self.config.node_name), shutdown_on_exit=False
        )
        self._provider.add_log_record_processor(BatchLogRecordProcessor(exporter))
        self._logger = self._provider.get_logger(SCOPE, __version__)

    def publish(self, events: Sequence[DeviceEvent]) -> None:
        if self._logger is None:
            return
        for event in events:
            self._logger.emit(
                timestamp=int(event.timestamp * 1e9),
                severity_number=SeverityNumber(int(event.info.severity)),
                severity_text=event.info.severity.name,
                body=event.summary,
                attributes=attributes(event),
                event_name=EVENT_NAME,
            )

    def force_flush(self, timeout: float = 10.0) -> None:
        if self._provider is not None:
            self._provider.force_flush(timeout_millis=int(timeout * 1000))

    def shutdown(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()
            self._provider = None
            self._logger = None
