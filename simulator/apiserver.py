"""A loopback Kubernetes API server for the simulated node: pods, ResourceSlices and
DeviceTaintRules, list and watch, as kube-apiserver answers them.

The protocol is the one the exporter's watches rely on, as k8s.io/apiserver implements it
(pkg/endpoints/handlers/get.go ListResource, watch.go serveWatch, pkg/storage/cacher), and as
tests/kubeapi_server.py (the pod watch's own test peer) does it, on the same server plumbing
(loopback.py):
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
import copy
import socket
from collections.abc import Callable
from typing import Any

from aiohttp import web

from simulator.loopback import LoopbackServer, list_page, metadata_only, status

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


def _key(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace', '')}/{meta['name']}"


def _node(obj: dict[str, Any]) -> str | None:
    return (obj.get("spec") or {}).get("nodeName")


class ApiServer(LoopbackServer):
    context = "sim"

    def __init__(self, *, serve_taint_rules: bool = True, history: int = 1000) -> None:
        self.serve_taint_rules = serve_taint_rules
        self.keep = history
        self.version = 1000
        self.store: dict[str, dict[str, dict[str, Any]]] = {r: {} for r in RESOURCES}
        self.history: list[tuple[int, str, str, dict[str, Any]]] = []
        """(version, resource, event type, object)."""
        self.oldest = 0
        self.requests: list[tuple[str, str]] = []
        self.forbidden: set[str] = set()
        """Resources every request of which is answered 403 (RBAC without the rule)."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            super().__init__(int(s.getsockname()[1]), TOKEN)

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
            await self._close_watches()

        self._call(gone)

    def _routes(self, app: web.Application) -> None:
        for resource, (path, _, _) in RESOURCES.items():
            app.router.add_get(path, self._handler(resource))
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}", self._get_pod)
        app.router.add_get(
            "/apis/{group}/{version}/namespaces/{ns}/{resource}/{name}", self._not_found
        )

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

    def _handler(self, resource: str) -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.StreamResponse:
            watch = request.query.get("watch") == "true"
            self.requests.append(("watch" if watch else "list", resource))
            denied = self._unauthorized(request)
            if denied is not None:
                return denied
            if resource in self.forbidden:
                message = f"{resource} is forbidden: cannot {'watch' if watch else 'list'} it"
                return web.json_response(status(403, "Forbidden", message), status=403)
            if resource == "devicetaintrules" and not self.serve_taint_rules:
                return web.json_response(
                    status(404, "NotFound", "the server could not find the requested resource"),
                    status=404,
                )
            selector = request.query.get("fieldSelector", "")
            node = selector.removeprefix("spec.nodeName=") if selector else None
            partial = "as=PartialObjectMetadata" in request.headers.get("Accept", "")
            shape = metadata_only if partial else (lambda o: o)

            def matches(obj: dict[str, Any]) -> bool:
                return node is None or _node(obj) == node

            if watch:
                return await self._watch(request, resource, matches, shape)
            return self._list(request, resource, matches, shape, partial)

        return handle

    def _list(
        self,
        request: web.Request,
        resource: str,
        matches: Callable[[dict[str, Any]], bool],
        shape: Callable[[dict[str, Any]], dict[str, Any]],
        partial: bool,
    ) -> web.Response:
        items = [shape(o) for _, o in sorted(self.store[resource].items()) if matches(o)]
        _, kind, api_version = RESOURCES[resource]
        kind = "PartialObjectMetadataList" if partial else f"{kind}List"
        return list_page(request, items, self.version, kind, api_version)

    async def _watch(
        self,
        request: web.Request,
        resource: str,
        matches: Callable[[dict[str, Any]], bool],
        shape: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> web.StreamResponse:
        closing = self._closing
        since = int(request.query.get("resourceVersion") or self.version)
        timeout = self._watch_seconds(request)
        bookmarks = request.query.get("allowWatchBookmarks") == "true"
        response, send = await self._open_watch(request)
        if since < self.oldest:
            await send("ERROR", status(410, "Expired", f"too old resource version: {since}"))
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
            await self._wait_change(min(deadline, next_bookmark) - now)

    async def _get_pod(self, request: web.Request) -> web.Response:
        self.requests.append(("get", "pods"))
        denied = self._unauthorized(request)
        if denied is not None:
            return denied
        key = f"{request.match_info['ns']}/{request.match_info['name']}"
        obj = self.store["pods"].get(key)
        if obj is None:
            return web.json_response(status(404, "NotFound", f'pods "{key}" not found'), status=404)
        if "as=PartialObjectMetadata" in request.headers.get("Accept", ""):
            return web.json_response(metadata_only(obj))
        return web.json_response(obj)

    async def _not_found(self, request: web.Request) -> web.Response:
        self.requests.append(("get", request.match_info["resource"]))
        name = request.match_info["name"]
        return web.json_response(status(404, "NotFound", f"{name} not found"), status=404)
