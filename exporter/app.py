"""Composition root: config -> sources, kubelet client, poller, sinks, HTTP server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable, Coroutine, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from aiohttp import web

from exporter.attribution.resolver import ProcessResolver
from exporter.checks import host_path_problems
from exporter.cycle.collect import Collect
from exporter.cycle.pipeline import Pipeline, Stage, Step
from exporter.cycle.poller import Poller
from exporter.cycle.steps import (
    Attribution,
    Joiner,
    SnapshotBuilder,
    after,
    derive,
    dra_allocations,
    exporter_series,
    publish,
    unseen_warnings,
)
from exporter.cycle.steps import budget as budget_step
from exporter.derive.budget import Budget
from exporter.derive.energy import EnergyLedger
from exporter.derive.events import EventHub, Publisher
from exporter.derive.numa import CpuNodeMap
from exporter.derive.placement import PlacementReader
from exporter.dra.view import DraView
from exporter.ids import ResourceMatcher
from exporter.model import SourceResult
from exporter.podresources.client import PodResourcesClient
from exporter.runtime import log as logsetup
from exporter.runtime.heap import HeapTrimmer
from exporter.runtime.process import exit_now_if_stuck, install_signal_handlers
from exporter.runtime.threads import BoundedWorker, DaemonExecutor, in_daemon_thread
from exporter.settings.config import Config
from exporter.sinks import SelfMetrics, SnapshotSink
from exporter.sinks.prometheus import PrometheusSink
from exporter.sources import Source, SourceContext, registry
from exporter.web.app import DevicesView, make_app
from exporter.web.auth import security_middleware
from exporter.web.config import WebConfigError
from exporter.web.listen import ListenError, listen_problem
from exporter.web.reload import WebConfigWatcher
from exporter.web.server import GuardedServer, ServerLimits
from exporter.web.stats import ServerStats, request_logger

if TYPE_CHECKING:
    from exporter.dra.claimread import ClaimReader
    from exporter.dra.slicewatch import SliceWatcher
    from exporter.kubeapi.watcher import PodWatcher
    from exporter.sinks.k8sevents import KubeEventPoster
    from exporter.sinks.otlp_logs import OtlpLogSink

ALLOCATABLE_EVERY = 5.0
"""Seconds between two `GetAllocatableResources` calls at the most: every cycle at the
default 10 s interval; every fifth at 1 s, where each call costs about half a List's CPU
(docs/performance.md). A health change then shows within 5 s, against the alert's 1 m."""

log = logging.getLogger("exporter")

SOURCE_START_SECONDS = 10.0
"""A source's constructor reads a few files at most (netdev: is this the host's network
namespace?); one that takes longer is stuck in a read, and the exporter starts without it."""

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
        maker = BoundedWorker(f"start-{name}", idle_exit=0.0)
        try:
            sources[name] = maker.call(partial(info.factory, ctx), SOURCE_START_SECONDS)
        except TimeoutError:
            why = f"not made within {SOURCE_START_SECONDS:g}s (a host read stuck?)"
            log.warning("source %s could not start: %s", name, why)
            sources[name] = _Unavailable(TimeoutError(why))
        except Exception as exc:  # noqa: BLE001 - one broken source must not stop the others
            log.warning("source %s could not start: %s", name, exc)
            sources[name] = _Unavailable(exc)
    return sources


class Exporter:
    """The running agent. Tests and the simulator (`kde-simulate`) drive it in-process."""

    def __init__(self, config: Config, *, sources: Mapping[str, Source] | None = None) -> None:
        self.config = config
        self.prometheus = PrometheusSink(schema=config.metrics_schema)
        self.view = DevicesView(ResourceMatcher(config.resource_patterns))
        sinks: list[tuple[str, SnapshotSink]] = [
            ("prometheus", self.prometheus),
            ("landing", self.view),
        ]
        self.web_limits = ServerLimits(max_connections=config.web_max_connections)
        self.web_stats = ServerStats(self.web_limits.quiet_after)
        self_metrics: list[SelfMetrics] = [self.web_stats] if config.listen_address else []
        self.otlp = None
        if config.otlp.endpoint:
            from exporter.sinks.otlp import OtlpSink

            self.otlp = OtlpSink(config)
            sinks.append(("otlp", self.otlp))
            self_metrics.append(self.otlp)
        self.log_sink, self.event_poster = self._device_events(config, sinks, self_metrics)
        self.client = PodResourcesClient(
            config.kubelet_socket,
            timeout=config.podresources_timeout,
            max_message_bytes=config.podresources_max_message_bytes,
            allocatable_interval=ALLOCATABLE_EVERY,
        )
        self.kubeapi = None
        self.slices = None
        self.claims = None
        if config.kubernetes_api:
            self.kubeapi, self.slices, self.claims = build_watchers(config)
        self.dra = DraView(self.slices, self.kubeapi if self.slices else None, self.claims)
        self_metrics.append(self.dra)
        collect = Collect(
            build_sources(config) if sources is None else sources,
            self.client,
            interval=config.collect_interval,
            kubelet_every=config.podresources_poll_interval,
            source_timeout=config.collect_timeout,
            stale_after=config.podresources_stale_after,
            cpu_nodes=CpuNodeMap(config.sysfs, timeout=config.collect_timeout),
            pods=self.kubeapi,  # its pod events ask the kubelet (podresources/schedule.py)
        )
        pipeline = Pipeline(collect, self._steps(sinks, self_metrics), node=config.node_name)
        self.poller = Poller(pipeline, interval=config.collect_interval)
        self._runner: web.AppRunner | None = None
        self._server: GuardedServer | None = None
        self._task: asyncio.Task[None] | None = None
        self._kubeapi_task: asyncio.Task[None] | None = None
        self._events_task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self.port: int | None = None

    @property
    def url(self) -> str:
        host = (self.config.listen_address or ("", 0))[0] or "127.0.0.1"
        host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        host = f"[{host}]" if ":" in host else host
        scheme = "https" if self.web_stats.watcher and self.web_stats.watcher.config.tls else "http"
        return f"{scheme}://{host}:{self.port}/"

    def _steps(self, sinks: list[tuple[str, SnapshotSink]], own: list[SelfMetrics]) -> list[Step]:
        """Every cycle's steps after collect, in order (exporter/cycle/pipeline.py)."""
        config = self.config
        matcher = ResourceMatcher(config.resource_patterns)
        resolver = ProcessResolver(
            config.procfs, config.container_logs, timeout=config.collect_timeout
        )
        snapshot = SnapshotBuilder(
            config.node_name,
            health=self.client.health,
            pods=self.kubeapi,
            process_series=config.process_series,
            wall_clock=time.time,
        )
        budget = Budget(groups=config.metric_groups, max_series=config.metrics_max_series)
        return [
            Step("join", Stage.BUILD, Joiner(matcher, self.dra).run),
            dra_allocations(self.dra),
            Step("snapshot", Stage.BUILD, snapshot.run),
            Step("attribution", Stage.DERIVE, Attribution(resolver).run),
            derive("placement", PlacementReader(config.sysfs).step),
            derive("energy", EnergyLedger().step),
            unseen_warnings(matcher),
            exporter_series(own),
            budget_step(budget),
            *(publish(name, sink) for name, sink in sinks),
            after("heap-trim", HeapTrimmer().after_cycle),  # after a shrink, pages go back
            after("metrics-bodies", lambda _: self.prometheus.build_due()),
        ]

    @staticmethod
    def _device_events(
        config: Config, sinks: list[tuple[str, SnapshotSink]], self_metrics: list[SelfMetrics]
    ) -> tuple[OtlpLogSink | None, KubeEventPoster | None]:
        """Device events (docs/events.md) as OTLP log records when OTLP is on, and as
        Kubernetes Events with --kubernetes.events."""
        log_sink = poster = None
        if config.otlp.endpoint:
            from exporter.sinks.otlp_logs import OtlpLogSink  # the SDK loads only when used

            log_sink = OtlpLogSink(config)
            self_metrics.append(log_sink)
        if config.kubernetes_events:
            from exporter.sinks.k8sevents import build_poster

            poster = build_poster(config)
        publishers: list[Publisher] = [p.publish for p in (log_sink, poster) if p is not None]
        if publishers:
            hub = EventHub(publishers)
            sinks.append(("device-events", hub))
            self_metrics.append(hub)
        if poster is not None:
            self_metrics.append(poster)
        return log_sink, poster

    async def start(self) -> None:
        if self.config.listen_address is not None:
            await self._start_server(self.config.listen_address)
            host = self.config.listen_address[0]
            if host in ("", "0.0.0.0", "::"):
                log.info("serving on all addresses, port %d (here: %s)", self.port, self.url)
            else:
                log.info("serving on %s", self.url)
        if self.otlp is not None:
            self.otlp.start()
        if self.kubeapi is not None:
            from exporter.kubeapi.listwatch import supervise

            watches = [supervise("the Kubernetes API pod watch", self.kubeapi.run, self._stop)]
            if self.slices is not None:
                watches.append(supervise("the ResourceSlice watch", self.slices.run, self._stop))
            if self.claims is not None:
                watches.append(supervise("the ResourceClaim reads", self.claims.run, self._stop))
            self._kubeapi_task = asyncio.create_task(_together(*watches))
        if self.log_sink is not None:
            self.log_sink.start()
        if self.event_poster is not None:
            self._events_task = asyncio.create_task(self.event_poster.run(self._stop))
        self._task = asyncio.create_task(self.poller.run_forever(self._stop))

    async def _start_server(self, address: tuple[str, int]) -> None:
        """The aiohttp app behind GuardedServer (limits, TLS, auth from --web.config.file)."""
        watcher = None
        app = make_app(self.prometheus, self.view, lambda: self.poller.restart_required)
        if self.config.web_config_file is not None:
            watcher = WebConfigWatcher(self.config.web_config_file)
            app.middlewares.append(security_middleware(watcher, self.web_stats))
            self.web_stats.watcher = watcher
        self._runner = web.AppRunner(
            app,
            access_log=None,
            logger=request_logger(self.web_stats),
            keepalive_timeout=self.web_limits.idle_timeout,
        )
        await self._runner.setup()
        self._server = GuardedServer(self._runner, self.web_limits, self.web_stats, watcher)
        try:
            self.port = await self._server.start(address[0] or None, address[1])
        except OSError as exc:
            raise ListenError(listen_problem(address, exc)) from exc

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
        if self._kubeapi_task is not None:
            self._kubeapi_task.cancel()  # a watch waits on the server; nothing to finish
            with contextlib.suppress(asyncio.CancelledError, TimeoutError, Exception):
                await asyncio.wait_for(self._kubeapi_task, timeout=left(reserve=3.0))
        if self._events_task is not None:
            self._events_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._events_task
        if self.log_sink is not None:
            logs = in_daemon_thread(self.log_sink.shutdown, "otlp-logs-shutdown")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(logs, timeout=left(reserve=3.0))
        if self.otlp is not None:
            otlp = self.otlp
            flushing = in_daemon_thread(otlp.shutdown, "otlp-shutdown")
            try:
                await asyncio.wait_for(flushing, timeout=left(reserve=2.0))
            except TimeoutError:
                log.warning("OTLP did not finish its last export in time; exiting without it")
        await self.poller.close(timeout=left(reserve=0.5))
        if self._server is not None:
            await asyncio.wait_for(self._server.stop(), timeout=left(reserve=0.3))
        if self._runner is not None:
            await asyncio.wait_for(self._runner.cleanup(), timeout=left())

    async def wait_ready(self, timeout: float = 30.0) -> None:
        await asyncio.wait_for(self.poller.ready.wait(), timeout)

    def reload(self) -> None:
        """SIGHUP: re-read what can change without a restart (--web.config.file), as
        Prometheus does on HUP; everything else is a flag, read once."""
        watcher = self.web_stats.watcher
        if watcher is None:
            log.info("SIGHUP: nothing to reload (no --web.config.file)")
            return
        log.info("SIGHUP: reloading %s", watcher.path)
        watcher.reload(" on SIGHUP")


async def serve(exporter: Exporter, stop: asyncio.Event) -> None:
    await exporter.start()
    with contextlib.suppress(NotImplementedError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, exporter.reload)
    try:
        await stop.wait()
    finally:
        await exporter.stop()


def run(config: Config) -> int:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # until Exporter.reload takes it: never fatal
    logsetup.setup(config.log_level, config.log_format)
    for problem in (*config.notices, *host_path_problems(config)):
        log.warning("%s", problem)

    async def main() -> None:
        # asyncio.run ends by waiting for the default executor's threads: a host read stuck
        # in one would hold SIGTERM for ever. Daemon threads, never waited for.
        asyncio.get_running_loop().set_default_executor(DaemonExecutor())
        # Sources are made (some read sysfs) before SIGTERM is the loop's: a read that hangs
        # meanwhile blocks the loop, and SIGTERM's default action still ends the process.
        exporter = Exporter(config)
        stop = asyncio.Event()
        install_signal_handlers(stop)
        await serve(exporter, stop)

    try:
        asyncio.run(main())
    except (OSError, WebConfigError, ListenError) as exc:
        log.error("cannot start: %s", exc)
        return 1
    return exit_now_if_stuck(0)


async def _together(*watches: Coroutine[Any, Any, None]) -> None:
    """The API watches as one task (cancelled together at shutdown)."""
    await asyncio.gather(*watches)


def build_watchers(config: Config) -> tuple[PodWatcher, SliceWatcher | None, ClaimReader | None]:
    """The pod watch, and with `--kubernetes.dra` the ResourceSlice watch and the claim reads,
    on one client; imported here, when used (it costs start-up time otherwise)."""
    from exporter.dra.claimhealth import read_pod_status
    from exporter.dra.claimread import ClaimReader
    from exporter.dra.slicewatch import SliceWatcher
    from exporter.kubeapi import pod_watcher, shared_connect

    dra = config.kubernetes_dra
    connect = shared_connect(config, pod_status=read_pod_status if dra else None)
    slices = (
        SliceWatcher(connect, config.node_name, max_slices=config.kubernetes_max_resource_slices)
        if dra
        else None
    )
    claims = ClaimReader(connect) if dra else None
    return pod_watcher(config, connect), slices, claims
