"""The Prometheus sink: the snapshot rendered once per cycle, served as bytes.

Families are built fresh from the snapshot each cycle (client_python's custom-collector
pattern): no long-lived gauges whose pod labels would need `.remove()` bookkeeping, so a
deleted pod's series are gone from the very next cycle. Both exposition formats and
their gzip forms are prepared in the render thread; a scrape only picks bytes.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector

from exporter.metrics import Kind, prometheus_label
from exporter.model import Snapshot
from exporter.points import Point, points

TEXT = "text/plain; version=0.0.4; charset=utf-8"  # the classic format Prometheus 2.x expects
OPENMETRICS = openmetrics.CONTENT_TYPE_LATEST


@dataclass(frozen=True, slots=True)
class Rendered:
    text: bytes
    text_gzip: bytes
    openmetrics: bytes
    openmetrics_gzip: bytes
    series: int

    def body(self, *, openmetrics: bool, gzipped: bool) -> tuple[bytes, str]:
        if openmetrics:
            return (self.openmetrics_gzip if gzipped else self.openmetrics), OPENMETRICS
        return (self.text_gzip if gzipped else self.text), TEXT


def families(pts: Iterable[Point]) -> Iterator[Metric]:
    """Points (already grouped by metric) -> prometheus_client metric families."""
    current: Metric | None = None
    current_name = ""
    for point in pts:
        spec = point.spec
        if spec.name != current_name:
            if current is not None:
                yield current
            typ = "counter" if spec.kind is Kind.COUNTER else "gauge"
            current = Metric(spec.prom_family, spec.help, typ)
            current_name = spec.name
        assert current is not None
        labels = {prometheus_label(k): v for k, v in point.attributes}
        current.add_sample(spec.prom_name, labels, point.value)
    if current is not None:
        yield current


class _Families(Collector):
    """Families built once per cycle, rendered in both exposition formats."""

    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self.metrics


def render(snapshot: Snapshot) -> Rendered:
    pts = list(points(snapshot))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families(pts))))
    text = generate_latest(registry)
    om = openmetrics.generate_latest(registry)  # type: ignore[no-untyped-call]
    return Rendered(
        text=text,
        text_gzip=gzip.compress(text, compresslevel=6, mtime=0),
        openmetrics=om,
        openmetrics_gzip=gzip.compress(om, compresslevel=6, mtime=0),
        series=len(pts),
    )


class PrometheusSink:
    """Holds the latest rendering; `update` runs in the poller's worker thread."""

    def __init__(self) -> None:
        self.rendered: Rendered | None = None

    def update(self, snapshot: Snapshot) -> None:
        self.rendered = render(snapshot)
