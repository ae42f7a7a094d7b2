"""Composition root: config -> sources, kubelet client, poller, sinks, HTTP server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping

from aiohttp import web

from exporter import log as logsetup
from exporter.attribution.resolver import ProcessResolver
from exporter.config import Config
from exporter.join import ResourceMatcher
from exporter.model import SourceResult
from exporter.podresources.client import PodResourcesClient
from exporter.poller import Poller
from exporter.sinks import SelfMetrics, SnapshotSink
from exporter.sinks.prometheus import PrometheusSink
from exporter.sinks.web import DevicesView, make_app
from exporter.sources import Source, SourceContext, registry
from exporter.threads import in_daemon_thread

log = logging.getLogger("exporter")

SHUTDOWN_SECONDS = 8.0
"""From SIGTERM to exit; the kubelet's default grace period is 30 s, ours says 10 s."""


class _Unavailable:
    """Stands in for a source whose construction failed: reports the error every cycle."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def collect(self) -> SourceResult:
        raise RuntimeError(f"not available: {self.error}")

    def close(self) -> None:
        return None


def build_sources(config: Config, *, clock: Callable[[], float] | None = None) -> dict[str, Source]:
    """Every enabled source; `clock` (monotonic seconds) is injectable for tests."""
    sources: dict[str, Source] = {}
    for name, info in registry().items():
        if name not in config.collectors:
            continue
        ctx = SourceContext(
            sysfs=config.sysfs,
            procfs=config.procfs,
            options=config.source_options.get(name, {}),
            clock=clock,
            logger=logging.getLogger(f"exporter.sources.{name}"),
        )
        try:
            sources[name] = info.factory(ctx)
        except Exception as exc:  # noqa: BLE001 - one broken source must not stop the others
            log.warning("source %s could not start: %s", name, exc)
            sources[name] = _Unavailable(exc)
    return sources


class Exporter:
    """The running agent. Tests and `simulate` drive it in-process."""

    def __init__(self, config: Config, *, sources: Mapping[str, Source] | None = None) -> None:
        self.config = config
        self.prometheus = PrometheusSink()
        self.view = DevicesView()
        sinks: list[SnapshotSink] = [self.prometheus, self.view]
        self_metrics: list[SelfMetrics] = []
        self.otlp = None
        if config.otlp.endpoint:
            from exporter.sinks.otlp import OtlpSink

            self.otlp = OtlpSink(config)
            sinks.append(self.otlp)
            self_metrics.append(self.otlp)
        self.client = PodResourcesClient(
            config.kubelet_socket,
            timeout=config.podresources_timeout,
            max_message_bytes=config.podresources_max_message_bytes,
        )
        self.poller = Poller(
            node=config.node_name,
            sources=build_sources(config) if sources is None else sources,
            client=self.client,
            sinks=sinks,
            self_metrics=self_metrics,
            matcher=ResourceMatcher(config.resource_patterns),
            interval=config.collect_interval,
            source_timeout=config.collect_timeout,
            stale_after=config.podresources_stale_after,
            resolver=ProcessResolver(config.procfs, config.container_logs),
            process_series=config.process_series,
        )
        self._runner: web.AppRunner | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self.port: int | None = None

    @property
    def url(self) -> str:
        host = (self.config.listen_address or ("", 0))[0] or "127.0.0.1"
        host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}/"

    async def start(self) -> None:
        if self.config.listen_address is not None:
            app = make_app(self.prometheus, self.view, lambda: self.poller.restart_required)
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            host, port = self.config.listen_address
            site = web.TCPSite(self._runner, host or None, port)
            await site.start()
            self.port = _bound_port(self._runner) or port
            log.info("serving on %s", self.url)
        if self.otlp is not None:
            self.otlp.start()
        self._task = asyncio.create_task(self.poller.run_forever(self._stop))

    async def stop(self) -> None:
        """Stop within SHUTDOWN_SECONDS whatever a source is doing: the cycle in progress
        is abandoned (a hung driver call stays behind in its daemon thread), OTLP gets what
        is left of the budget for its last export, sources get what remains to close."""
        deadline = asyncio.get_running_loop().time() + SHUTDOWN_SECONDS

        def left(reserve: float = 0.0) -> float:
            return max(0.1, deadline - asyncio.get_running_loop().time() - reserve)

        self._stop.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout=0.5)
            except TimeoutError:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
        if self.otlp is not None:
            otlp = self.otlp
            flushing = in_daemon_thread(otlp.shutdown, "otlp-shutdown")
            try:
                await asyncio.wait_for(flushing, timeout=left(reserve=2.0))
            except TimeoutError:
                log.warning("OTLP did not finish its last export in time; exiting without it")
        await self.poller.close(timeout=left(reserve=0.5))
        if self._runner is not None:
            await asyncio.wait_for(self._runner.cleanup(), timeout=left())

    async def wait_ready(self, timeout: float = 30.0) -> None:
        await asyncio.wait_for(self.poller.ready.wait(), timeout)


def _bound_port(runner: web.AppRunner) -> int | None:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return None


async def serve(config: Config, stop: asyncio.Event) -> None:
    exporter = Exporter(config)
    await exporter.start()
    try:
        await stop.wait()
    finally:
        await exporter.stop()


def install_signal_handlers(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)


def run(config: Config) -> int:
    logsetup.setup(config.log_level, config.log_format)

    async def main() -> None:
        stop = asyncio.Event()
        install_signal_handlers(stop)
        await serve(config, stop)

    try:
        asyncio.run(main())
    except OSError as exc:
        log.error("cannot start: %s", exc)
        return 1
    return exit_now_if_stuck(0)


def exit_now_if_stuck(code: int) -> int:
    """Interpreter exit waits for non-daemon threads; a library's own thread stuck in a
    driver call would hold the process past its grace period. Leave without waiting."""
    stuck = [
        t.name for t in threading.enumerate() if not t.daemon and t is not threading.main_thread()
    ]
    if stuck:
        log.warning("leaving threads still in calls behind: %s", ", ".join(stuck))
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
