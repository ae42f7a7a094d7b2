"""NVIDIA GPUs and MIG slices through NVML (nvidia-ml-py). The only module that imports pynvml.

Discovery (handles, UUIDs, names, PCI addresses, the MIG layout) is cached and redone
every `rediscover-interval`, when the GPU count changes or after a MIG call fails; a
cycle only reads what moves, batching counters into one `nvmlDeviceGetFieldValues` call
per GPU (never `nvmlDeviceGetPcieThroughput`: it blocks 20 ms per call). XID errors come
from an NVML event set waited on by a dedicated thread, so each is counted once.

Every call goes through `_Calls.get`: NOT_SUPPORTED (and a function the driver lacks)
becomes None, i.e. no series, never 0. GPU_IS_LOST fails only that GPU (it reports
`hw.status{hw.state="failed"}` and nothing else); UNINITIALIZED or DRIVER_NOT_LOADED mean
the driver went away: NVML is shut down and initialized again on the next cycle.
"""

from __future__ import annotations

import ctypes
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pynvml
from pynvml import (
    NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
    NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
    NVML_FI_DEV_MEMORY_TEMP,
    NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
    NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
    NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
    NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
    NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
    NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
    NVML_FI_DEV_PCIE_REPLAY_COUNTER,
    NVML_FI_DEV_REMAPPED_COR,
    NVML_FI_DEV_REMAPPED_FAILURE,
    NVML_FI_DEV_REMAPPED_PENDING,
    NVML_FI_DEV_REMAPPED_UNC,
    NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
)

from exporter.join import normalize_device_id, pci_address
from exporter.model import Device, DeviceReading, ProcessUsage, Sample, SourceResult
from exporter.sources import SourceContext, SourceOption, add, register
from exporter.sources.counters import MonotonicCounters

SOURCE = "nvml"
NO_INSTANCE = 0xFFFFFFFF
STATES = ("ok", "degraded", "failed")

THROTTLE_REASONS = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
)
"""NVML clock event reasons (`nvmlClocksEventReason*`) -> `hw.gpu.clock.throttle_reason`."""

CLOCKS = (("sm", pynvml.NVML_CLOCK_SM), ("memory", pynvml.NVML_CLOCK_MEM))
GPU_SENSOR = pynvml.NVML_TEMPERATURE_GPU


@dataclass(frozen=True, slots=True)
class _Field:
    field_id: int
    metric: str
    attributes: tuple[tuple[str, str], ...] = ()
    scale: float = 1.0
    counter: bool = False
    scope: int = 0


_ALL_LINKS = 0xFFFFFFFF
"""scopeId that sums a per-link NVLink field over every link."""


def _count(field_id: int, metric: str, key: str, value: str, **kw: Any) -> _Field:
    return _Field(field_id, metric, ((key, value),), counter=True, **kw)


def _errors(field_id: int, error_type: str) -> _Field:
    return _count(field_id, "hw.errors", "error.type", error_type)


_IO, _REMAP = "network.io.direction", "hw.gpu.memory.remap_cause"
_NVLINK = {"scale": 1024.0, "scope": _ALL_LINKS}  # KiB over all links

FIELDS = (
    _Field(NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, "hw.energy", scale=1e-3, counter=True),
    _Field(NVML_FI_DEV_MEMORY_TEMP, "hw.temperature", (("hw.sensor_location", "memory"),)),
    _count(NVML_FI_DEV_PCIE_COUNT_TX_BYTES, "hw.gpu.io", _IO, "transmit"),
    _count(NVML_FI_DEV_PCIE_COUNT_RX_BYTES, "hw.gpu.io", _IO, "receive"),
    _errors(NVML_FI_DEV_PCIE_REPLAY_COUNTER, "pcie_replay"),
    _errors(NVML_FI_DEV_ECC_SBE_VOL_TOTAL, "ecc_corrected"),
    _errors(NVML_FI_DEV_ECC_DBE_VOL_TOTAL, "ecc_uncorrected"),
    _Field(NVML_FI_DEV_REMAPPED_COR, "hw.gpu.memory.remapped_rows", ((_REMAP, "correctable"),)),
    _Field(NVML_FI_DEV_REMAPPED_UNC, "hw.gpu.memory.remapped_rows", ((_REMAP, "uncorrectable"),)),
    _Field(NVML_FI_DEV_REMAPPED_PENDING, "hw.gpu.memory.row_remap.pending"),
    _Field(NVML_FI_DEV_REMAPPED_FAILURE, "hw.gpu.memory.row_remap.failed"),
    _count(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, "hw.gpu.nvlink.io", _IO, "transmit", **_NVLINK),
    _count(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, "hw.gpu.nvlink.io", _IO, "receive", **_NVLINK),
    _errors(NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, "nvlink_crc"),
    _errors(NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, "nvlink_crc_flit"),
    _errors(NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL, "nvlink_replay"),
    _errors(NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL, "nvlink_recovery"),
)
"""Everything read through the one batched field-value call per GPU."""

_REINIT_ERRORS = {
    pynvml.NVML_ERROR_UNINITIALIZED,
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
}
_MISSING_ERRORS = {
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,  # the function, but not this struct version
}
_ABSENT_ERRORS = {pynvml.NVML_ERROR_NOT_SUPPORTED, *_MISSING_ERRORS}


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used this cycle (no driver, driver reloaded); retried next cycle."""


class _GpuLost(Exception):
    pass


class _DriverGone(Exception):
    pass


# --- the one place NVML errors are interpreted --------------------------------------------


class _Calls:
    def __init__(self, logger: logging.Logger) -> None:
        self.log = logger
        self.errors = 0
        self.missing: set[str] = set()
        """NVML functions this library lacks (logged once)."""

    def get(
        self, fn: Callable[..., Any], *args: Any, quiet: Iterable[int] = (), name: str = ""
    ) -> Any:
        """fn(*args), or None when the value does not exist here (NOT_SUPPORTED, function
        missing, a code in `quiet`) or could not be read (counted as a field error).
        `name` is the NVML function, where it is not the wrapper's name."""
        name = name or fn.__name__
        if name in self.missing:
            return None
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            self.interpret(exc, name, quiet)
            return None

    def newest(self, *calls: tuple[str, Callable[[], Any]]) -> Any:
        """The value of the first (NVML function, call) this driver has: newer functions
        first, older drivers fall through to the older ones."""
        for name, call in calls:
            value = self.get(call, name=name)
            if name not in self.missing:
                return value
        return None

    def interpret(self, exc: pynvml.NVMLError, what: str, quiet: Iterable[int] = ()) -> None:
        code = exc.value
        if code == pynvml.NVML_ERROR_GPU_IS_LOST:
            raise _GpuLost(what) from exc
        if code in _REINIT_ERRORS:
            raise _DriverGone(f"{what}: {exc}") from exc
        if code in _MISSING_ERRORS and what not in self.missing:
            self.missing.add(what)
            self.log.info("NVML here has no %s (an older driver): not calling it again", what)
        if code not in _ABSENT_ERRORS and code not in quiet:
            self.errors += 1
            self.log.debug("%s failed: %s", what, exc)


class _XidCounts:
    """XID events per (device id, xid), filled by the event thread, read by collect()."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[str, int]] = Counter()
        self._cond = threading.Condition()

    def add(self, device_id: str, xid: int) -> None:
        with self._cond:
            self._counts[(device_id, xid)] += 1
            self._cond.notify_all()

    def snapshot(self) -> dict[tuple[str, int], int]:
        with self._cond:
            return dict(self._counts)

    def wait_total(self, total: int, timeout: float) -> bool:
        """Block until `total` events were counted (tests; the event thread is async)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._counts.total() >= total, timeout)


# --- what discovery learns ----------------------------------------------------------------


@dataclass(slots=True)
class _Gpm:
    """Two GPM sample buffers: metrics are rates between the previous cycle and this one."""

    previous: Any
    current: Any
    primed: bool = False


@dataclass(slots=True)
class _Mig:
    handle: Any
    device: Device
    gi: int
    ci: int
    gpm: _Gpm | None = None


@dataclass(slots=True)
class _Gpu:
    handle: Any
    index: int
    device: Device
    mig_mode: bool
    migs: list[_Mig] = field(default_factory=list)
    gpm: _Gpm | None = None
    process_seen_us: int = 0


def _devices(gpus: Iterable[_Gpu]) -> Iterator[_Gpu | _Mig]:
    for gpu in gpus:
        yield gpu
        yield from gpu.migs


def _aliases(*ids: str) -> frozenset[str]:
    return frozenset(normalize_device_id(i)[0] for i in ids if i)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _handle_address(handle: Any) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


# --- the source ---------------------------------------------------------------------------


@register(
    SOURCE,
    help="NVIDIA GPUs and MIG slices through NVML (libnvidia-ml.so.1)",
    options=(
        SourceOption(
            "rediscover-interval",
            "how often to look for new GPUs and MIG layout changes",
            "60s",
        ),
        SourceOption("processes", "per-process GPU memory and utilization (true/false)", "true"),
        SourceOption("xid-events", "count XID errors from an NVML event set (true/false)", "true"),
    ),
)
class NvmlSource:
    def __init__(self, ctx: SourceContext) -> None:
        from exporter.cli import boolean, duration

        self.log = ctx.logger
        self.clock = ctx.clock or time.monotonic
        self.rediscover_interval = duration(ctx.options.get("rediscover-interval", "60s"))
        self.processes = boolean(ctx.options.get("processes", "true"))
        self.xid_events = boolean(ctx.options.get("xid-events", "true"))
        self.calls = _Calls(self.log)
        self.counters = MonotonicCounters()
        self.xids = _XidCounts()
        self._initialized = False
        self._gpus: list[_Gpu] | None = None
        self._count = 0
        self._discovered_at = 0.0
        self._gpm_pool: dict[str, _Gpm] = {}
        self._watcher: _XidWatcher | None = None
        self._xids_now: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()
        self.close_wait = 5.0
        """Seconds close() waits for a running collection."""

    # --- lifecycle ------------------------------------------------------------------

    def collect(self) -> SourceResult:
        with self._lock:
            self.calls.errors = 0
            self._xids_now = self.xids.snapshot()
            try:
                gpus = self._ready()
                readings: list[DeviceReading] = []
                processes: list[ProcessUsage] = []
                for gpu in gpus:
                    self._read_gpu(gpu, readings, processes)
            except _DriverGone as exc:
                self._shutdown()
                raise NvmlUnavailable(f"NVML lost the driver ({exc}); re-initializing") from exc
            return SourceResult(SOURCE, tuple(readings), tuple(processes), self.calls.errors)

    def close(self) -> None:
        # A driver call can hang (a GPU falling off the bus): do not hang shutdown with it.
        if not self._lock.acquire(timeout=self.close_wait):
            self.log.warning("NVML is still busy in a call; exiting without nvmlShutdown")
            return
        try:
            self._shutdown()
        finally:
            self._lock.release()

    def _ready(self) -> list[_Gpu]:
        if not self._initialized:
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as exc:
                raise NvmlUnavailable(f"NVML init failed: {exc}; retrying every cycle") from exc
            self._initialized = True
            self._gpus = None
        count = self.calls.get(pynvml.nvmlDeviceGetCount) or 0
        stale = self.clock() - self._discovered_at >= self.rediscover_interval
        if self._gpus is None or stale or count != self._count:
            self._gpus = self._discover(count)
        return self._gpus

    def _shutdown(self) -> None:
        self._stop_watcher()
        self._release_gpm(g.gpm for g in _devices(self._gpus or []))
        self._gpus = None
        if self._initialized:
            self._initialized = False
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError as exc:
                self.log.debug("nvmlShutdown: %s", exc)

    # --- discovery ------------------------------------------------------------------

    def _discover(self, count: int) -> list[_Gpu]:
        old = self._gpus or []
        previous = {gpu.index: gpu for gpu in old}
        # GPM buffers outlive a rediscovery: a device keeps its previous sample, so its
        # activity has no gap every rediscover-interval.
        self._gpm_pool = {d.device.id: d.gpm for d in _devices(old) if d.gpm is not None}
        driver = _text(self.calls.get(pynvml.nvmlSystemGetDriverVersion) or "")
        gpus = []
        for index in range(count):
            try:
                gpu = self._describe(index, driver)
            except _GpuLost:
                gpu = previous.get(index)
                if gpu is None:
                    self.calls.errors += 1
                    self.log.warning("GPU %d is lost (GPU_IS_LOST) and was never seen", index)
                for device in _devices([gpu] if gpu else []):
                    self._gpm_pool.pop(device.device.id, None)
            if gpu is not None:
                gpus.append(gpu)
        self._release_gpm(self._gpm_pool.values())
        self._gpm_pool = {}
        self._count = count
        self._discovered_at = self.clock()
        if self.xid_events:
            self._watch_xids(gpus)
        self.log.debug(
            "discovered %d GPUs, %d MIG devices", len(gpus), sum(len(g.migs) for g in gpus)
        )
        return gpus

    def _describe(self, index: int, driver: str) -> _Gpu | None:
        get = self.calls.get
        handle = get(pynvml.nvmlDeviceGetHandleByIndex, index)
        if handle is None:
            return None
        uuid = _text(get(pynvml.nvmlDeviceGetUUID, handle) or "")
        if not uuid:
            return None
        name = _text(get(pynvml.nvmlDeviceGetName, handle) or "")
        pci = get(pynvml.nvmlDeviceGetPciInfo, handle)
        bus_id = (pci_address(_text(pci.busId)) or "") if pci is not None else ""
        minor = get(pynvml.nvmlDeviceGetMinorNumber, handle)
        serial = get(pynvml.nvmlDeviceGetSerial, handle)
        mode = get(pynvml.nvmlDeviceGetMigMode, handle)
        mig_mode = bool(mode) and mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE
        common = (
            ("hw.gpu.index", str(index)),
            ("hw.gpu.minor", "" if minor is None else str(minor)),
            ("hw.pci.bus_id", bus_id),
            ("hw.driver_version", driver),
        )
        gke = f"nvidia{minor}" if minor is not None else ""
        device = Device(
            id=uuid,
            type="gpu",
            vendor="nvidia",
            model=name,
            source=SOURCE,
            attributes=(*common, ("hw.serial_number", _text(serial or ""))),
            aliases=_aliases(uuid, gke, bus_id, f"gpu.nvidia.com/gpu-{index}"),
        )
        gpu = _Gpu(handle, index, device, mig_mode)
        gpm = get(pynvml.nvmlGpmQueryDeviceSupport, handle)
        gpm_supported = gpm is not None and bool(gpm.isSupportedDevice)
        if gpm_supported and mig_mode:
            gpu.gpm = self._take_gpm(uuid)
        if mig_mode:
            gpu.migs = self._describe_migs(gpu, common, gke, gpm_supported)
        return gpu

    def _describe_migs(
        self, gpu: _Gpu, common: tuple[tuple[str, str], ...], gke: str, gpm: bool
    ) -> list[_Mig]:
        get = self.calls.get
        slots = get(pynvml.nvmlDeviceGetMaxMigDeviceCount, gpu.handle) or 0
        migs = []
        for slot in range(slots):
            handle = get(
                pynvml.nvmlDeviceGetMigDeviceHandleByIndex,
                gpu.handle,
                slot,
                quiet=(pynvml.NVML_ERROR_NOT_FOUND,),
            )
            if handle is None:
                continue
            uuid = _text(get(pynvml.nvmlDeviceGetUUID, handle) or "")
            name = _text(get(pynvml.nvmlDeviceGetName, handle) or "")
            gi = get(pynvml.nvmlDeviceGetGpuInstanceId, handle)
            ci = get(pynvml.nvmlDeviceGetComputeInstanceId, handle)
            if not uuid or gi is None or ci is None:
                continue
            profile = name.rsplit(" MIG ", 1)[1] if " MIG " in name else ""
            device = Device(
                id=uuid,
                type="gpu",
                vendor="nvidia",
                model=name,
                source=SOURCE,
                parent=gpu.device.id,
                attributes=(
                    *common,
                    ("hw.gpu.mig.profile", profile),
                    ("hw.gpu.mig.gpu_instance_id", str(gi)),
                    ("hw.gpu.mig.compute_instance_id", str(ci)),
                ),
                aliases=_aliases(
                    uuid, f"MIG-{gpu.device.id}/{gi}/{ci}", f"{gke}/gi{gi}" if gke else ""
                ),
            )
            migs.append(_Mig(handle, device, gi, ci, self._take_gpm(uuid) if gpm else None))
        return migs

    def _take_gpm(self, device_id: str) -> _Gpm | None:
        """The device's GPM buffers from before a rediscovery, or new ones."""
        kept = self._gpm_pool.pop(device_id, None)
        if kept is not None:
            return kept
        first = self.calls.get(pynvml.nvmlGpmSampleAlloc)
        second = self.calls.get(pynvml.nvmlGpmSampleAlloc)
        return _Gpm(first, second) if first is not None and second is not None else None

    def _release_gpm(self, pairs: Iterable[_Gpm | None]) -> None:
        for pair in pairs:
            if pair is None:
                continue
            for sample in (pair.previous, pair.current):
                try:
                    pynvml.nvmlGpmSampleFree(sample)
                except pynvml.NVMLError as exc:
                    self.log.debug("nvmlGpmSampleFree: %s", exc)

    def _watch_xids(self, gpus: list[_Gpu]) -> None:
        """Keep the event thread when the GPU handles are the same (a new event set
        would miss what happens in between), else start one on the new handles."""
        handles = frozenset((_handle_address(g.handle), g.device.id) for g in gpus)
        if self._watcher is not None and self._watcher.handles == handles:
            self._watcher.update(gpus)  # a new MIG layout changes where events count
            return
        self._stop_watcher()
        event_set = self.calls.get(pynvml.nvmlEventSetCreate)
        if event_set is not None:
            self._watcher = _XidWatcher(event_set, gpus, self.xids, self.calls, self.log)

    def _stop_watcher(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None

    # --- one cycle ------------------------------------------------------------------

    def _read_gpu(
        self, gpu: _Gpu, readings: list[DeviceReading], processes: list[ProcessUsage]
    ) -> None:
        try:
            samples, degraded = self._gpu_samples(gpu)
            errors = self.calls.errors
            mig_readings = [self._mig_reading(gpu, mig, processes) for mig in gpu.migs]
            if self.calls.errors > errors:
                # MIG handles die with their slice: the layout may have changed.
                self._discovered_at = -math.inf
            if self.processes and not gpu.mig_mode:
                self._processes(gpu.device.id, gpu.handle, samples, processes, gpu)
        except _GpuLost:
            readings.append(DeviceReading(gpu.device, _status("failed")))
            readings += [DeviceReading(m.device, _status("failed")) for m in gpu.migs]
            return
        samples += _status("degraded" if degraded else "ok")
        samples += self._xid_samples(gpu.device.id)
        readings.append(DeviceReading(gpu.device, tuple(samples)))
        readings += mig_readings

    def _gpu_samples(self, gpu: _Gpu) -> tuple[list[Sample], bool]:
        get, h = self.calls.get, gpu.handle
        samples: list[Sample] = []
        if not gpu.mig_mode:
            util = get(pynvml.nvmlDeviceGetUtilizationRates, h)
            if util is not None:
                add(samples, "hw.gpu.utilization", util.gpu / 100, ("hw.gpu.task", "general"))
                add(samples, "hw.gpu.memory.bandwidth.utilization", util.memory / 100)
        elif gpu.gpm is not None:
            self._gpm_samples(gpu.gpm, samples, pynvml.nvmlGpmSampleGet, h)
        for task, fn in (
            ("encoder", pynvml.nvmlDeviceGetEncoderUtilization),
            ("decoder", pynvml.nvmlDeviceGetDecoderUtilization),
        ):
            value = get(fn, h)
            add(samples, "hw.gpu.utilization", value and value[0] / 100, ("hw.gpu.task", task))
        self._memory_samples(h, samples)
        power = get(pynvml.nvmlDeviceGetPowerUsage, h)
        add(samples, "hw.power", power and power / 1000)
        limit = get(pynvml.nvmlDeviceGetEnforcedPowerLimit, h)
        add(samples, "hw.power.limit", limit and limit / 1000)
        add(samples, "hw.temperature", self._temperature(h), ("hw.sensor_location", "gpu"))
        for kind, clock in CLOCKS:
            mhz = get(pynvml.nvmlDeviceGetClockInfo, h, clock)
            add(samples, "hw.gpu.clock", mhz and mhz * 1e6, ("hw.gpu.clock.type", kind))
        reasons = self.calls.newest(  # renamed in R535
            (
                "nvmlDeviceGetCurrentClocksEventReasons",
                lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(h),
            ),
            (
                "nvmlDeviceGetCurrentClocksThrottleReasons",
                lambda: pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h),
            ),
        )
        if reasons is not None:
            for reason, bit in THROTTLE_REASONS:
                add(
                    samples,
                    "hw.gpu.clock.throttled",
                    1.0 if reasons & bit else 0.0,
                    ("hw.gpu.clock.throttle_reason", reason),
                )
        degraded = self._field_samples(gpu, samples)
        return samples, degraded

    def _temperature(self, handle: Any) -> float | None:
        # nvmlDeviceGetTemperature is deprecated (gone in CUDA 14); before R550 it is all
        # there is.
        temp = self.calls.newest(
            (
                "nvmlDeviceGetTemperatureV",
                lambda: pynvml.nvmlDeviceGetTemperatureV(handle, GPU_SENSOR),
            ),
            (
                "nvmlDeviceGetTemperature",
                lambda: pynvml.nvmlDeviceGetTemperature(handle, GPU_SENSOR),
            ),
        )
        return None if temp is None else float(temp)

    def _memory_samples(self, handle: Any, samples: list[Sample]) -> None:
        # Drivers before R510 have only v1, which counts the reserved memory as used.
        mem = self.calls.newest(
            (
                "nvmlDeviceGetMemoryInfo_v2",
                lambda: pynvml.nvmlDeviceGetMemoryInfo(handle, pynvml.nvmlMemory_v2),
            ),
            ("nvmlDeviceGetMemoryInfo", lambda: pynvml.nvmlDeviceGetMemoryInfo(handle)),
        )
        if mem is None:
            return
        add(samples, "hw.gpu.memory.usage", mem.used)
        add(samples, "hw.gpu.memory.limit", mem.total)
        add(samples, "hw.gpu.memory.free", mem.free)
        add(samples, "hw.gpu.memory.reserved", getattr(mem, "reserved", None))

    def _field_samples(self, gpu: _Gpu, samples: list[Sample]) -> bool:
        """The batched counters; True when a row remap is pending or has failed."""
        request = [(f.field_id, f.scope) for f in FIELDS]
        values = self.calls.get(pynvml.nvmlDeviceGetFieldValues, gpu.handle, request)
        degraded = False
        for i, spec in enumerate(FIELDS):
            key = (gpu.device.id, spec.field_id)
            ret = pynvml.NVML_ERROR_UNKNOWN if values is None else values[i].nvmlReturn
            if ret == pynvml.NVML_SUCCESS:
                raw = _field_number(values[i]) * spec.scale
                number = self.counters.update(key, raw) if spec.counter else raw
                add(samples, spec.metric, number, *spec.attributes)
                remap = spec.metric.startswith("hw.gpu.memory.row_remap")
                degraded |= remap and (number or 0.0) > 0
            elif ret == pynvml.NVML_ERROR_GPU_IS_LOST:
                raise _GpuLost("nvmlDeviceGetFieldValues")
            elif ret not in _ABSENT_ERRORS:
                if values is not None:  # (a failed call was counted once, not per field)
                    self.calls.errors += 1
                if spec.counter:
                    # A counter that failed to read keeps its last value; it does not vanish.
                    add(samples, spec.metric, self.counters.last(key), *spec.attributes)
        return degraded

    def _gpm_samples(
        self, gpm: _Gpm, samples: list[Sample], sample: Callable[..., Any], *args: Any
    ) -> None:
        """GPM activity since the previous cycle's sample (`sample(*args, buffer)`)."""
        if self.calls.get(sample, *args, gpm.current) is None:
            gpm.primed = False
            return
        if gpm.primed:
            request = pynvml.c_nvmlGpmMetricsGet_t()
            request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = 2
            request.sample1, request.sample2 = gpm.previous, gpm.current
            request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL
            request.metrics[1].metricId = pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL
            if self.calls.get(pynvml.nvmlGpmMetricsGet, request) is not None:
                busy, dram = request.metrics[0], request.metrics[1]
                if busy.nvmlReturn == pynvml.NVML_SUCCESS:
                    add(samples, "hw.gpu.utilization", busy.value / 100, ("hw.gpu.task", "general"))
                if dram.nvmlReturn == pynvml.NVML_SUCCESS:
                    add(samples, "hw.gpu.memory.bandwidth.utilization", dram.value / 100)
        gpm.previous, gpm.current = gpm.current, gpm.previous
        gpm.primed = True

    def _mig_reading(self, gpu: _Gpu, mig: _Mig, processes: list[ProcessUsage]) -> DeviceReading:
        samples: list[Sample] = []
        self._memory_samples(mig.handle, samples)
        if mig.gpm is not None:
            self._gpm_samples(mig.gpm, samples, pynvml.nvmlGpmMigSampleGet, gpu.handle, mig.gi)
        if self.processes:
            self._processes(mig.device.id, mig.handle, samples, processes, None)
        samples += _status("ok")
        samples += self._xid_samples(mig.device.id)
        return DeviceReading(mig.device, tuple(samples))

    def _processes(
        self,
        device_id: str,
        handle: Any,
        samples: list[Sample],
        processes: list[ProcessUsage],
        gpu: _Gpu | None,
    ) -> None:
        running = self.calls.get(pynvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
        busy: dict[int, float] = {}
        if gpu is not None and running:
            busy = self._process_utilization(gpu)
        for proc in running:
            pid = int(proc.pid)
            memory = None if proc.usedGpuMemory is None else float(proc.usedGpuMemory)
            utilization = busy.get(pid)
            add(samples, "hw.gpu.process.memory.usage", memory, ("process.pid", str(pid)))
            add(samples, "hw.gpu.process.utilization", utilization, ("process.pid", str(pid)))
            processes.append(ProcessUsage(device_id, pid, memory, utilization))

    def _process_utilization(self, gpu: _Gpu) -> dict[int, float]:
        """SM utilization per PID from the samples since the last cycle (the latest wins)."""
        found = self.calls.get(
            pynvml.nvmlDeviceGetProcessUtilization,
            gpu.handle,
            gpu.process_seen_us,
            quiet=(pynvml.NVML_ERROR_NOT_FOUND,),
        )
        latest: dict[int, tuple[int, float]] = {}
        for s in found or []:
            if s.timeStamp >= latest.get(s.pid, (-1, 0.0))[0]:
                latest[s.pid] = (s.timeStamp, s.smUtil / 100)
            gpu.process_seen_us = max(gpu.process_seen_us, s.timeStamp)
        return {pid: util for pid, (_, util) in latest.items()}

    def _xid_samples(self, device_id: str) -> list[Sample]:
        return [
            Sample("hw.gpu.xid.errors", float(n), (("hw.gpu.xid", str(xid)),))
            for (dev, xid), n in sorted(self._xids_now.items())
            if dev == device_id
        ]


def _status(state: str) -> tuple[Sample, ...]:
    return tuple(
        Sample("hw.status", 1.0 if s == state else 0.0, (("hw.state", s),)) for s in STATES
    )


def _field_number(value: Any) -> float:
    kind, v = value.valueType, value.value
    by_type = {
        pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
        pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
    }
    return float(getattr(v, by_type.get(kind, "ullVal")))


# --- XID events ---------------------------------------------------------------------------


class _XidWatcher:
    """A thread blocked in nvmlEventSetWait_v2, counting each XID event once."""

    WAIT_MS = 250

    def __init__(
        self,
        event_set: Any,
        gpus: list[_Gpu],
        counts: _XidCounts,
        calls: _Calls,
        logger: logging.Logger,
    ) -> None:
        self.counts = counts
        self.log = logger
        self.handles = frozenset((_handle_address(g.handle), g.device.id) for g in gpus)
        self._stop = threading.Event()
        self._gpus = {_handle_address(g.handle): g for g in gpus}
        # Registration happens here, on the collecting thread: events from the moment
        # discovery returns are in the set, none is lost to thread start-up.
        self._set = event_set
        try:
            for gpu in gpus:
                self._register(gpu, calls)
        except _DriverGone:
            self._free()
            raise
        self._thread = threading.Thread(target=self._run, name="nvml-xid-events", daemon=True)
        self._thread.start()

    def _register(self, gpu: _Gpu, calls: _Calls) -> None:
        try:
            pynvml.nvmlDeviceRegisterEvents(
                gpu.handle, pynvml.nvmlEventTypeXidCriticalError, self._set
            )
        except pynvml.NVMLError as exc:
            if exc.value != pynvml.NVML_ERROR_GPU_IS_LOST:  # a lost GPU sends no events
                calls.interpret(exc, "nvmlDeviceRegisterEvents")

    def _free(self) -> None:
        try:
            pynvml.nvmlEventSetFree(self._set)
        except pynvml.NVMLError as exc:
            self.log.debug("nvmlEventSetFree: %s", exc)

    def update(self, gpus: list[_Gpu]) -> None:
        self._gpus = {_handle_address(g.handle): g for g in gpus}  # one atomic swap

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        failing = ""
        try:
            while not self._stop.is_set():
                try:
                    data = pynvml.nvmlEventSetWait_v2(self._set, self.WAIT_MS)
                except pynvml.NVMLError_Timeout:
                    continue
                except pynvml.NVMLError as exc:
                    if str(exc) != failing:
                        failing = str(exc)
                        self.log.warning("waiting for XID events failed: %s", exc)
                    self._stop.wait(1.0)
                    continue
                failing = ""
                device_id = self._device_id(data)
                if device_id and data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                    self.counts.add(device_id, int(data.eventData))
        finally:
            self._free()

    def _device_id(self, data: Any) -> str:
        """The MIG slice the event names when it names one, else the GPU."""
        gpu = self._gpus.get(_handle_address(data.device))
        if gpu is None:
            return ""
        for mig in gpu.migs:
            if mig.gi == data.gpuInstanceId and data.computeInstanceId in (mig.ci, NO_INSTANCE):
                return mig.device.id
        return gpu.device.id
