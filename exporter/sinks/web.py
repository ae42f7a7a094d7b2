"""The HTTP app (aiohttp): /metrics, /healthz, /readyz, the landing page and its JSON feed.

Every handler returns bytes prepared once per cycle; none touches a device or the kubelet.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aiohttp import web

from exporter import __version__
from exporter.checks import snapshot_findings
from exporter.join import ResourceMatcher
from exporter.model import JoinedDevice, Snapshot
from exporter.points import device_attributes
from exporter.sinks.landing import render_page
from exporter.sinks.prometheus import PrometheusSink

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
                "allocatable": joined.allocatable,
                "resource": joined.resource,
                "not_allocatable": bool(joined.resource) and not joined.allocatable,
                **_values(joined),
            }
        )
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


class DevicesView:
    """Holds the landing page (HTML, rendered on the server) and its JSON feed, both rebuilt
    once per cycle (a sink): curl and a screenshot taken at load see the table."""

    def __init__(self, matcher: ResourceMatcher | None = None) -> None:
        self.matcher = matcher
        self.body: bytes | None = None
        self.page: bytes = render_page(None)

    def update(self, snapshot: Snapshot) -> None:
        summary = _summary(snapshot, self.matcher)
        self.body = json.dumps(summary, separators=(",", ":")).encode()
        self.page = render_page(summary)


DEVICES: web.AppKey[DevicesView] = web.AppKey("devices")


def _wants_openmetrics(accept: str) -> bool:
    return "application/openmetrics-text" in accept


async def metrics(request: web.Request) -> web.Response:
    rendered = request.app[PROMETHEUS].rendered
    if rendered is None:
        return web.Response(status=503, text="first collection cycle not finished yet\n")
    gzipped = "gzip" in request.headers.get("Accept-Encoding", "")
    body, content_type = rendered.body(
        openmetrics=_wants_openmetrics(request.headers.get("Accept", "")), gzipped=gzipped
    )
    response = web.Response(body=body, headers={"Content-Type": content_type})
    if gzipped:
        response.headers["Content-Encoding"] = "gzip"
    return response


async def healthz(request: web.Request) -> web.Response:
    """Liveness: fails only when a source says a new process is the only fix (a driver
    upgraded under the NVML library this process mapped), so the kubelet restarts us."""
    reasons = request.app[RESTART_REQUIRED]()
    if reasons:
        lines = "".join(f"{name}: {why}\n" for name, why in sorted(reasons.items()))
        return web.Response(status=503, text="restart required\n" + lines)
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.Response:
    if request.app[PROMETHEUS].rendered is None and request.app[DEVICES].body is None:
        return web.Response(status=503, text="first collection cycle not finished yet\n")
    return web.Response(text="ready\n")


async def landing(request: web.Request) -> web.Response:
    return web.Response(body=request.app[DEVICES].page, content_type="text/html", charset="utf-8")


async def devices(request: web.Request) -> web.Response:
    body = request.app[DEVICES].body
    if body is None:
        return web.json_response({"devices": [], "pending": True, "now": time.time()}, status=503)
    return web.Response(body=body, content_type="application/json")


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
