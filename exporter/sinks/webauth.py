"""Basic auth and the configured response headers, from --web.config.file, on every request.

The probes (`/healthz`, `/readyz`) answer without credentials; everything else needs them
when the web config names users. The config is read per request, so a changed file applies
to the next request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from exporter.sinks.webstats import ServerStats
from exporter.webconfig import BasicAuth, WebConfigWatcher

PROBE_PATHS = frozenset({"/healthz", "/readyz"})
"""Answer without basic auth (still over TLS when TLS is on): kubelet probes cannot send
credentials without writing them into the pod spec, and these say only "ok"/"ready"."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def security_middleware(watcher: WebConfigWatcher, stats: ServerStats) -> Middleware:
    """Basic auth on every path but the probes, and the configured response headers."""
    auth = BasicAuth()

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        config = watcher.current()
        if config.auth and request.path not in PROBE_PATHS:
            header = request.headers.get("Authorization", "")
            if not header or not await auth.check(config.users, header):
                stats.unauthorized += 1
                response: web.StreamResponse = web.Response(
                    status=401,
                    text="Unauthorized\n",
                    headers={"WWW-Authenticate": 'Basic realm="kube-device-exporter"'},
                )
                response.headers.update(config.headers)
                return response
        try:
            response = await handler(request)
        except web.HTTPException as exc:  # 404, 405...: the headers go on them too
            exc.headers.update(config.headers)
            raise
        response.headers.update(config.headers)
        return response

    return middleware
