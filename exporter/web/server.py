"""The HTTP server around the aiohttp app: connection limits for hostile clients, and TLS.

aiohttp alone keeps a connection that never sends a request, or sends it one byte a
minute, for as long as the client likes, accepts connections until the process runs out
of file descriptors, and logs an 11-line traceback for every malformed request. So each
connection goes through a small protocol in front of aiohttp's:

- **header timeout**: from connect (and from the first byte of each later request) the
  request head must be complete within `header_timeout`; the TLS handshake counts too;
- **idle timeout**: a keep-alive connection with no new request is closed after
  `idle_timeout` (aiohttp's keep-alive timer);
- **write timeout**: a client that reads nothing of a response for `write_timeout`;
- **connection cap**: at `max_connections`, a new connection closes the idle one (waiting for
  a request head, a handshake or the next keep-alive request) that was quiet longest, or is
  refused when all of them are serving a request; so idle connections never lock out a scraper;
- accept errors (EMFILE) and malformed requests are logged once per state change, counted
  in `kube_device_exporter_http_*` self-metrics, never once per event (`webstats.py`).

TLS is started per connection with the web config's *current* SSLContext, so a renewed
certificate (or a changed client CA) is used by the next connection, no restart needed.
Basic auth and response headers are a middleware of the app (`webauth.py`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import ssl
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from exporter.settings.config import DEFAULTS
from exporter.web.reload import WebConfigWatcher
from exporter.web.stats import ServerStats

log = logging.getLogger("exporter.web")

FD_RESERVE = 32
"""File descriptors kept free beyond those open at start (sysfs reads, gRPC reconnects, NVML):
the connection cap is lowered to fit under the fd limit, so accept() does not fail first."""


@dataclass(frozen=True, slots=True)
class ServerLimits:
    max_connections: int = DEFAULTS.web_max_connections
    header_timeout: float = 10.0
    idle_timeout: float = 60.0
    write_timeout: float = 30.0
    quiet_after: float = 60.0
    """A malformed-request or accept-error state ends after this long without one."""


class _Connection(asyncio.Protocol):
    """One client connection in front of aiohttp's RequestHandler."""

    def __init__(self, server: GuardedServer) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.raw: asyncio.Transport | None = None
        self.inner: RequestHandler | None = None
        self.head_since: float | None = None
        self.last_activity = self.loop.time()
        self._tail = b""
        self._head_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._closed = False
        self._early: list[bytes] = []
        """Decrypted bytes that arrive before start_tls() has returned the transport."""

    # --- lifecycle ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.raw = transport
        if not self.server.admit(self):
            transport.abort()
            self._closed = True
            return
        self._start_head()
        ctx = self.server.ssl_context()
        if ctx is None:
            self._attach(transport)
        else:
            transport.pause_reading()  # the ClientHello is for the TLS layer, not for us
            self.server.track(self.loop.create_task(self._start_tls(transport, ctx)))

    async def _start_tls(self, transport: asyncio.Transport, ctx: ssl.SSLContext) -> None:
        try:
            tls = await self.loop.start_tls(
                transport,
                self,
                ctx,
                server_side=True,
                ssl_handshake_timeout=self.server.limits.header_timeout,
            )
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError, RuntimeError) as exc:
            # plain HTTP to the TLS port, a wrong or missing client certificate, a stall
            self.server.stats.closed["tls_handshake"] += 1
            log.debug("TLS handshake failed: %r", exc)
            self.abort()
            return
        if tls is None or self._closed:
            self.abort()
            return
        self._attach(tls)

    def _attach(self, transport: asyncio.Transport) -> None:
        self.inner = self.server.handler()
        self.inner.connection_made(transport)
        for data in self._early:
            self.inner.data_received(data)
        self._early.clear()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._cancel_timers()
        self.server.release(self)
        if self.inner is not None:
            self.inner.connection_lost(exc)

    def abort(self, reason: str = "") -> None:
        if reason:
            self.server.stats.closed[reason] += 1
        self._closed = True
        self._cancel_timers()
        # Free its place under the cap now; connection_lost comes a loop turn later.
        self.server.release(self)
        if self.raw is not None:
            self.raw.abort()

    # --- reading: the request-head deadline ---------------------------------------------

    def idle(self) -> bool:
        """Waiting for a request (head, handshake or keep-alive), not serving one."""
        if self.head_since is not None:
            return True
        # aiohttp marks a request in progress from its start to the end of its response.
        return self.inner is not None and not getattr(self.inner, "_request_in_progress", True)

    def data_received(self, data: bytes) -> None:
        self.last_activity = self.loop.time()
        if self.head_since is None:
            self._start_head()
        buf = self._tail + data
        crlf, lf = buf.rfind(b"\r\n\r\n"), buf.rfind(b"\n\n")
        end = max(crlf + 4 if crlf >= 0 else 0, lf + 2 if lf >= 0 else 0)
        if end:
            self._stop_head()
            if end < len(buf):  # the next (pipelined) request has begun
                self._start_head()
            self._tail = buf[end:][-3:]
        else:
            self._tail = buf[-3:]
        if self.inner is not None:
            self.inner.data_received(data)
        else:
            self._early.append(data)

    def eof_received(self) -> bool | None:
        if self.inner is not None:
            self.inner.eof_received()
        return None

    def _start_head(self) -> None:
        self.head_since = self.loop.time()
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(
            self.server.limits.header_timeout, self._head_expired
        )

    def _stop_head(self) -> None:
        self.head_since = None
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_expired(self) -> None:
        self._head_timer = None
        if self.head_since is not None and not self._closed:
            self.abort("header_timeout")

    # --- writing: a client that does not read ----------------------------------------

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(
                self.server.limits.write_timeout, self.abort, "write_timeout"
            )

    def resume_writing(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        if self.inner is not None:
            self.inner.resume_writing()

    def _cancel_timers(self) -> None:
        for timer in (self._head_timer, self._write_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._write_timer = None


class GuardedServer:
    """Listens on HOST:PORT and serves an aiohttp AppRunner's handler through `_Connection`."""

    def __init__(
        self,
        runner: web.AppRunner,
        limits: ServerLimits,
        stats: ServerStats,
        watcher: WebConfigWatcher | None = None,
    ) -> None:
        self.runner = runner
        self.limits = limits
        self.stats = stats
        self.watcher = watcher
        self.max_connections = limits.max_connections
        self.connections: dict[_Connection, None] = {}
        """Open connections in the order they came (oldest first)."""
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._previous_handler: Any = None

    def handler(self) -> RequestHandler:
        server = self.runner.server
        assert server is not None
        return server()

    def ssl_context(self) -> ssl.SSLContext | None:
        return None if self.watcher is None else self.watcher.current().ssl_context

    def track(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def admit(self, conn: _Connection) -> bool:
        if len(self.connections) >= self.max_connections:
            idle = [c for c in self.connections if c.idle()]
            if not idle:
                self.stats.closed["connection_limit"] += 1
                return False
            min(idle, key=lambda c: c.last_activity).abort("evicted")
        self.connections[conn] = None
        self.stats.open = len(self.connections)
        return True

    def _make_room(self, count: int) -> None:
        idle = sorted((c for c in self.connections if c.idle()), key=lambda c: c.last_activity)
        for conn in idle[:count]:
            conn.abort("evicted")

    def release(self, conn: _Connection) -> None:
        self.connections.pop(conn, None)
        self.stats.open = len(self.connections)

    async def start(self, host: str | None, port: int) -> int:
        loop = asyncio.get_running_loop()
        soft = raise_fd_limit()
        room = soft - _open_fds() - FD_RESERVE
        if room < self.max_connections:
            self.max_connections = max(1, room)
            log.info(
                "at most %d HTTP connections: the file descriptor limit is %d",
                self.max_connections,
                soft,
            )
        self._previous_handler = loop.get_exception_handler()
        loop.set_exception_handler(self._loop_exception)
        if self.watcher is not None:
            self.watcher.start()
        server = await loop.create_server(
            lambda: _Connection(self), host or None, port, reuse_address=True, backlog=128
        )
        self._servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self.watcher is not None:
            await self.watcher.close()
        for server in self._servers:
            server.close()
        for conn in list(self.connections):
            conn.abort()
        for task in list(self._tasks):
            task.cancel()
        for server in self._servers:
            await server.wait_closed()
        asyncio.get_running_loop().set_exception_handler(self._previous_handler)

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") == "socket.accept() out of system resource":
            self.stats.accept_errors.hit(str(context.get("exception")))
            self._make_room(8)  # asyncio retries accept() in a second; free some fds for it
            return
        if self._previous_handler is not None:
            self._previous_handler(loop, context)
        else:
            loop.default_exception_handler(context)


def _open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 64


def raise_fd_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit, as Go programs do at start; the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            log.debug("cannot raise the file descriptor limit: %s", exc)
            return soft
        return hard if hard != resource.RLIM_INFINITY else 1 << 20
    return soft if soft != resource.RLIM_INFINITY else 1 << 20
