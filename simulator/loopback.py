"""The loopback Kubernetes API server's plumbing, apart from its resources (apiserver.py).

An aiohttp app on 127.0.0.1 served by its own event loop in a daemon thread, so sync code
(the node's `advance()`, a test running the exporter as a subprocess) and async tests use it
alike; a condition that wakes the open watches at each change, and a count that ends them
(an API server restart, a proxy). The answers are kube-apiserver's (k8s.io/apiserver:
pkg/endpoints/handlers/get.go ListResource, watch.go serveWatch): a `Status` body for an
error, `limit`/`continue` pages, a watch as newline-separated `{"type", "object"}` events,
ended after `timeoutSeconds` or the server's own cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Self

from aiohttp import web

Send = Callable[[str, dict[str, Any]], Awaitable[None]]
"""Writes one watch event: (type, object)."""


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    """A failure's `Status` body."""
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
            "reason": reason, "code": code}  # fmt: skip


def metadata_only(obj: dict[str, Any]) -> dict[str, Any]:
    """The object as `Accept: ...;as=PartialObjectMetadata` asks for it."""
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": obj["metadata"]}  # fmt: skip


def list_page(
    request: web.Request, items: list[dict[str, Any]], version: int, kind: str, api_version: str
) -> web.Response:
    """The page of `items` that `limit` and `continue` ask for; the list's version is the
    store's, and `continue` is set while more pages follow."""
    start = int(request.query.get("continue") or 0)
    limit = int(request.query.get("limit") or 0) or len(items) or 1
    more = start + limit < len(items)
    meta = {"resourceVersion": str(version), **({"continue": str(start + limit)} if more else {})}
    page = items[start : start + limit]
    return web.json_response({"kind": kind, "apiVersion": api_version, "metadata": meta,
                              "items": page})  # fmt: skip


class LoopbackServer:
    """The server's thread, lifecycle and watch plumbing; a subclass adds its routes."""

    context = "loopback"
    """The kubeconfig's cluster, user and context name."""

    def __init__(self, port: int, token: str) -> None:
        self.port = port
        self.token = token
        self.max_watch_seconds = 1800.0
        """The server's own cap on a watch (kube-apiserver: --min-request-timeout, 1800 s,
        randomized up to twice that); 0 is a proxy that cuts every watch at once."""
        self._loop = asyncio.new_event_loop()
        self._changed: asyncio.Condition | None = None
        self._closing = 0
        """Moves to end every open watch."""
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kubeconfig(self, path: Path, token: str | None = None) -> Path:
        """A kubeconfig that reaches this server with `token` (its own by default)."""
        name = self.context
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": name,
            "clusters": [{"name": name, "cluster": {"server": self.url}}],
            "users": [{"name": name, "user": {"token": self.token if token is None else token}}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        }))  # fmt: skip
        return path

    def start(self) -> Self:
        self._thread.start()
        self._call(self._start)
        return self

    def stop(self) -> None:
        self._call(self._stop)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def close_watches(self) -> None:
        """End every open watch, as an API server restart or a proxy does."""
        self._call(self._close_watches)

    def _routes(self, app: web.Application) -> None:
        raise NotImplementedError

    def _call(self, fn: Callable[[], Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(fn(), self._loop).result(timeout=10)

    async def _start(self) -> None:
        self._changed = asyncio.Condition()
        app = web.Application()
        self._routes(app)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _stop(self) -> None:
        await self._close_watches()
        assert self._runner is not None
        await self._runner.cleanup()

    async def _close_watches(self) -> None:
        self._closing += 1
        await self._notify()

    async def _notify(self) -> None:
        assert self._changed is not None
        async with self._changed:
            self._changed.notify_all()

    async def _wait_change(self, seconds: float) -> None:
        """Until the next change, at most `seconds`."""
        assert self._changed is not None
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=max(0.0, seconds))

    def _unauthorized(self, request: web.Request) -> web.Response | None:
        """401 for a bearer token other than the server's."""
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response(status(401, "Unauthorized", "Unauthorized"), status=401)
        return None

    def _watch_seconds(self, request: web.Request) -> float:
        return min(float(request.query.get("timeoutSeconds") or 1800), self.max_watch_seconds)

    async def _open_watch(self, request: web.Request) -> tuple[web.StreamResponse, Send]:
        """The watch's stream, started, and how to write an event to it."""
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)

        async def send(kind: str, obj: dict[str, Any]) -> None:
            await response.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

        return response, send
