"""The NVML source: init and its failures, rediscovery, one cycle, lost GPUs, shutdown.

Rules, each from `behaviour.py`: no library or no driver before NVML ever worked here is
"no NVIDIA hardware" (success, zero devices); after it worked, init failing is a failure,
and past `restart-after` the source asks for a new process (/healthz fails), because a
process keeps the libnvidia-ml it mapped first. Discovery is cached and redone on a timer,
after a stale or lost handle, and when a GPU's MIG mode reads differently; never because
of the device count, which real NVML fixes at init. A GPU seen once and now lost stays as
`hw.status{hw.state="failed"}` for `lost-retention`, across rediscoveries and reloads.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass

import pynvml

from exporter.model import Device, DeviceReading, ProcessUsage, SourceResult
from exporter.settings.values import boolean, duration
from exporter.sources import (
    RestartRequired,
    SourceContext,
    SourceOption,
    option_values,
    register,
)
from exporter.sources.nvml.assemble import CycleReadings, status
from exporter.sources.nvml.behaviour import ABSENT_AT_INIT
from exporter.sources.nvml.calls import Calls, DriverGone, GpuLost, NvmlUnavailable, text
from exporter.sources.nvml.discovery import SOURCE, Discovery, Gpu, devices, mig_mode
from exporter.sources.nvml.gpm import interval as gpm_interval
from exporter.sources.nvml.gpm import release as release_gpm
from exporter.sources.nvml.readings import Reader
from exporter.sources.nvml.xid import XidCounts, XidEvents, handle_key


@dataclass(slots=True)
class _Lost:
    device: Device
    migs: tuple[Device, ...]
    since: float


OPTIONS = (
    SourceOption(
        "rediscover-interval",
        "how often to look for new GPUs and MIG layout changes",
        "60s",
        duration,
    ),
    SourceOption("processes", "per-process GPU memory and utilization", "true", boolean),
    SourceOption("xid-events", "count XID errors from an NVML event set", "true", boolean),
    SourceOption(
        "slow-interval",
        "how often to read what costs milliseconds per GPU on real drivers (energy and "
        "PCIe counters, per-process utilization, the MIG mode check); between reads "
        "counters keep their last value",
        "10s",
        duration,
    ),
    SourceOption(
        "gpm-interval",
        "how often to take a GPM sample (Hopper and later: SM, tensor, FP64/32/16 pipe "
        "and DRAM activity, PCIe and NVLink throughput, whole GPUs and MIG slices); each "
        "value is the mean between two samples this far apart (over 100ms, nvml.h)",
        "10s",
        gpm_interval,
    ),
    SourceOption(
        "restart-after",
        "after NVML worked, how long init may fail before /healthz asks for a restart "
        "(a driver upgrade leaves this process with the old library)",
        "2m",
        duration,
    ),
    SourceOption(
        "lost-retention",
        "how long a GPU that was seen and is now lost keeps reporting hw_status failed",
        "24h",
        duration,
    ),
)


@register(
    SOURCE,
    help="NVIDIA GPUs and MIG slices through NVML (libnvidia-ml.so.1)",
    options=OPTIONS,
)
class NvmlSource:
    def __init__(self, ctx: SourceContext) -> None:
        self.log = ctx.logger
        self.clock = ctx.clock or time.monotonic
        options = option_values(OPTIONS, ctx.options)
        self.rediscover_interval: float = options["rediscover-interval"]
        self.processes: bool = options["processes"]
        self.xid_events: bool = options["xid-events"]
        self.restart_after: float = options["restart-after"]
        self.lost_retention: float = options["lost-retention"]
        self.calls = Calls(self.log)
        self.discovery = Discovery(self.calls)
        self.slow_interval: float = options["slow-interval"]
        self.gpm_interval: float = options["gpm-interval"]
        self.reader = Reader(self.calls, self.clock, self.slow_interval, self.gpm_interval)
        self.xids = XidCounts()
        self._initialized = False
        self._worked = False
        self._failing_since: float | None = None
        self._absent_said = ""
        self._gpus: list[Gpu] | None = None
        self._discovered_at = 0.0
        self._lost: dict[str, _Lost] = {}
        self._known: list[Gpu] = []
        """The GPUs of the last discovery, kept across driver reloads (lost detection)."""
        self._events: XidEvents | None = None
        self.cycle = CycleReadings(self.reader, self.calls, self.clock, processes=self.processes)
        self._lock = threading.Lock()

    # --- lifecycle ------------------------------------------------------------------

    def collect(self) -> SourceResult:
        with self._lock:
            self.calls.errors = 0
            try:
                gpus = self._ready()
                if gpus is None:
                    return SourceResult(SOURCE, absent=self._absent_said)
                if self._events is not None:
                    self._events.drain()
                self.reader.now = self.clock()
                counts, latest = self.xids.snapshot_with_latest()
                self.cycle.begin(counts, latest, events=self._events is not None)
                readings: list[DeviceReading] = []
                processes: list[ProcessUsage] = []
                for gpu in gpus:
                    self.cycle.read_gpu(gpu, readings, processes)
                readings += self._lost_readings(gpus)
            except DriverGone as exc:
                self._shutdown()
                raise self._init_failed(f"NVML lost the driver ({exc}); re-initializing") from exc
            self._failing_since = None
            # counter reads held as glitches (see sources/counters.py) are field errors too
            self.calls.errors += self.reader.counters.take_rejected()
            if self.calls.stale:
                self._discovered_at = -math.inf  # a handle went stale: rediscover next cycle
            return SourceResult(SOURCE, tuple(readings), tuple(processes), self.calls.errors)

    def close(self) -> None:
        # A driver call can hang (a GPU falling off the bus): do not hang shutdown with it.
        if not self._lock.acquire(timeout=1.0):
            self.log.warning("NVML is still busy in a call; exiting without nvmlShutdown")
            return
        try:
            self._shutdown()
        finally:
            self._lock.release()

    def _ready(self) -> list[Gpu] | None:
        """The GPUs, or None when this node has no NVIDIA driver or library (absent)."""
        if not self._initialized:
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as exc:
                if exc.value in ABSENT_AT_INIT and not self._worked:
                    self._say_absent(exc)
                    return None
                raise self._init_failed(f"NVML init failed: {exc}; retrying every cycle") from exc
            self._initialized = True
            self._gpus = None
            if not self._worked:
                self._worked = True
                self.log.info("NVML initialized (driver %s)", self._driver())
        if self._gpus is None or self._rediscovery_due(self._gpus):
            self._gpus = self._discover()
        return self._gpus

    def _say_absent(self, exc: pynvml.NVMLError) -> None:
        if exc.value == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
            reason = "libnvidia-ml.so.1 not found (no NVIDIA driver mounted into this pod)"
        else:
            reason = "the NVIDIA driver is not loaded on this node"
        if reason != self._absent_said:
            self._absent_said = reason
            self.log.info("no NVIDIA GPUs here: %s", reason)

    def _init_failed(self, message: str) -> RuntimeError:
        """The error for a failed init; a RestartRequired once NVML that worked in this
        process has failed for `restart-after`."""
        now = self.clock()
        if self._failing_since is None:
            self._failing_since = now
        if self._worked and now - self._failing_since >= self.restart_after:
            return RestartRequired(
                f"{message}; NVML has failed for {now - self._failing_since:.0f}s after it "
                "worked: a driver upgrade or reload leaves this process with the old "
                "libnvidia-ml, only a new container loads the new one"
            )
        return NvmlUnavailable(message)

    def _driver(self) -> str:
        return text(self.calls.get(pynvml.nvmlSystemGetDriverVersion) or "")

    def _rediscovery_due(self, gpus: list[Gpu]) -> bool:
        if self.clock() - self._discovered_at >= self.rediscover_interval:
            return True
        # The MIG mode (a costly call per GPU) is checked with the slow values, and so are
        # the slots that were empty: a DRA driver makes a slice when it prepares a claim
        # (dra-driver-nvidia-gpu nvlib.go createMigDevice), with no mode change. A slice
        # destroyed shows as a stale handle.
        try:
            return any(
                mig_mode(self.calls, g.handle) != g.mig_mode
                or (g.mig_mode and self.discovery.new_slice(g))
                for g in gpus
                if self.reader.slow_due(g)
            )
        except GpuLost:
            return True  # it moves to the lost list now

    def _shutdown(self) -> None:
        self._close_events()
        release_gpm((d.gpm for d in devices(self._gpus or [])), self.log)
        self._gpus = None
        if self._initialized:
            self._initialized = False
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError as exc:
                self.log.debug("nvmlShutdown: %s", exc)

    # --- discovery ------------------------------------------------------------------

    def _discover(self) -> list[Gpu]:
        old = self._gpus or []
        self.calls.stale = False
        # GPM buffers outlive a rediscovery: a device keeps its previous sample.
        self.discovery.gpm_pool = {d.device.id: d.gpm for d in devices(old) if d.gpm}
        driver = self._driver()
        count = self.calls.get(pynvml.nvmlDeviceGetCount) or 0
        gpus = []
        for index in range(count):
            try:
                gpu = self.discovery.gpu(index, driver)
            except GpuLost:
                gpu = None
                if not any(g.index == index for g in self._known):
                    self.calls.errors += 1
                    self.log.warning("GPU %d is lost (GPU_IS_LOST) and was never seen", index)
            if gpu is not None:
                gpus.append(gpu)
        release_gpm(self.discovery.gpm_pool.values(), self.log)
        self.discovery.gpm_pool = {}
        self.discovery.say_no_gpm()
        self._remember(self._known, gpus)
        self._known = gpus
        self.cycle.discovered(gpus)
        self._discovered_at = self.clock()
        if self.xid_events:
            self._watch_xids(gpus)
        self.log.debug(
            "discovered %d GPUs, %d MIG devices", len(gpus), sum(len(g.migs) for g in gpus)
        )
        return gpus

    def _remember(self, old: list[Gpu], gpus: list[Gpu]) -> None:
        """GPUs of the previous discovery that are gone now are lost, not forgotten."""
        now = self.clock()
        seen = {g.device.id for g in gpus}
        for gpu in old:
            if gpu.device.id not in seen and gpu.device.id not in self._lost:
                self.log.warning(
                    "GPU %s (index %d) is no longer reachable: reported failed for %gs",
                    gpu.device.id,
                    gpu.index,
                    self.lost_retention,
                )
                migs = tuple(m.device for m in gpu.migs)
                self._lost[gpu.device.id] = _Lost(gpu.device, migs, now)
        for device_id in seen & self._lost.keys():
            self.log.info("GPU %s is back", device_id)
            del self._lost[device_id]

    def _lost_readings(self, gpus: list[Gpu]) -> list[DeviceReading]:
        now = self.clock()
        for device_id, lost in list(self._lost.items()):
            if now - lost.since > self.lost_retention:
                del self._lost[device_id]
        failed = status("failed")
        return [
            DeviceReading(device, failed)
            for lost in self._lost.values()
            for device in (lost.device, *lost.migs)
        ]

    def _watch_xids(self, gpus: list[Gpu]) -> None:
        """Keep the event set when the GPU handles are the same (a new one would miss
        what happens in between), else register the new handles in a new one."""
        if self._events is not None and self._events.handles == handle_key(gpus):
            self._events.update(gpus)  # a new MIG layout changes where events count
            return
        self._close_events()
        event_set = self.calls.get(pynvml.nvmlEventSetCreate)
        if event_set is not None:
            self._events = XidEvents(event_set, gpus, self.xids, self.calls, self.log)

    def _close_events(self) -> None:
        if self._events is not None:
            self._events.close()
            self._events = None
