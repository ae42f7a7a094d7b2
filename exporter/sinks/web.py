"""The HTTP app (aiohttp): /metrics, /healthz, /readyz, the landing page and its JSON feed.

Every handler returns bytes prepared once per cycle; none touches a device or the kubelet.
"""

from __future__ import annotations

import asyncio
import json
import time
from importlib import resources
from typing import Any

from aiohttp import web

from exporter import __version__
from exporter.model import Snapshot
from exporter.points import device_attributes
from exporter.sinks.prometheus import PrometheusSink

PROMETHEUS = web.AppKey("prometheus", PrometheusSink)

_LANDING = (resources.files("exporter.sinks") / "static" / "index.html").read_bytes()


def _summary(snapshot: Snapshot) -> dict[str, Any]:
    """What the landing page shows: each device, who holds it, utilization and memory."""
    by_device: dict[str, list[dict[str, str]]] = {}
    for alloc in snapshot.allocations:
        by_device.setdefault(alloc.device_id, []).append(
            {
                "namespace": alloc.holder.namespace,
                "pod": alloc.holder.pod,
                "container": alloc.holder.container,
                "resource": alloc.resource_name,
                "device_id": alloc.raw_id,
                "shared": "yes" if alloc.shared else "",
            }
        )
    devices = []
    for joined in snapshot.devices:
        device = joined.reading.device
        values: dict[str, float] = {}
        for s in joined.reading.samples:
            attrs = dict(s.attributes)
            if (
                s.metric == "hw.gpu.utilization"
                and attrs.get("hw.gpu.task", "general") == "general"
            ):
                values["utilization"] = s.value
            elif s.metric in ("hw.gpu.memory.usage", "hw.gpu.memory.limit", "hw.power"):
                values[s.metric.rsplit(".", 1)[-1]] = s.value
            elif s.metric == "hw.status" and s.value == 1:
                values["state"] = {"ok": 0, "degraded": 1, "failed": 2}.get(
                    attrs.get("hw.state", ""), 0
                )
        devices.append(
            {
                "id": device.id,
                "type": device.type,
                "vendor": device.vendor,
                "model": device.model,
                "parent": device.parent,
                "attributes": dict(device_attributes(joined)),
                "holders": by_device.get(device.id, []),
                "allocatable": joined.allocatable,
                **values,
            }
        )
    return {
        "node": snapshot.node,
        "timestamp": snapshot.timestamp,
        "version": __version__,
        "devices": devices,
        "unresolved": by_device.get("", []),
        "sources": [
            {"name": h.name, "success": h.success, "error": h.error} for h in snapshot.sources
        ],
        "kubelet": {
            "connected": snapshot.podresources.connected,
            "api_version": snapshot.podresources.api_version,
        },
    }


class _Cycle:
    """One snapshot and its JSON, built on the first request for it."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self._body: bytes | None = None

    @property
    def built(self) -> bool:
        return self._body is not None

    def body(self) -> bytes:
        if self._body is None:  # two racing requests build the same bytes; no lock needed
            self._body = json.dumps(_summary(self.snapshot), separators=(",", ":")).encode()
        return self._body


class DevicesView:
    """Holds the landing page's JSON for the latest cycle (a sink); built when asked."""

    def __init__(self) -> None:
        self._cycle: _Cycle | None = None

    def update(self, snapshot: Snapshot) -> None:
        self._cycle = _Cycle(snapshot)

    @property
    def ready(self) -> bool:
        return self._cycle is not None

    @property
    def cached(self) -> bool:
        """True when `body` costs nothing: no cycle yet, or its JSON already built."""
        cycle = self._cycle
        return cycle is None or cycle.built

    @property
    def body(self) -> bytes | None:
        cycle = self._cycle
        return None if cycle is None else cycle.body()


DEVICES: web.AppKey[DevicesView] = web.AppKey("devices")


def _wants_openmetrics(accept: str) -> bool:
    return "application/openmetrics-text" in accept


async def metrics(request: web.Request) -> web.Response:
    sink = request.app[PROMETHEUS]
    # The first request after a cycle renders it: off the event loop.
    rendered = sink.rendered if sink.cached else await asyncio.to_thread(lambda: sink.rendered)
    if rendered is None:
        return web.Response(status=503, text="first collection cycle not finished yet\n")
    gzipped = "gzip" in request.headers.get("Accept-Encoding", "")
    om = _wants_openmetrics(request.headers.get("Accept", ""))
    if rendered.cached(openmetrics=om, gzipped=gzipped):
        body, content_type = rendered.body(openmetrics=om, gzipped=gzipped)
    else:  # the first request of a cycle formats (and compresses) off the event loop
        body, content_type = await asyncio.to_thread(rendered.body, openmetrics=om, gzipped=gzipped)
    response = web.Response(body=body, headers={"Content-Type": content_type})
    if gzipped:
        response.headers["Content-Encoding"] = "gzip"
    return response


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.Response:
    if not request.app[PROMETHEUS].ready and not request.app[DEVICES].ready:
        return web.Response(status=503, text="first collection cycle not finished yet\n")
    return web.Response(text="ready\n")


async def landing(request: web.Request) -> web.Response:
    return web.Response(body=_LANDING, content_type="text/html", charset="utf-8")


async def devices(request: web.Request) -> web.Response:
    view = request.app[DEVICES]
    # The first request of a cycle builds the JSON (a big node's takes milliseconds):
    # in a worker thread, so other requests are not held up behind it.
    body = view.body if view.cached else await asyncio.to_thread(lambda: view.body)
    if body is None:
        return web.json_response({"devices": [], "pending": True, "now": time.time()}, status=503)
    return web.Response(body=body, content_type="application/json")


def make_app(prometheus: PrometheusSink, view: DevicesView) -> web.Application:
    app = web.Application()
    app[PROMETHEUS] = prometheus
    app[DEVICES] = view
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/api/devices", devices)
    app.router.add_get("/", landing)
    return app
