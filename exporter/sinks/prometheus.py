"""The Prometheus sink: each cycle's body ready before the scrape that asks for it.

At the end of a cycle (`build_due`, called by the poller after the cycle's duration is
taken), the formats that scrapers asked for recently and whose next scrape is due before
the next cycle ends (`cadence.py`) are rendered and compressed in the poller's worker
thread, off the event loop, so the scrape only picks up bytes: it
costs what serving fixed bytes costs. A cycle after which no scrape is due costs no
rendering (at a 1 s interval and a 15 s scrape, 13 cycles in 15); a scrape that comes
before its body is ready (unpredicted, or the first for its format) builds it then, in a
worker thread of the HTTP server, or waits for the build in progress; twenty scrapers of
one cycle cost one build.

Rendering writes values into a cached layout: the series of a cycle are compared with the
last ones (names and label sets); while they are the same, every line up to its value,
`# HELP`/`# TYPE` headers and label escaping included, is reused, and only the values are
formatted (`gofloat.py`, mostly looked up from the last cycle's text).

prometheus_client stays the reference: tests render the same families with it and check
that our bytes are identical in both formats. Its process collector gives the `process_*`
series, read when a body is built: at the end of the cycle for a body built ahead (so they
are as of the end of the last cycle, at most one interval old, as every other series is),
at the scrape for one built then.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from exporter.metrics import MetricSpec, Scope, prometheus_label
from exporter.model import Attributes, Snapshot
from exporter.points import Point, points
from exporter.settings.config import DEFAULTS
from exporter.settings.table import SCHEMAS
from exporter.sinks.cadence import Format, ScrapeCadence
from exporter.sinks.dcgm import dcgm_points
from exporter.sinks.gofloat import Formats, go_floats

TEXT = "text/plain; version=0.0.4; charset=utf-8"  # the classic format Prometheus 2.x expects
OPENMETRICS = openmetrics.CONTENT_TYPE_LATEST
GZIP_LEVEL = 1  # higher levels cost far more CPU for few fewer bytes (docs/design-figures.md)

SeriesKey = tuple[tuple[str, Attributes], ...]


def _escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _labels(attributes: Attributes) -> str:
    """`{a="x",b="y"}` sorted by label name, as prometheus_client writes it."""
    if not attributes:
        return ""
    labels = {prometheus_label(k): v for k, v in attributes}
    inner = ",".join(f'{k}="{_escape_value(v)}"' for k, v in sorted(labels.items()))
    return "{" + inner + "}"


def _headers(spec: MetricSpec, *, om: bool) -> str:
    typ = spec.prom_type(openmetrics=om)
    if om:
        name = spec.prom_family
        doc = _escape_value(spec.help)
    else:
        name = spec.prom_name
        doc = spec.help.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {doc}\n# TYPE {name} {typ}\n"


@dataclass(frozen=True, slots=True)
class Layout:
    """Everything of one set of series but the values: rebuilt only when the set changes."""

    key: SeriesKey
    text: tuple[str, ...]
    """Two slots per series: its line up to the value (the family's headers before the
    first series of a family, the last line's newline before all but the first), and the
    value's slot, written per cycle."""
    openmetrics: tuple[str, ...]

    lines: dict[tuple[str, Attributes], str]
    """Each series' line up to its value, after a newline (`"\\nname{...} "`), by its
    element of `key`, for the next build to reuse: a pod coming or going changes a few."""

    @classmethod
    def build(
        cls,
        pts: Sequence[Point],
        key: SeriesKey,
        reuse: dict[tuple[str, Attributes], str] | None = None,
    ) -> Layout:
        """The layout of `pts` (whose series are `key`); lines already made in `reuse` (the
        last layout's) are not made again, nor a label set formatted twice in one build."""
        text: list[str] = []
        om: list[str] = []
        lines: dict[tuple[str, Attributes], str] = {}
        known = reuse or {}
        labels: dict[Attributes, str] = {}
        previous: MetricSpec | None = None
        for point, series in zip(pts, key, strict=True):
            line = known.get(series)
            if line is None:
                attrs = series[1]
                formatted = labels.get(attrs)
                if formatted is None:
                    formatted = labels[attrs] = _labels(attrs)
                line = f"\n{point.spec.prom_name}{formatted} "
            lines[series] = line
            spec = point.spec
            if spec is not previous:
                newline = "\n" if text else ""
                text += (newline + _headers(spec, om=False) + line[1:], "")
                om += (newline + _headers(spec, om=True) + line[1:], "")
                previous = spec
            else:
                text += (line, "")
                om += (line, "")
        return cls(key, tuple(text), tuple(om), lines)


def series_key(pts: Sequence[Point]) -> SeriesKey:
    return tuple((p.spec.name, p.attributes) for p in pts)


class Rendered:
    """One cycle's series, formatted and compressed on first use (thread-safe)."""

    def __init__(
        self,
        layout: Layout,
        values: Sequence[float],
        *,
        process: Collector | None = None,
        lookup: list[Formats] | None = None,
    ) -> None:
        self.layout = layout
        self.values = tuple(values)
        self.series = len(self.values)
        self._process = process
        self._lock = threading.Lock()
        self._bodies: dict[Format, bytes] = {}
        self._formatted: list[str] | None = None
        self._lookup = lookup if lookup is not None else [{}]
        """The last formatted cycle's value texts (one slot, shared with the next cycles)."""

    @property
    def text(self) -> bytes:
        return self.body(openmetrics=False, gzipped=False)[0]

    @property
    def text_gzip(self) -> bytes:
        return self.body(openmetrics=False, gzipped=True)[0]

    @property
    def openmetrics(self) -> bytes:
        return self.body(openmetrics=True, gzipped=False)[0]

    @property
    def openmetrics_gzip(self) -> bytes:
        return self.body(openmetrics=True, gzipped=True)[0]

    def cached(self, *, openmetrics: bool, gzipped: bool) -> bool:
        return (openmetrics, gzipped) in self._bodies

    def body(self, *, openmetrics: bool, gzipped: bool) -> tuple[bytes, str]:
        content_type = OPENMETRICS if openmetrics else TEXT
        key = (openmetrics, gzipped)
        cached = self._bodies.get(key)
        if cached is not None:
            return cached, content_type
        with self._lock:
            if key not in self._bodies:
                if gzipped:
                    plain = self._plain(openmetrics)
                    self._bodies[key] = gzip.compress(plain, compresslevel=GZIP_LEVEL, mtime=0)
                else:
                    self._plain(openmetrics)
            return self._bodies[key], content_type

    def _plain(self, om: bool) -> bytes:
        """Build (under the lock) or reuse the uncompressed body of one format."""
        key = (om, False)
        if key in self._bodies:
            return self._bodies[key]
        if self._formatted is None:
            self._formatted, self._lookup[0] = go_floats(self.values, self._lookup[0])
        parts = list(self.layout.openmetrics if om else self.layout.text)
        parts[1::2] = self._formatted
        if parts:
            parts.append("\n")
        if self._process is not None:
            parts.append(_process_section(self._process, om))
        if om:
            parts.append("# EOF\n")
        body = "".join(parts).encode()
        self._bodies[key] = body
        return body


def _process_section(process: Collector, om: bool) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(process)
    if not om:
        return generate_latest(registry).decode()
    out: bytes = openmetrics.generate_latest(registry)  # type: ignore[no-untyped-call]
    return out.decode().removesuffix("# EOF\n")


def new_process_collector() -> Collector:
    """`process_*` (CPU seconds, resident memory, open fds, start time), registered nowhere."""
    return ProcessCollector(registry=None)


def schema_points(
    snapshot: Snapshot, schema: Sequence[str] = DEFAULTS.metrics_schema
) -> list[Point]:
    """The points of the schemas asked for (`--metrics.schema`). `dcgm` alone keeps the
    exporter's own health series (alerts on the exporter need them in every schema)."""
    native = list(points(snapshot))
    if "dcgm" not in schema:
        return native
    if "native" not in schema:
        native = [p for p in native if p.spec.scope is Scope.EXPORTER]
    pts = native + list(dcgm_points(snapshot))
    return [
        p._replace(value=float(len(pts))) if p.spec.name == "kube_device_exporter.series" else p
        for p in pts
    ]


class Renderer:
    """Keeps the last layout; `render` is called once per cycle from one thread."""

    def __init__(
        self, *, process: Collector | None = None, schema: Sequence[str] = DEFAULTS.metrics_schema
    ) -> None:
        unknown = set(schema) - set(SCHEMAS)
        if unknown or not schema:
            raise ValueError(f"unknown metrics schema {sorted(unknown)}")
        self._layout: Layout | None = None
        self._process = process
        self._lookup: list[Formats] = [{}]
        self.schema = tuple(schema)

    def render(self, snapshot: Snapshot) -> Rendered:
        pts = schema_points(snapshot, self.schema)
        key = series_key(pts)
        layout = self._layout
        if layout is None or layout.key != key:
            reuse = layout.lines if layout is not None else None
            layout = self._layout = Layout.build(pts, key, reuse)
        values = [float(p.value) for p in pts]
        return Rendered(layout, values, process=self._process, lookup=self._lookup)


def render(snapshot: Snapshot, schema: Sequence[str] = DEFAULTS.metrics_schema) -> Rendered:
    """One snapshot rendered without history (tests, tools): no `process_*` series."""
    return Renderer(schema=schema).render(snapshot)


# --- the reference ------------------------------------------------------------------------


def families(pts: Iterable[Point], *, om: bool = False) -> Iterator[Metric]:
    """Points (already grouped by metric) -> prometheus_client metric families."""
    current: Metric | None = None
    current_name = ""
    for point in pts:
        spec = point.spec
        if spec.name != current_name:
            if current is not None:
                yield current
            current = Metric(spec.prom_family, spec.help, spec.prom_type(openmetrics=om))
            current_name = spec.name
        assert current is not None
        labels = {prometheus_label(k): v for k, v in point.attributes}
        current.add_sample(spec.prom_name, labels, point.value)
    if current is not None:
        yield current


class _Families(Collector):
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self.metrics


def reference(
    snapshot: Snapshot, schema: Sequence[str] = DEFAULTS.metrics_schema
) -> tuple[bytes, bytes]:
    """(text, OpenMetrics) of the snapshot as prometheus_client renders it (tests, bench)."""
    pts = schema_points(snapshot, schema)
    text, om = CollectorRegistry(auto_describe=False), CollectorRegistry(auto_describe=False)
    text.register(_Families(list(families(pts))))
    om.register(_Families(list(families(pts, om=True))))
    om_body: bytes = openmetrics.generate_latest(om)  # type: ignore[no-untyped-call]
    return generate_latest(text), om_body


class PrometheusSink:
    """Holds the latest snapshot and its bodies, built ahead of the scrapes due (see above).

    `update` and `build_due` run in the poller's worker thread, one after the other;
    `rendered` runs in whatever thread asks (the HTTP handler asks from a worker thread
    when `cached` is false), waiting for a build of the same snapshot in progress.

    `ready_body` is what a scrape takes without waiting for anything: the latest snapshot's
    body of a format built ahead, or, from `update` until `build_due` has built this cycle's,
    the last cycle's body of a format due now (its values one cycle older, as a scrape a few
    milliseconds earlier would have had them). A scrape that came while the cycle built its
    body used to wait for that build; only the cycle right after the one a body was built
    for may stand in, so a build that fails shows at the next scrape but one."""

    def __init__(
        self,
        *,
        process_metrics: bool = True,
        schema: Sequence[str] = DEFAULTS.metrics_schema,
        cadence: ScrapeCadence | None = None,
    ) -> None:
        process = new_process_collector() if process_metrics else None
        self.renderer = Renderer(process=process, schema=schema)
        self.cadence = cadence or ScrapeCadence()
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._rendered: Rendered | None = None
        self._due: list[Format] = []
        self._ready: dict[Format, tuple[bytes, str]] = {}
        """Bodies a scrape takes as they are (`ready_body`); replaced whole, never changed."""
        self._ready_for: Snapshot | None = None
        """The snapshot `_ready` was built for; None while it stands in for the latest."""

    def update(self, snapshot: Snapshot) -> None:
        with self._lock:
            due = self.cadence.cycle_done()
            built = self._ready if self._ready_for is self._snapshot else {}
            self._ready = {fmt: body for fmt, body in built.items() if fmt in due}
            self._ready_for = None
            self._snapshot, self._rendered = snapshot, None
            self._due = due

    def asked(self, *, openmetrics: bool, gzipped: bool) -> None:
        """A scrape asked for this format now (the HTTP handler says so)."""
        self.cadence.asked((openmetrics, gzipped))

    def build_due(self) -> None:
        """The bodies of the formats whose scrape is due before the next cycle ends, for
        the latest snapshot (the poller calls this at the end of the cycle, in its worker
        thread: in a thread of its own the build costs no less CPU and more RSS, glibc's
        malloc giving that thread an arena of its own; docs/design-figures.md)."""
        with self._lock:
            due, self._due = self._due, []
            snapshot = self._snapshot
            if not due or snapshot is None:
                return
            if self._rendered is None:
                self._rendered = self.renderer.render(snapshot)
            rendered = self._rendered
        ready = {(om, gz): rendered.body(openmetrics=om, gzipped=gz) for om, gz in due}
        with self._lock:
            if self._snapshot is snapshot:  # (no newer snapshot came in the meantime)
                self._ready, self._ready_for = ready, snapshot

    def ready_body(self, *, openmetrics: bool, gzipped: bool) -> tuple[bytes, str] | None:
        """(body, content type) a scrape may send at once, or None (see the class)."""
        return self._ready.get((openmetrics, gzipped))

    @property
    def ready(self) -> bool:
        return self._snapshot is not None

    @property
    def cached(self) -> bool:
        """True when `rendered` costs nothing (no snapshot yet, or rendered already)."""
        return self._snapshot is None or self._rendered is not None

    @property
    def rendered(self) -> Rendered | None:
        """The latest snapshot rendered (once per snapshot); None before the first."""
        with self._lock:
            if self._rendered is None and self._snapshot is not None:
                self._rendered = self.renderer.render(self._snapshot)
            return self._rendered
