"""A Kubernetes API server for pods, ReplicaSets and Jobs, over HTTP on loopback.

It speaks the protocol the exporter relies on, as the real kube-apiserver does it
(k8s.io/apiserver: pkg/endpoints/handlers/get.go ListResource, watch.go serveWatch,
pkg/storage/cacher):

- list: `fieldSelector=spec.nodeName=X` filters, `limit`/`continue` pages, the list's
  `metadata.resourceVersion` is the store's current one;
- `Accept: application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1` (and
  `as=PartialObjectMetadata` for watch and get) return metadata-only objects;
- watch: every change after `resourceVersion` that matches the selector, then new ones as
  they happen; a DELETED event carries the object's last state with a new version;
  `allowWatchBookmarks=true` gets BOOKMARK events (an object with only
  `metadata.resourceVersion`); the server ends the watch after `timeoutSeconds` (or earlier:
  `close_watches()`, like an apiserver restart);
- a resourceVersion older than the retained history (`compact()`) gets HTTP 200 and one
  ERROR event with a 410 `Status` ("too old resource version"), then the end of the stream;
- a wrong bearer token is 401, `forbid()` makes every call 403 with a `Status` body;
- `POST /api/v1/namespaces/{ns}/events` creates a core/v1 Event, validated as the apiserver's
  ValidateEventCreate does for an Event without `eventTime` (pkg/apis/core/validation/
  events.go: `involvedObject.namespace` must be the Event's namespace, the name a DNS
  subdomain) and 409 AlreadyExists for a name taken (pkg/registry/core/event/storage);
  `forbid_events()` makes it 403 (no `create` on events in the RBAC).

Runs its own event loop in a thread, so sync tests (a subprocess exporter) and async
tests use it alike. `requests` records (verb, resource) of every call.
"""

from __future__ import annotations

import asyncio
import copy
import re
from collections.abc import Callable
from typing import Any

from aiohttp import web

from simulator.loopback import LoopbackServer, list_page, metadata_only, status
from tests.peers import free_port

TOKEN = "test-token"
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def pod(
    name: str,
    namespace: str = "default",
    *,
    node: str = "node-a",
    uid: str | None = None,
    labels: dict[str, str] | None = None,
    owner: tuple[str, str, str] | None = None,
) -> dict[str, Any]:
    """A Pod; `owner` is the controller's (kind, name, uid)."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid or f"uid-{namespace}-{name}",
        "labels": labels or {},
    }
    if owner:
        meta["ownerReferences"] = [_ref(*owner)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "x" * 2000}]},
        "status": {"phase": "Running"},
    }


def owner_object(
    kind: str,
    name: str,
    uid: str,
    namespace: str = "default",
    controller: tuple[str, str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid}
    if controller:
        meta["ownerReferences"] = [_ref(*controller)]
    api = {"ReplicaSet": "apps/v1", "Job": "batch/v1"}[kind]
    return {"apiVersion": api, "kind": kind, "metadata": meta, "spec": {}}


def _ref(kind: str, name: str, uid: str) -> dict[str, Any]:
    api = {"ReplicaSet": "apps/v1", "Deployment": "apps/v1", "StatefulSet": "apps/v1",
           "DaemonSet": "apps/v1", "Job": "batch/v1", "CronJob": "batch/v1"}.get(kind, "example.com/v1")  # fmt: skip
    return {"apiVersion": api, "kind": kind, "name": name, "uid": uid, "controller": True,
            "blockOwnerDeletion": True}  # fmt: skip


class FakeApiServer(LoopbackServer):
    context = "test"

    def __init__(self, bookmark_every: float = 60.0, max_watch_seconds: float = 1800.0) -> None:
        super().__init__(free_port(), TOKEN)
        self.bookmark_every = bookmark_every
        self.max_watch_seconds = max_watch_seconds
        self.always_gone = False
        """Every watch answers 410, whatever its version (a watch cache that cannot serve)."""
        self.owners_forbidden = False
        self.version = 100
        self.pods: dict[str, dict[str, Any]] = {}
        self.owners: dict[tuple[str, str, str], dict[str, Any]] = {}
        """(resource, namespace, name) -> ReplicaSet or Job."""
        self.history: list[tuple[int, str, dict[str, Any]]] = []
        self.oldest = 0
        """Versions below this are compacted away: watching from them is 410 Gone."""
        self.forbidden = False
        self.requests: list[tuple[str, str]] = []
        self.events: list[dict[str, Any]] = []
        """Every Event created, as stored (with uid and resourceVersion)."""
        self.events_forbidden = False
        self.metadata_only_requests = 0
        self.watch_versions: list[int] = []
        """The resourceVersion each watch started from."""

    def _routes(self, app: web.Application) -> None:
        app.router.add_get("/api/v1/pods", self._pods)
        app.router.add_get("/apis/{group}/{version}/namespaces/{ns}/{resource}/{name}", self._owner)
        app.router.add_post("/api/v1/namespaces/{ns}/events", self._create_event)

    # --- what tests do to the cluster --------------------------------------------------

    def add_pod(self, obj: dict[str, Any]) -> None:
        self._call(lambda: self._change("ADDED", obj))

    def update_pod(self, obj: dict[str, Any]) -> None:
        self._call(lambda: self._change("MODIFIED", obj))

    def delete_pod(self, obj: dict[str, Any]) -> None:
        self._call(lambda: self._change("DELETED", obj))

    def add_owner(self, obj: dict[str, Any]) -> None:
        resource = {"ReplicaSet": "replicasets", "Job": "jobs"}[obj["kind"]]
        meta = obj["metadata"]
        self.owners[(resource, meta["namespace"], meta["name"])] = obj

    def delete_unseen(self, obj: dict[str, Any]) -> None:
        """Delete a pod, then compact and end every watch before any watcher hears of it:
        a client resuming from its version gets 410 Gone and must re-list to notice."""

        async def gone() -> None:
            await self._change("DELETED", obj)
            self.version += 1
            self.oldest = self.version
            self.history.clear()
            await self._close_watches()

        self._call(gone)

    def forbid(self, forbidden: bool = True) -> None:
        self.forbidden = forbidden

    def count(self, verb: str, resource: str = "pods") -> int:
        return self.requests.count((verb, resource))

    async def _change(self, kind: str, obj: dict[str, Any]) -> None:
        self.version += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.version)
        uid = obj["metadata"]["uid"]
        if kind == "DELETED":
            self.pods.pop(uid, None)
        else:
            self.pods[uid] = obj
        self.history.append((self.version, kind, obj))
        await self._notify()

    # --- handlers -----------------------------------------------------------------------

    def _denied(self, request: web.Request) -> web.Response | None:
        unauthorized = self._unauthorized(request)
        if unauthorized is not None:
            return unauthorized
        if self.forbidden:
            return web.json_response(
                status(403, "Forbidden", 'pods is forbidden: User "system:serviceaccount:'
                        'kube-device-exporter:kube-device-exporter" cannot list resource "pods"'),
                status=403,
            )  # fmt: skip
        return None

    def forbid_events(self, forbidden: bool = True) -> None:
        self.events_forbidden = forbidden

    async def _create_event(self, request: web.Request) -> web.Response:
        self.requests.append(("create", "events"))
        denied = self._denied(request)
        if denied is not None:
            return denied
        ns = request.match_info["ns"]
        if self.events_forbidden:
            return web.json_response(
                status(403, "Forbidden", f'events is forbidden: cannot create resource "events" '
                        f'in API group "" in the namespace "{ns}"'),
                status=403,
            )  # fmt: skip
        obj = await request.json()
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        problems = []
        if not _DNS_SUBDOMAIN.fullmatch(name) or len(name) > 253:
            problems.append(f"metadata.name: Invalid value: {name!r}")
        if meta.get("namespace", ns) != ns:
            problems.append("metadata.namespace: does not match the namespace of the request")
        involved = obj.get("involvedObject") or {}
        if involved.get("namespace", "") != ns:
            problems.append(
                "involvedObject.namespace: Invalid value: does not match event.namespace"
            )
        if not obj.get("reason") or not involved.get("kind") or not involved.get("name"):
            problems.append("reason, involvedObject.kind and .name: Required value")
        if problems:
            return web.json_response(status(422, "Invalid", "; ".join(problems)), status=422)
        if any(e["metadata"]["name"] == name and e["metadata"]["namespace"] == ns
               for e in self.events):  # fmt: skip
            return web.json_response(
                status(409, "AlreadyExists", f'events "{name}" already exists'), status=409
            )
        self.version += 1
        stored = copy.deepcopy(obj)
        stored["metadata"] |= {"namespace": ns, "uid": f"event-{self.version}",
                               "resourceVersion": str(self.version)}  # fmt: skip
        self.events.append(stored)
        return web.json_response(stored, status=201)

    async def _pods(self, request: web.Request) -> web.StreamResponse:
        watch = request.query.get("watch") == "true"
        self.requests.append(("watch" if watch else "list", "pods"))
        closing = self._closing  # a close_watches() from now on ends this watch
        if "as=PartialObjectMetadata" in request.headers.get("Accept", ""):
            self.metadata_only_requests += 1
        denied = self._denied(request)
        if denied is not None:
            return denied
        selector = request.query.get("fieldSelector", "")
        node = (
            selector.removeprefix("spec.nodeName=")
            if selector.startswith("spec.nodeName=")
            else None
        )
        partial = "as=PartialObjectMetadata" in request.headers.get("Accept", "")
        shape = metadata_only if partial else (lambda o: o)

        def matches(obj: dict[str, Any]) -> bool:
            return node is None or obj["spec"]["nodeName"] == node

        if watch:
            return await self._watch(request, matches, shape, closing)
        items = [shape(o) for _, o in sorted(self.pods.items()) if matches(o)]
        kind = "PartialObjectMetadataList" if partial else "PodList"
        return list_page(request, items, self.version, kind, "v1")

    async def _watch(
        self, request: web.Request, matches: Callable[[dict[str, Any]], bool],
        shape: Callable[[dict[str, Any]], dict[str, Any]], closing: int,
    ) -> web.StreamResponse:  # fmt: skip
        since = int(request.query.get("resourceVersion") or self.version)
        timeout = self._watch_seconds(request)
        bookmarks = request.query.get("allowWatchBookmarks") == "true"
        response, send = await self._open_watch(request)
        self.watch_versions.append(since)
        if since < self.oldest or self.always_gone:
            await send(
                "ERROR",
                status(410, "Expired", f"too old resource version: {since} ({self.oldest})"),
            )
            return response
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        next_bookmark = loop.time() + self.bookmark_every
        while True:
            for version, kind, obj in [h for h in self.history if h[0] > since]:
                since = version
                if matches(obj):
                    await send(kind, shape(obj))
            now = loop.time()
            if now >= deadline or self._closing != closing:
                return response
            if bookmarks and now >= next_bookmark:
                await send("BOOKMARK", {"kind": "Pod", "apiVersion": "v1",
                                        "metadata": {"resourceVersion": str(self.version)}})  # fmt: skip
                since = max(since, self.version)
                next_bookmark = now + self.bookmark_every
            await self._wait_change(min(deadline, next_bookmark if bookmarks else deadline) - now)

    async def _owner(self, request: web.Request) -> web.Response:
        resource = request.match_info["resource"]
        self.requests.append(("get", resource))
        denied = self._denied(request)
        if denied is not None:
            return denied
        if self.owners_forbidden:
            message = f'{resource}.apps is forbidden: cannot get resource "{resource}"'
            return web.json_response(status(403, "Forbidden", message), status=403)
        key = (resource, request.match_info["ns"], request.match_info["name"])
        if key not in self.owners:
            return web.json_response(
                status(404, "NotFound", f"{resource} {key[2]} not found"), status=404
            )
        obj = self.owners[key]
        if "as=PartialObjectMetadata" in request.headers.get("Accept", ""):
            return web.json_response(metadata_only(obj))
        return web.json_response(obj)
