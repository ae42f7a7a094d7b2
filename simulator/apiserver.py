"""A loopback Kubernetes API server for the simulated node: pods, ResourceSlices and
DeviceTaintRules, list and watch, as kube-apiserver answers them.

The protocol is the one the exporter's watches rely on, as k8s.io/apiserver implements it
(pkg/endpoints/handlers/get.go ListResource, watch.go serveWatch, pkg/storage/cacher), and as
tests/kubeapi_server.py (the pod watch's own test peer) does it:
- list: `fieldSelector=spec.nodeName=X` filters (pods and resourceslices both have that
  selectable field: pkg/registry/core/pod/strategy.go, pkg/registry/resource/resourceslice/
  strategy.go), `limit`/`continue` pages, the list's `metadata.resourceVersion` is the store's;
- `Accept: ...;as=PartialObjectMetadata...` returns metadata-only objects;
- watch: every change after `resourceVersion` that matches, then new ones as they happen
  (`DELETED` carries the last state); `allowWatchBookmarks=true` gets BOOKMARKs; the watch
  ends after `timeoutSeconds`; a version older than the kept history gets one ERROR event with
  a 410 `Status`;
- a wrong bearer token is 401; a kind not served (DeviceTaintRule without
  `--runtime-config=resource.k8s.io/v1beta2=true`, control-plane.md DRA item 8) is 404;
- GET of one pod returns it whole, `status.containerStatuses[].allocatedResourcesStatus`
  included (KEP-4680: `[{"name": "claim:<claim>[/<request>]", "resources": [{"resourceID":
  "<driver>/<pool>/<device>", "health": "Healthy|Unhealthy|Unknown", "message": ...}]}]`, as
  the real 1.36 kubelet reported it, control-plane.md DRA item 5).

Objects keep the shapes of the `resource.k8s.io/v1` API reference
(https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/resource-slice-v1/);
the scenario writes them. Runs its own event loop in a thread: the node's `advance()` (a
worker thread) changes objects with `put()` / `delete()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

TOKEN = "simulated-node-token"
RESOURCES = {
    "pods": ("/api/v1/pods", "Pod", "v1"),
    "resourceslices": (
        "/apis/resource.k8s.io/v1/resourceslices",
        "ResourceSlice",
        "resource.k8s.io/v1",
    ),
    "devicetaintrules": (
        "/apis/resource.k8s.io/v1beta2/devicetaintrules",
        "DeviceTaintRule",
        "resource.k8s.io/v1beta2",
    ),
}


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _metadata_only(obj: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj["metadata"],
    }


def _key(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace', '')}/{meta['name']}"


def _node(obj: dict[str, Any]) -> str | None:
    return (obj.get("spec") or {}).get("nodeName")


class ApiServer:
    def __init__(self, *, serve_taint_rules: bool = True, history: int = 1000) -> None:
        self.serve_taint_rules = serve_taint_rules
        self.keep = history
        self.version = 1000
        self.store: dict[str, dict[str, dict[str, Any]]] = {r: {} for r in RESOURCES}
        self.history: list[tuple[int, str, str, dict[str, Any]]] = []
        """(version, resource, event type, object)."""
        self.oldest = 0
        self.requests: list[tuple[str, str]] = []
        self.max_watch_seconds = 1800.0
        """The server's own cap on a watch (--min-request-timeout); 0 is a proxy cutting
        every watch at once."""
        self.forbidden: set[str] = set()
        """Resources every request of which is answered 403 (RBAC without the rule)."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self._loop = asyncio.new_event_loop()
        self._changed: asyncio.Condition | None = None
        self._runner: web.AppRunner | None = None
        self._closing = 0
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "sim",
                    "clusters": [{"name": "sim", "cluster": {"server": self.url}}],
                    "users": [{"name": "sim", "user": {"token": TOKEN}}],
                    "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "sim"}}],
                }
            )
        )
        return path

    def start(self) -> ApiServer:
        self._thread.start()
        self._call(self._start)
        return self

    def stop(self) -> None:
        self._call(self._stop)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def put(self, resource: str, obj: dict[str, Any]) -> None:
        """Create or replace an object (ADDED or MODIFIED to watchers)."""
        self._call(lambda: self._change(resource, obj, deleted=False))

    def delete(self, resource: str, obj: dict[str, Any]) -> None:
        self._call(lambda: self._change(resource, obj, deleted=True))

    def change_unseen(self, resource: str, obj: dict[str, Any], *, deleted: bool = False) -> None:
        """Change an object, then compact the history and end every watch before any watcher
        hears of it: a watcher resuming from its version gets 410 Gone and must list again
        to notice (the watch cache's window passed, pkg/storage/cacher)."""

        async def gone() -> None:
            await self._change(resource, obj, deleted=deleted, notify=False)
            self.oldest = self.version + 1
            self.history.clear()
            self._closing += 1
            await self._notify()

        self._call(gone)

    def close_watches(self) -> None:
        """End every open watch, as an API server restart or a proxy does."""

        async def close() -> None:
            self._closing += 1
            await self._notify()

        self._call(close)

    def _call(self, fn: Callable[[], Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(fn(), self._loop).result(timeout=10)

    async def _start(self) -> None:
        self._changed = asyncio.Condition()
        app = web.Application()
        for resource, (path, _, _) in RESOURCES.items():
            app.router.add_get(path, self._handler(resource))
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}", self._get_pod)
        app.router.add_get(
            "/apis/{group}/{version}/namespaces/{ns}/{resource}/{name}", self._not_found
        )
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _stop(self) -> None:
        self._closing += 1
        await self._notify()
        assert self._runner is not None
        await self._runner.cleanup()

    async def _change(
        self, resource: str, obj: dict[str, Any], *, deleted: bool, notify: bool = True
    ) -> None:
        self.version += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.version)
        kind = (
            "DELETED" if deleted else "MODIFIED" if _key(obj) in self.store[resource] else "ADDED"
        )
        if deleted:
            self.store[resource].pop(_key(obj), None)
        else:
            self.store[resource][_key(obj)] = obj
        self.history.append((self.version, resource, kind, obj))
        if len(self.history) > self.keep:
            self.oldest = self.history[0][0] + 1
            del self.history[0]
        if notify:
            await self._notify()

    async def _notify(self) -> None:
        assert self._changed is not None
        async with self._changed:
            self._changed.notify_all()

    def _denied(self, request: web.Request) -> web.Response | None:
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response(_status(401, "Unauthorized", "Unauthorized"), status=401)
        return None

    def _handler(self, resource: str) -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.StreamResponse:
            watch = request.query.get("watch") == "true"
            self.requests.append(("watch" if watch else "list", resource))
            denied = self._denied(request)
            if denied is not None:
                return denied
            if resource in self.forbidden:
                message = f"{resource} is forbidden: cannot {'watch' if watch else 'list'} it"
                return web.json_response(_status(403, "Forbidden", message), status=403)
            if resource == "devicetaintrules" and not self.serve_taint_rules:
                return web.json_response(
                    _status(404, "NotFound", "the server could not find the requested resource"),
                    status=404,
                )
            selector = request.query.get("fieldSelector", "")
            node = selector.removeprefix("spec.nodeName=") if selector else None
            metadata_only = "as=PartialObjectMetadata" in request.headers.get("Accept", "")
            shape = _metadata_only if metadata_only else (lambda o: o)

            def matches(obj: dict[str, Any]) -> bool:
                return node is None or _node(obj) == node

            if watch:
                return await self._watch(request, resource, matches, shape)
            return self._list(request, resource, matches, shape, metadata_only)

        return handle

    def _list(
        self,
        request: web.Request,
        resource: str,
        matches: Callable[[dict[str, Any]], bool],
        shape: Callable[[dict[str, Any]], dict[str, Any]],
        metadata_only: bool,
    ) -> web.Response:
        items = [shape(o) for _, o in sorted(self.store[resource].items()) if matches(o)]
        start = int(request.query.get("continue") or 0)
        limit = int(request.query.get("limit") or 0) or len(items) or 1
        more = start + limit < len(items)
        meta = {
            "resourceVersion": str(self.version),
            **({"continue": str(start + limit)} if more else {}),
        }
        _, kind, api_version = RESOURCES[resource]
        kind = "PartialObjectMetadataList" if metadata_only else f"{kind}List"
        return web.json_response(
            {
                "kind": kind,
                "apiVersion": api_version,
                "metadata": meta,
                "items": items[start : start + limit],
            }
        )

    async def _watch(
        self,
        request: web.Request,
        resource: str,
        matches: Callable[[dict[str, Any]], bool],
        shape: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> web.StreamResponse:
        assert self._changed is not None
        closing = self._closing
        since = int(request.query.get("resourceVersion") or self.version)
        timeout = min(float(request.query.get("timeoutSeconds") or 1800), self.max_watch_seconds)
        bookmarks = request.query.get("allowWatchBookmarks") == "true"
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)

        async def send(kind: str, obj: dict[str, Any]) -> None:
            await response.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

        if since < self.oldest:
            await send("ERROR", _status(410, "Expired", f"too old resource version: {since}"))
            return response
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        next_bookmark = loop.time() + 60.0
        _, kind, api_version = RESOURCES[resource]
        while True:
            for version, res, event, obj in [h for h in self.history if h[0] > since]:
                since = version
                if res == resource and matches(obj):
                    await send(event, shape(obj))
            now = loop.time()
            if now >= deadline or self._closing != closing:
                return response
            if bookmarks and now >= next_bookmark:
                await send(
                    "BOOKMARK",
                    {
                        "kind": kind,
                        "apiVersion": api_version,
                        "metadata": {"resourceVersion": str(self.version)},
                    },
                )
                next_bookmark = now + 60.0
            async with self._changed:
                with contextlib.suppress(TimeoutError):
                    wait = min(deadline, next_bookmark) - now
                    await asyncio.wait_for(self._changed.wait(), timeout=max(0.0, wait))

    async def _get_pod(self, request: web.Request) -> web.Response:
        self.requests.append(("get", "pods"))
        denied = self._denied(request)
        if denied is not None:
            return denied
        key = f"{request.match_info['ns']}/{request.match_info['name']}"
        obj = self.store["pods"].get(key)
        if obj is None:
            return web.json_response(
                _status(404, "NotFound", f'pods "{key}" not found'), status=404
            )
        if "as=PartialObjectMetadata" in request.headers.get("Accept", ""):
            return web.json_response(_metadata_only(obj))
        return web.json_response(obj)

    async def _not_found(self, request: web.Request) -> web.Response:
        self.requests.append(("get", request.match_info["resource"]))
        name = request.match_info["name"]
        return web.json_response(_status(404, "NotFound", f"{name} not found"), status=404)
