"""The HTTP app (aiohttp): /metrics, /healthz, /readyz, the landing page and its JSON feed.

Every handler returns bytes prepared once per cycle; none touches a device or the kubelet.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aiohttp import web

from exporter import __version__
from exporter.checks import snapshot_findings
from exporter.ids import ResourceMatcher
from exporter.model import JoinedDevice, Snapshot
from exporter.points import device_attributes
from exporter.sinks.prometheus import PrometheusSink
from exporter.web import streaming
from exporter.web.landing import render_page

PROMETHEUS = web.AppKey("prometheus", PrometheusSink)
RESTART_REQUIRED: web.AppKey[Callable[[], Mapping[str, str]]] = web.AppKey("restart_required")


def _summary(snapshot: Snapshot, matcher: ResourceMatcher | None = None) -> dict[str, Any]:
    """What the landing page shows: each device (children right after their parent), who
    holds it, its load, and the doctor's checks from this cycle."""
    by_device: dict[str, list[dict[str, str]]] = {}
    for alloc in snapshot.allocations:
        by_device.setdefault(alloc.device_id, []).append(
            {
                "namespace": alloc.holder.namespace,
                "pod": alloc.holder.pod,
                "container": alloc.holder.container,
                "resource": alloc.resource_name,
                "device_id": alloc.raw_id,
                "replica": alloc.replica,
                "shared": "yes" if alloc.shared else "",
            }
        )
    unrequested: dict[str, list[dict[str, Any]]] = {}
    for use in snapshot.container_usage:  # a pod's processes on a device it did not request
        if use.owner is not None and not use.requested:
            unrequested.setdefault(use.device_id, []).append(
                {
                    "namespace": use.owner.namespace,
                    "pod": use.owner.pod,
                    "container": use.owner.container,
                    "utilization": use.utilization,
                    "memory": use.memory_bytes,
                }
            )
    devices = []
    for joined, depth in _tree(snapshot.devices):
        device = joined.reading.device
        attributes = dict(device_attributes(joined))
        devices.append(
            {
                "id": device.id,
                "type": device.type,
                "vendor": device.vendor,
                "model": device.model,
                "parent": device.parent,
                "depth": depth,
                "index": attributes.get("hw.gpu.index") or attributes.get("hw.gpu.partition", ""),
                "attributes": attributes,
                "holders": by_device.get(device.id, []),
                "unrequested": unrequested.get(device.id, []),
                "allocatable": joined.allocatable,
                "resource": joined.resource,
                "not_allocatable": bool(joined.resource) and not joined.allocatable,
                **_values(joined),
            }
        )
    _mark_partitioned(devices)
    findings = snapshot_findings(snapshot, matcher or ResourceMatcher())
    return {
        "node": snapshot.node,
        "timestamp": snapshot.timestamp,
        "version": __version__,
        "devices": devices,
        "unresolved": by_device.get("", []),
        "sources": [
            {"name": h.name, "success": h.success, "error": h.error, "absent": h.absent}
            for h in snapshot.sources
        ],
        "kubelet": {
            "connected": snapshot.podresources.connected,
            "api_version": snapshot.podresources.api_version,
        },
        "checks": [
            {
                "status": f.status,
                "subject": f.subject,
                "found": f.found,
                "cause": f.cause,
                "fix": f.fix,
            }
            for f in findings
        ],
    }


def _mark_partitioned(devices: list[dict[str, Any]]) -> None:
    """A GPU shown with its MIG slices or partitions under it: `partitions` (how many) and
    `partitions_held`. Its own row must not read "free" while pods hold its parts (an MI300X
    in CPX mode can still be listed whole by the plugin, at 87 % load from its partitions)."""
    for d in devices:
        parts = [c for c in devices if c["parent"] == d["id"] and c["depth"] == d["depth"] + 1]
        d["partitions"] = len(parts) if d["type"] == "gpu" else 0
        d["partitions_held"] = sum(1 for c in parts if c["holders"]) if d["partitions"] else 0


def _tree(devices: Sequence[JoinedDevice]) -> list[tuple[JoinedDevice, int]]:
    """Devices in snapshot order, each followed by its children (a MIG slice under its GPU,
    an MI300 partition under its card). A parent that is no row here (an HCA's PCI function)
    makes no nesting: the row stands on its own rather than under an unrelated device."""
    ids = {d.reading.device.id for d in devices}
    children: dict[str, list[JoinedDevice]] = {}
    roots = []
    for joined in devices:
        parent = joined.reading.device.parent
        if parent and parent in ids and parent != joined.reading.device.id:
            children.setdefault(parent, []).append(joined)
        else:
            roots.append(joined)
    out: list[tuple[JoinedDevice, int]] = []
    seen: set[str] = set()

    def visit(joined: JoinedDevice, depth: int) -> None:
        if joined.reading.device.id in seen:
            return
        seen.add(joined.reading.device.id)
        out.append((joined, depth))
        for child in children.get(joined.reading.device.id, []):
            visit(child, depth + 1)

    for root in roots:
        visit(root, 0)
    return out


def _values(joined: JoinedDevice) -> dict[str, float]:
    """The few numbers a row shows; network rows sum their byte counters per direction."""
    values: dict[str, float] = {}
    for s in joined.reading.samples:
        attrs = dict(s.attributes)
        if s.metric == "hw.gpu.utilization" and attrs.get("hw.gpu.task", "general") == "general":
            values["utilization"] = s.value
        elif s.metric in ("hw.gpu.memory.usage", "hw.gpu.memory.limit", "hw.power"):
            values[s.metric.rsplit(".", 1)[-1]] = s.value
        elif s.metric == "hw.status" and s.value == 1:
            values["state"] = {"ok": 0, "degraded": 1, "failed": 2}.get(
                attrs.get("hw.state", ""), 0
            )
        elif s.metric == "hw.network.up":
            values["link_up"] = s.value
        elif s.metric == "hw.network.bandwidth.limit":
            values["link_speed"] = s.value
        elif s.metric == "hw.network.io":
            key = f"{attrs.get('network.io.direction', 'receive')}_bytes"
            values[key] = values.get(key, 0.0) + s.value
    return values


class _Cycle:
    """One snapshot, and its summary, JSON and page, each built on the first request."""

    def __init__(self, snapshot: Snapshot, matcher: ResourceMatcher | None) -> None:
        self.snapshot = snapshot
        self.matcher = matcher
        self._summary: dict[str, Any] | None = None
        self._body: bytes | None = None
        self._page: bytes | None = None

    def summary(self) -> dict[str, Any]:
        if self._summary is None:  # two racing requests build the same thing; no lock needed
            self._summary = _summary(self.snapshot, self.matcher)
        return self._summary

    def body(self) -> bytes:
        if self._body is None:
            self._body = json.dumps(self.summary(), separators=(",", ":")).encode()
        return self._body

    def page(self) -> bytes:
        if self._page is None:
            self._page = render_page(self.summary())
        return self._page


class DevicesView:
    """The landing page (HTML, rendered on the server: curl and a screenshot taken at load
    see the table) and its JSON feed for the latest cycle (a sink); each is built on the
    first request after a cycle, not in it."""

    def __init__(self, matcher: ResourceMatcher | None = None) -> None:
        self.matcher = matcher
        self._cycle: _Cycle | None = None
        self._empty_page = render_page(None)

    def update(self, snapshot: Snapshot) -> None:
        self._cycle = _Cycle(snapshot, self.matcher)

    @property
    def ready(self) -> bool:
        return self._cycle is not None

    @property
    def cached(self) -> bool:
        """True when `body` and `page` cost nothing: no cycle yet, or both already built."""
        cycle = self._cycle
        return cycle is None or (cycle._body is not None and cycle._page is not None)

    @property
    def body(self) -> bytes | None:
        cycle = self._cycle
        return None if cycle is None else cycle.body()

    @property
    def page(self) -> bytes:
        cycle = self._cycle
        return self._empty_page if cycle is None else cycle.page()


DEVICES: web.AppKey[DevicesView] = web.AppKey("devices")


def _wants_openmetrics(accept: str) -> bool:
    return "application/openmetrics-text" in accept


async def metrics(request: web.Request) -> web.StreamResponse:
    sink = request.app[PROMETHEUS]
    gzipped = "gzip" in request.headers.get("Accept-Encoding", "")
    om = _wants_openmetrics(request.headers.get("Accept", ""))
    sink.asked(openmetrics=om, gzipped=gzipped)  # so the next cycles build this one ahead
    ready = sink.ready_body(openmetrics=om, gzipped=gzipped)  # built at the end of a cycle
    if ready is not None:
        body, content_type = ready
    else:
        # Not built ahead: built here, off the event loop.
        rendered = sink.rendered if sink.cached else await asyncio.to_thread(lambda: sink.rendered)
        if rendered is None:
            return web.Response(status=503, text="first collection cycle not finished yet\n")
        if rendered.cached(openmetrics=om, gzipped=gzipped):
            body, content_type = rendered.body(openmetrics=om, gzipped=gzipped)
        else:  # formatted, or the build in progress waited for, off the event loop
            body, content_type = await asyncio.to_thread(
                rendered.body, openmetrics=om, gzipped=gzipped
            )
    headers = {"Content-Type": content_type}
    if gzipped:
        headers["Content-Encoding"] = "gzip"
    return await streaming.send(request, body, headers)  # no copy per client


async def healthz(request: web.Request) -> web.Response:
    """Liveness: fails only when a source says a new process is the only fix (a driver
    upgraded under the NVML library this process mapped), so the kubelet restarts us."""
    reasons = request.app[RESTART_REQUIRED]()
    if reasons:
        lines = "".join(f"{name}: {why}\n" for name, why in sorted(reasons.items()))
        return web.Response(status=503, text="restart required\n" + lines)
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.Response:
    if not request.app[PROMETHEUS].ready and not request.app[DEVICES].ready:
        return web.Response(status=503, text="first collection cycle not finished yet\n")
    return web.Response(text="ready\n")


async def landing(request: web.Request) -> web.Response:
    view = request.app[DEVICES]
    page = view.page if view.cached else await asyncio.to_thread(lambda: view.page)
    return web.Response(body=page, content_type="text/html", charset="utf-8")


async def devices(request: web.Request) -> web.StreamResponse:
    view = request.app[DEVICES]
    # The first request of a cycle builds the JSON (a big node's takes milliseconds):
    # in a worker thread, so other requests are not held up behind it.
    body = view.body if view.cached else await asyncio.to_thread(lambda: view.body)
    if body is None:
        return web.json_response({"devices": [], "pending": True, "now": time.time()}, status=503)
    return await streaming.send(request, body, {"Content-Type": "application/json"})


def make_app(
    prometheus: PrometheusSink,
    view: DevicesView,
    restart_required: Callable[[], Mapping[str, str]] = dict,
) -> web.Application:
    app = web.Application()
    app[PROMETHEUS] = prometheus
    app[DEVICES] = view
    app[RESTART_REQUIRED] = restart_required
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/api/devices", devices)
    app.router.add_get("/", landing)
    return app
