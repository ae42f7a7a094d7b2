"""The loopback Kubernetes API server: of the simulated node (its DRA section) and of the
tests of the exporter's watches. Pods, ReplicaSets, Jobs, ResourceSlices, DeviceTaintRules
and Events, as kube-apiserver answers them.

The protocol is the one the exporter relies on, as k8s.io/apiserver implements it
(pkg/endpoints/handlers/get.go ListResource, watch.go serveWatch, pkg/storage/cacher), on
the server plumbing of loopback.py:
- list: `fieldSelector=spec.nodeName=X` filters (pods and resourceslices both have that
  selectable field: pkg/registry/core/pod/strategy.go, pkg/registry/resource/resourceslice/
  strategy.go), `limit`/`continue` pages, the list's `metadata.resourceVersion` is the store's;
- `Accept: ...;as=PartialObjectMetadata...` (`...List` for a list) returns metadata-only
  objects;
- watch: every change after `resourceVersion` that matches, then new ones as they happen
  (`DELETED` carries the last state with a new version); `allowWatchBookmarks=true` gets
  BOOKMARKs (an object with only `metadata.resourceVersion`, the store's: the watch has
  sent everything up to it); the watch ends after `timeoutSeconds` (or the server's own cap,
  or `close_watches()`, like an API server restart); a version older than the kept history
  (`history` changes, or `change_unseen()`'s compaction) gets HTTP 200 and one ERROR event
  with a 410 `Status` ("too old resource version: V (OLDEST)"), then the end of the stream;
- a wrong bearer token is 401; a resource in `forbidden` is 403 with the authorizer's
  `Status` (no RBAC rule); a kind not served (DeviceTaintRule without
  `--runtime-config=resource.k8s.io/v1beta2=true`, control-plane.md DRA item 8) is 404;
- GET of one object returns it whole (or its metadata), 404 when there is none; a pod with
  `status.containerStatuses[].allocatedResourcesStatus` (KEP-4680: `[{"name":
  "claim:<claim>[/<request>]", "resources": [{"resourceID": "<driver>/<pool>/<device>",
  "health": "Healthy|Unhealthy|Unknown", "message": ...}]}]`, as the real 1.36 kubelet
  reported it, control-plane.md DRA item 5);
- `POST /api/v1/namespaces/{ns}/events` creates a core/v1 Event, validated as the apiserver's
  ValidateEventCreate does for an Event without `eventTime` (pkg/apis/core/validation/
  events.go: `involvedObject.namespace` must be the Event's namespace, the name a DNS
  subdomain) and 409 AlreadyExists for a name taken (pkg/registry/core/event/storage).

Objects keep the shapes of the API reference (for slices, https://kubernetes.io/docs/
reference/kubernetes-api/workload-resources/resource-slice-v1/); the scenario or the test
writes them. Runs its own event loop in a thread: the node's `advance()` (a worker thread)
or a test changes objects with `put()` / `delete()`; `requests` records (verb, resource) of
every call.
"""

from __future__ import annotations

import asyncio
import copy
import re
import socket
from collections.abc import Callable
from typing import Any

from aiohttp import web

from simulator.loopback import LoopbackServer, list_page, metadata_only, status

TOKEN = "simulated-node-token"
USER = "system:serviceaccount:kube-device-exporter:kube-device-exporter"
RESOURCES = {
    "pods": ("/api/v1/pods", "Pod", "v1"),
    "events": ("/api/v1/events", "Event", "v1"),
    "replicasets": ("/apis/apps/v1/replicasets", "ReplicaSet", "apps/v1"),
    "jobs": ("/apis/batch/v1/jobs", "Job", "batch/v1"),
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
    "resourceclaims": (
        "/apis/resource.k8s.io/v1/resourceclaims",
        "ResourceClaim",
        "resource.k8s.io/v1",
    ),
}
"""resource -> (list path, kind, apiVersion)."""
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
Matches = Callable[[dict[str, Any]], bool]
Shape = Callable[[dict[str, Any]], dict[str, Any]]


def _key(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace', '')}/{meta['name']}"


def _node(obj: dict[str, Any]) -> str | None:
    return (obj.get("spec") or {}).get("nodeName")


def _group(resource: str) -> str:
    return RESOURCES[resource][2].rpartition("/")[0]


def _qualified(resource: str) -> str:
    """As the API server names a resource in a message: `replicasets.apps`, `pods`."""
    return f"{resource}.{_group(resource)}" if _group(resource) else resource


def _partial(request: web.Request) -> bool:
    return "as=PartialObjectMetadata" in request.headers.get("Accept", "")


class ApiServer(LoopbackServer):
    context = "sim"

    def __init__(
        self, *, serve_taint_rules: bool = True, history: int = 1000, bookmark_every: float = 60.0
    ) -> None:
        self.serve_taint_rules = serve_taint_rules
        self.keep = history
        self.bookmark_every = bookmark_every
        self.version = 1000
        self.store: dict[str, dict[str, dict[str, Any]]] = {r: {} for r in RESOURCES}
        self.history: list[tuple[int, str, str, dict[str, Any]]] = []
        """(version, resource, event type, object)."""
        self.oldest = 0
        """Versions below this are compacted away: watching from them is 410 Gone."""
        self.always_gone = False
        """Every watch answers 410, whatever its version (a watch cache that cannot serve)."""
        self.requests: list[tuple[str, str]] = []
        self.metadata_only: list[tuple[str, str]] = []
        """The requests that asked for `PartialObjectMetadata`."""
        self.watch_versions: list[int] = []
        """The resourceVersion each watch started from."""
        self.forbidden: set[str] = set()
        """Resources every request of which is answered 403 (RBAC without the rule)."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            super().__init__(int(s.getsockname()[1]), TOKEN)

    @property
    def events(self) -> list[dict[str, Any]]:
        """Every Event created, as stored (with uid and resourceVersion)."""
        return list(self.store["events"].values())

    def count(self, verb: str, resource: str) -> int:
        return self.requests.count((verb, resource))

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
            self.oldest = self.version
            self.history.clear()
            await self._close_watches()

        self._call(gone)

    def _routes(self, app: web.Application) -> None:
        for resource, (path, _, _) in RESOURCES.items():
            app.router.add_get(path, self._handler(resource))
        app.router.add_get("/api/{version}/namespaces/{ns}/{resource}/{name}", self._get)
        app.router.add_get("/apis/{group}/{version}/namespaces/{ns}/{resource}/{name}", self._get)
        app.router.add_post("/api/v1/namespaces/{ns}/events", self._create_event)

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

    def _refused(self, request: web.Request, verb: str, resource: str) -> web.Response | None:
        """Count the request; 401 for a wrong token, 403 for a forbidden resource, 404 for
        one not served."""
        self.requests.append((verb, resource))
        if _partial(request):
            self.metadata_only.append((verb, resource))
        denied = self._unauthorized(request)
        if denied is not None:
            return denied
        if resource in self.forbidden:
            named = f' "{name}"' if (name := request.match_info.get("name")) else ""
            where = f' in the namespace "{ns}"' if (ns := request.match_info.get("ns")) else ""
            message = (
                f'{_qualified(resource)}{named} is forbidden: User "{USER}" cannot {verb} '
                f'resource "{resource}" in API group "{_group(resource)}"'
                f"{where or ' at the cluster scope'}"
            )
            return web.json_response(status(403, "Forbidden", message), status=403)
        if resource == "devicetaintrules" and not self.serve_taint_rules:
            return web.json_response(
                status(404, "NotFound", "the server could not find the requested resource"),
                status=404,
            )
        return None

    def _handler(self, resource: str) -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.StreamResponse:
            watch = request.query.get("watch") == "true"
            refused = self._refused(request, "watch" if watch else "list", resource)
            if refused is not None:
                return refused
            selector = request.query.get("fieldSelector", "")
            node = (
                selector.removeprefix("spec.nodeName=")
                if selector.startswith("spec.nodeName=")
                else None
            )
            shape = metadata_only if _partial(request) else (lambda o: o)

            def matches(obj: dict[str, Any]) -> bool:
                return node is None or _node(obj) == node

            if watch:
                return await self._watch(request, resource, matches, shape)
            return self._list(request, resource, matches, shape)

        return handle

    def _list(
        self, request: web.Request, resource: str, matches: Matches, shape: Shape
    ) -> web.Response:
        items = [shape(o) for _, o in sorted(self.store[resource].items()) if matches(o)]
        _, kind, api_version = RESOURCES[resource]
        kind = "PartialObjectMetadataList" if _partial(request) else f"{kind}List"
        return list_page(request, items, self.version, kind, api_version)

    async def _watch(
        self, request: web.Request, resource: str, matches: Matches, shape: Shape
    ) -> web.StreamResponse:
        closing = self._closing  # a close_watches() from now on ends this watch
        since = int(request.query.get("resourceVersion") or self.version)
        timeout = self._watch_seconds(request)
        bookmarks = request.query.get("allowWatchBookmarks") == "true"
        response, send = await self._open_watch(request)
        self.watch_versions.append(since)
        if since < self.oldest or self.always_gone:
            message = f"too old resource version: {since} ({self.oldest})"
            await send("ERROR", status(410, "Expired", message))
            return response
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        next_bookmark = loop.time() + self.bookmark_every
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
                meta = {"resourceVersion": str(self.version)}
                await send("BOOKMARK", {"kind": kind, "apiVersion": api_version, "metadata": meta})
                since = max(since, self.version)
                next_bookmark = now + self.bookmark_every
            await self._wait_change(min(deadline, next_bookmark if bookmarks else deadline) - now)

    async def _get(self, request: web.Request) -> web.Response:
        resource = request.match_info["resource"]
        if resource not in RESOURCES:
            self.requests.append(("get", resource))
            message = "the server could not find the requested resource"
            return web.json_response(status(404, "NotFound", message), status=404)
        refused = self._refused(request, "get", resource)
        if refused is not None:
            return refused
        key = f"{request.match_info['ns']}/{request.match_info['name']}"
        obj = self.store[resource].get(key)
        if obj is None:
            message = f'{_qualified(resource)} "{request.match_info["name"]}" not found'
            return web.json_response(status(404, "NotFound", message), status=404)
        return web.json_response(metadata_only(obj) if _partial(request) else obj)

    async def _create_event(self, request: web.Request) -> web.Response:
        refused = self._refused(request, "create", "events")
        if refused is not None:
            return refused
        ns = request.match_info["ns"]
        obj = await request.json()
        meta = obj.get("metadata") or {}
        problems = _event_problems(obj, ns)
        if problems:
            return web.json_response(status(422, "Invalid", "; ".join(problems)), status=422)
        if f"{ns}/{meta.get('name', '')}" in self.store["events"]:
            message = f'events "{meta["name"]}" already exists'
            return web.json_response(status(409, "AlreadyExists", message), status=409)
        stored = copy.deepcopy(obj)
        stored["metadata"] |= {"namespace": ns, "uid": f"event-{self.version + 1}"}
        await self._change("events", stored, deleted=False)
        return web.json_response(self.store["events"][_key(stored)], status=201)


def _event_problems(obj: dict[str, Any], ns: str) -> list[str]:
    """What ValidateEventCreate refuses in an Event without `eventTime`."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", ""))
    problems = []
    if not _DNS_SUBDOMAIN.fullmatch(name) or len(name) > 253:
        problems.append(f"metadata.name: Invalid value: {name!r}")
    if meta.get("namespace", ns) != ns:
        problems.append("metadata.namespace: does not match the namespace of the request")
    involved = obj.get("involvedObject") or {}
    if involved.get("namespace", "") != ns:
        problems.append("involvedObject.namespace: Invalid value: does not match event.namespace")
    if not obj.get("reason") or not involved.get("kind") or not involved.get("name"):
        problems.append("reason, involvedObject.kind and .name: Required value")
    return problems
