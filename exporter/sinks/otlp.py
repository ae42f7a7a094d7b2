"""The OTLP sink: the latest snapshot, pushed to an OpenTelemetry Collector.

One MeterProvider, one observable instrument per metric-spec row; every callback reads
the points of the snapshot pinned for the current collection, produced by the same
`points()` the Prometheus sink renders (no second collection path). A
PeriodicExportingMetricReader collects and exports from its own thread: `update()` only
swaps a reference, so a slow, dead or rejecting collector never touches the poller's
cycle. Nothing queues: an export that fails is dropped and the next carries the latest
values. `k8s.node.name` is a resource attribute here, not a data point attribute.

Series of departed pods. The Python SDK keeps the state of every attribute set an
asynchronous instrument ever observed: it stops exporting a departed pod's series but
remembers it forever, and after 2000 sets per metric it folds new pods into
`otel.metric.overflow`. On a node that churns pods that is unbounded memory and, soon,
wrong data. So before each collection we forget attribute sets unseen for
`forget_after` seconds (default `FORGET_INTERVALS` export intervals: a source that fails
for a cycle or two does not restart its counters; 5 minutes before issue 41 kept 30,000
departed pods' series at 100 pods a second, 208 MiB against 66 without OTLP). That reaches
into SDK internals (`_drop_sdk_state`); mypy checks the path against the installed SDK, and
the churn tests in tests/test_otlp*.py fail if it stops working.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import OTELResourceDetector, Resource

from exporter import __version__
from exporter.metrics import SPECS_LIST, Kind
from exporter.model import Sample, Snapshot
from exporter.points import points
from exporter.settings.config import Config
from exporter.settings.otelenv import milliseconds
from exporter.sinks.otlp_http import DEFAULT_TIMEOUT_SECONDS
from exporter.sinks.otlp_transport import (
    SDK_EXPORT_LOGGERS,
    ExportStats,
    QuietWhileFailing,
    build_exporter,
    export_timeout,
)

log = logging.getLogger("exporter.otlp")

SERVICE_NAME = "kube-device-exporter"
SCOPE = "kube-device-exporter"
FORGET_INTERVALS = 3
_REJECTED = "kube_device_exporter.export.rejected"

AttributeKey = frozenset[tuple[str, Any]]


def build_resource(node: str) -> Resource:
    """SDK defaults < ours < OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME."""
    ours: dict[str, str] = {"service.name": SERVICE_NAME, "service.version": __version__}
    if node:
        # host.name is the node: inside a pod the hostname is the pod's name. One exporter
        # per node, so the node names the instance too (the SDK's default is a random UUID
        # per process: new series after every restart once a collector makes them labels).
        ours |= {"k8s.node.name": node, "host.name": node, "service.instance.id": node}
    return Resource.create().merge(Resource(ours)).merge(OTELResourceDetector().detect())


class _SnapshotReader(PeriodicExportingMetricReader):
    """Runs `before_collect` ahead of every collection (ticker, force_flush, shutdown)."""

    def __init__(
        self, exporter: Any, interval_millis: float | None, before_collect: Callable[[], None]
    ) -> None:
        # Set before the base class starts its ticker thread.
        self._before_collect = before_collect
        self._collect_lock = threading.Lock()
        super().__init__(exporter, export_interval_millis=interval_millis)

    # collect() is marked final for users; one reader owns the pinning, so it wraps it.
    def collect(self, timeout_millis: float = 10_000) -> None:  # type: ignore[misc]
        with self._collect_lock:
            try:
                self._before_collect()
            except Exception:  # must not end the reader's thread, and every export after it
                log.exception("preparing the OTLP collection failed; exporting the last one")
            super().collect(timeout_millis=timeout_millis)


class OtlpSink:
    """Snapshot sink and self-metrics provider; `start()` begins pushing."""

    def __init__(
        self,
        config: Config,
        *,
        forget_after: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.stats = ExportStats()
        self.forget_after = FORGET_INTERVALS * config.collect_interval
        """Seconds an attribute set unseen is kept: FORGET_INTERVALS export intervals (set
        again by start() from the interval it exports at) unless given."""
        self._forget_given = forget_after is not None
        if forget_after is not None:
            self.forget_after = forget_after
        self._clock = clock
        self._latest: Snapshot | None = None
        self._pinned: dict[str, list[Observation]] = {}
        self._seen: dict[str, dict[AttributeKey, float]] = {}
        self._instruments: dict[str, Any] = {}
        self._provider: MeterProvider | None = None
        self._stopped = False
        self._reader: _SnapshotReader | None = None
        self._quiet = QuietWhileFailing()
        self._warned_internals = False
        self.timeout = DEFAULT_TIMEOUT_SECONDS
        """Seconds one export may take (set from the environment by start())."""

    # --- the sink protocol (poller's worker thread) ----------------------------------

    def update(self, snapshot: Snapshot) -> None:
        self._latest = snapshot

    def self_samples(self) -> tuple[Sample, ...]:
        _, _, rejected = self.stats.read()
        batches = self.stats.samples("otlp", "metrics")
        return (*batches, Sample(_REJECTED, float(rejected), (("sink", "otlp"),)))

    # --- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        for name in SDK_EXPORT_LOGGERS:
            logging.getLogger(name).addFilter(self._quiet)
        self.timeout = export_timeout(os.environ)
        exporter = build_exporter(
            self.config.otlp, os.environ, self.stats, self._quiet, timeout=self.timeout
        )
        # Read here, not by the SDK, so the start line can say it (parse_config checked it).
        from_env = os.environ.get("OTEL_METRIC_EXPORT_INTERVAL", "").strip()
        interval = milliseconds(from_env) if from_env else self.config.collect_interval * 1000.0
        if not self._forget_given:
            self.forget_after = FORGET_INTERVALS * interval / 1000.0
        self._reader = _SnapshotReader(exporter, interval, self._begin_collection)
        self._provider = MeterProvider(
            resource=build_resource(self.config.node_name),
            metric_readers=[self._reader],
            shutdown_on_exit=False,
        )
        meter = self._provider.get_meter(SCOPE, __version__)
        instruments = {}
        for spec in SPECS_LIST:
            create = {
                Kind.GAUGE: meter.create_observable_gauge,
                Kind.COUNTER: meter.create_observable_counter,
                Kind.UPDOWN: meter.create_observable_up_down_counter,
            }[spec.kind]
            instruments[spec.name] = create(
                spec.name,
                callbacks=[self._observer(spec.name)],
                unit=spec.unit,
                description=spec.help,
            )
        self._instruments = instruments  # one swap: the reader's thread is already ticking
        every = f"{interval / 1000.0:g}s" + (" (OTEL_METRIC_EXPORT_INTERVAL)" if from_env else "")
        log.info(
            "pushing OTLP (%s) to %s every %s, export timeout %gs",
            self.config.otlp.protocol,
            self.config.otlp.endpoint,
            every,
            self.timeout,
        )

    def force_flush(self, timeout: float | None = None) -> None:
        """Collect and export now (tests; the reader's thread does this every interval)."""
        if self._provider is not None and not self._stopped:
            self._provider.force_flush(timeout_millis=(timeout or self.timeout + 1.0) * 1000.0)

    def shutdown(self) -> None:
        """One last export of the latest snapshot; returns within the export timeout whatever
        the collector does. An export still in flight (the periodic one, then the last one)
        is left to its daemon thread: the process must exit within its grace period."""
        if self._provider is not None and not self._stopped:
            self._stopped = True
            worker = threading.Thread(
                target=self._provider.shutdown,
                kwargs={"timeout_millis": self.timeout * 1000.0},
                name="otlp-shutdown",
                daemon=True,
            )
            worker.start()
            worker.join(self.timeout)
            if worker.is_alive():
                log.warning(
                    "OTLP: the last export did not finish within %gs; exiting without it",
                    self.timeout,
                )
        for name in SDK_EXPORT_LOGGERS:
            logging.getLogger(name).removeFilter(self._quiet)

    # --- collection (the reader's thread) --------------------------------------------

    def _observer(self, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return self._pinned.get(name, ())

        return observe

    def _begin_collection(self) -> None:
        """Pin one snapshot for every instrument of this collection, then forget old series."""
        pinned: dict[str, list[Observation]] = {}
        snapshot = self._latest
        if snapshot is not None:
            for point in points(snapshot, with_node=False):
                pinned.setdefault(point.spec.name, []).append(
                    Observation(point.value, dict(point.attributes))
                )
        self._pinned = pinned
        self._forget(pinned)

    def _forget(self, pinned: dict[str, list[Observation]]) -> None:
        now = self._clock()
        for name, instrument in self._instruments.items():
            seen = self._seen.setdefault(name, {})
            for observation in pinned.get(name, ()):
                seen[frozenset((observation.attributes or {}).items())] = now
            stale = [key for key, at in seen.items() if now - at > self.forget_after]
            if not stale:
                continue
            for key in stale:
                del seen[key]
            self._drop_sdk_state(instrument, set(seen))

    def _drop_sdk_state(self, instrument: Any, keep: set[AttributeKey]) -> None:
        """Delete the SDK's aggregations of attribute sets not in `keep` (see module doc)."""
        if self._provider is None or self._reader is None:
            return
        try:
            storage = self._provider._measurement_consumer._reader_storages[self._reader]
            streams = storage._instrument_view_instrument_matches.get(instrument, [])
            for stream in streams:
                with stream._lock:
                    table = stream._attributes_aggregation
                    for key, aggregation in list(table.items()):
                        if frozenset((aggregation._attributes or {}).items()) not in keep:
                            del table[key]
        except (AttributeError, KeyError) as exc:
            if not self._warned_internals:
                self._warned_internals = True
                log.warning(
                    "cannot release departed series in this opentelemetry-sdk (%r): OTLP sink "
                    "memory grows with pod churn until restart",
                    exc,
                )
