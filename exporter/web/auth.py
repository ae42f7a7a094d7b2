"""Basic auth and the configured response headers, from --web.config.file, on every request.

The probes (`/healthz`, `/readyz`) answer without credentials; everything else needs them
when the web config names users. The config is read per request, so a changed file applies
to the next request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from exporter.web.basicauth import BasicAuth, Verdict
from exporter.web.reload import WebConfigWatcher
from exporter.web.stats import ServerStats

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
            verdict = Verdict.DENIED
            if header:
                verdict = await auth.check(config.users, header, request.remote or "")
            if verdict is not Verdict.OK:
                response = _refusal(verdict, stats)
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


def _refusal(verdict: Verdict, stats: ServerStats) -> web.StreamResponse:
    """401 for wrong or missing credentials; 429 for a check refused without bcrypt (this
    client's failures over budget, or too many checks waiting): try again later."""
    if verdict is Verdict.RATE_LIMITED:
        stats.rate_limited += 1
        return web.Response(status=429, text="Too Many Requests\n", headers={"Retry-After": "2"})
    stats.unauthorized += 1
    return web.Response(
        status=401,
        text="Unauthorized\n",
        headers={"WWW-Authenticate": 'Basic realm="kube-device-exporter"'},
    )
