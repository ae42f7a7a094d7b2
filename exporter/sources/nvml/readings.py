"""One cycle's reads of a discovered GPU and its MIG slices: what moves, in base units.

Counters are batched into one `nvmlDeviceGetFieldValues` call per GPU (never
`nvmlDeviceGetPcieThroughput`: it blocks for a sampling period on every call).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
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

from exporter.metrics import THROTTLE_REASONS
from exporter.model import Sample
from exporter.sources import add
from exporter.sources.counters import MonotonicCounters
from exporter.sources.nvml.behaviour import NOT_HERE
from exporter.sources.nvml.calls import Calls, GpuLost
from exporter.sources.nvml.discovery import Gpu, Mig
from exporter.sources.nvml.gpm import Gpm
from exporter.sources.nvml.gpm import read as gpm_read
from exporter.sources.nvml.structs import FieldBatch, MemoryRead

STATES = ("ok", "degraded", "failed")

GPM_RETRIES = 3
"""GPM reads in a row, one per cycle, that may give no rate before the slow interval rules."""

PROCESS_LISTS = (
    pynvml.nvmlDeviceGetComputeRunningProcesses,
    pynvml.nvmlDeviceGetGraphicsRunningProcesses,
    pynvml.nvmlDeviceGetMPSComputeRunningProcesses,
)
"""Compute first: it is read every cycle, the other two while they list anyone."""

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
    slow: bool = False
    """A costly call on a real driver (docs/nvml.md): read every `slow-interval`, not every
    cycle."""


_ALL_LINKS = 0xFFFFFFFF
"""scopeId that sums a per-link NVLink field over every link."""


def _count(field_id: int, metric: str, key: str, value: str, **kw: Any) -> _Field:
    return _Field(field_id, metric, ((key, value),), counter=True, **kw)


def _errors(field_id: int, error_type: str) -> _Field:
    return _count(field_id, "hw.errors", "error.type", error_type)


_IO, _REMAP = "network.io.direction", "hw.gpu.memory.remap_cause"
_NVLINK = {"scale": 1024.0, "scope": _ALL_LINKS}  # KiB over all links

# The slow fields cost a real driver far more per call than the others (measured with
# `python -m bench.nvml_probe`: docs/design-figures.md). They are counters; between reads
# they keep their last value.
FIELDS = (
    _Field(NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, "hw.energy", scale=1e-3, counter=True, slow=True),
    _Field(NVML_FI_DEV_MEMORY_TEMP, "hw.temperature", (("hw.sensor_location", "memory"),)),
    _count(NVML_FI_DEV_PCIE_COUNT_TX_BYTES, "hw.gpu.io", _IO, "transmit", slow=True),
    _count(NVML_FI_DEV_PCIE_COUNT_RX_BYTES, "hw.gpu.io", _IO, "receive", slow=True),
    _count(NVML_FI_DEV_PCIE_REPLAY_COUNTER, "hw.errors", "error.type", "pcie_replay", slow=True),
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
_FAST = tuple(f for f in FIELDS if not f.slow)
_SLOW = tuple(f for f in FIELDS if f.slow)
_REQUEST_ALL = tuple((f.field_id, f.scope) for f in FIELDS)
_REQUEST_FAST = tuple((f.field_id, f.scope) for f in _FAST)
"""The field-value requests of a cycle with the slow fields and of one without."""
_UNREAD = (pynvml.NVML_ERROR_UNKNOWN, 0.0)
"""A field of a batch whose call failed (counted once, as the call)."""
_REMAP_FLAGS = frozenset(
    f.field_id for f in FIELDS if f.metric.startswith("hw.gpu.memory.row_remap")
)


class Reader:
    """Reads the moving values of discovered devices; counters survive driver reloads.
    What costs milliseconds on a real driver is read every `slow_interval` seconds."""

    def __init__(
        self,
        calls: Calls,
        clock: Callable[[], float],
        slow_interval: float = 10.0,
        gpm_interval: float = 10.0,
    ) -> None:
        self.calls = calls
        self.counters = MonotonicCounters()
        self.clock = clock
        self.slow_interval = slow_interval
        self.gpm_interval = gpm_interval
        self._gpm_read_at: dict[str, float] = {}
        """Per device: when its GPM sample was last taken on the GPM interval."""
        self._memory = MemoryRead()
        self._all, self._fast = FieldBatch(_REQUEST_ALL), FieldBatch(_REQUEST_FAST)
        """Reused on every call: a Reader is used by one thread at a time (collect())."""
        self._busy: dict[str, dict[int, float] | None] = {}
        self._gpm_last: dict[str, list[Sample]] = {}
        self._gpm_empty: dict[str, int] = {}
        """Per device: how many GPM reads in a row gave no rate."""
        self._lists_used: dict[str, set[str]] = {}
        """Per device, the process lists that listed a process at their last read."""
        """The last GPM activity per device (between slow reads)."""
        """The last per-process utilization read per GPU (between slow reads)."""

    def slow_due(self, gpu: Gpu) -> bool:
        """Whether this cycle reads the slow values of `gpu` (decided once per cycle)."""
        return self.clock() - gpu.slow_read_at >= self.slow_interval

    def gpu_samples(self, gpu: Gpu) -> tuple[list[Sample], bool]:
        get, h = self.calls.get, gpu.handle
        samples: list[Sample] = []
        if not gpu.mig_mode:
            util = get(pynvml.nvmlDeviceGetUtilizationRates, h, handle=True)
            if util is not None:
                add(samples, "hw.gpu.utilization", util.gpu / 100, ("hw.gpu.task", "general"))
                add(samples, "hw.gpu.memory.bandwidth.utilization", util.memory / 100)
        if gpu.gpm is not None:
            samples += self._gpm(
                gpu.device.id, pynvml.nvmlGpmSampleGet, h, gpm=gpu.gpm, mig=gpu.mig_mode
            )
        for task, fn in (
            ("encoder", pynvml.nvmlDeviceGetEncoderUtilization),
            ("decoder", pynvml.nvmlDeviceGetDecoderUtilization),
        ):
            value = get(fn, h)
            add(samples, "hw.gpu.utilization", value and value[0] / 100, ("hw.gpu.task", task))
        self.memory_samples(h, samples)
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
        degraded = self.field_samples(gpu, samples)
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

    def memory_samples(self, handle: Any, samples: list[Sample]) -> None:
        # Drivers before R510 have only v1, which counts the reserved memory as used.
        memory = self._memory
        mem = self.calls.newest(
            ("nvmlDeviceGetMemoryInfo_v2", partial(memory.v2, handle)),
            ("nvmlDeviceGetMemoryInfo", partial(memory.v1, handle)),
        )
        if mem is None:
            return
        total, free, used, reserved = mem
        add(samples, "hw.gpu.memory.usage", used)
        add(samples, "hw.gpu.memory.limit", total)
        add(samples, "hw.gpu.memory.free", free)
        add(samples, "hw.gpu.memory.reserved", reserved)

    def field_samples(self, gpu: Gpu, samples: list[Sample]) -> bool:
        """The batched counters; True when a row remap is pending or has failed."""
        fields, batch = (FIELDS, self._all) if gpu.slow_now else (_FAST, self._fast)
        for spec in () if gpu.slow_now else _SLOW:  # between slow reads: the last value
            last = self.counters.last((gpu.device.id, spec.field_id))
            add(samples, spec.metric, last, *spec.attributes)
        values = self.calls.get(batch.read, gpu.handle, name="nvmlDeviceGetFieldValues")
        degraded = False
        for i, spec in enumerate(fields):
            key = (gpu.device.id, spec.field_id)
            ret, number = _UNREAD if values is None else values[i]
            if ret == pynvml.NVML_SUCCESS:
                raw = number * spec.scale
                number = self.counters.update(key, raw) if spec.counter else raw
                add(samples, spec.metric, number, *spec.attributes)
                degraded |= spec.field_id in _REMAP_FLAGS and (number or 0.0) > 0
            elif ret == pynvml.NVML_ERROR_GPU_IS_LOST:
                raise GpuLost("nvmlDeviceGetFieldValues")
            elif ret not in NOT_HERE:
                if values is not None:  # (a failed call was counted once, not per field)
                    self.calls.errors += 1
                if spec.counter:
                    # A counter that failed to read keeps its last value; it does not vanish.
                    add(samples, spec.metric, self.counters.last(key), *spec.attributes)
        return degraded

    def mig_samples(self, gpu: Gpu, mig: Mig) -> list[Sample]:
        samples: list[Sample] = []
        self.memory_samples(mig.handle, samples)
        if mig.gpm is not None:
            samples += self._gpm(
                mig.device.id, pynvml.nvmlGpmMigSampleGet, gpu.handle, mig.gi, gpm=mig.gpm, mig=True
            )
        return samples

    def _gpm(
        self, device_id: str, sample: Callable[..., Any], *args: Any, gpm: Gpm, mig: bool
    ) -> list[Sample]:
        """GPM activity, measured every `gpm_interval` (its cost per call: docs/nvml.md);
        between two measurements the last one stands. The rate covers the time since the last
        sample, so consecutive samples are `gpm_interval` apart (nvml.h asks for over 100 ms)."""
        now = self.clock()
        empty = self._gpm_empty.get(device_id, 0)
        due = now - self._gpm_read_at.get(device_id, -math.inf) >= self.gpm_interval
        if due or 0 < empty < GPM_RETRIES:
            found: list[Sample] = []
            gpm_read(self.calls, gpm, found, sample, *args, mig=mig)
            self._gpm_last[device_id] = found
            if due:
                self._gpm_read_at[device_id] = now
            # A read without a rate (the first only primes the buffers; two samples too
            # close together have none) is tried again the next cycles, a few times; a
            # device whose GPM keeps failing waits for the GPM interval like any other
            # (never a costly call per device per cycle).
            self._gpm_empty[device_id] = 0 if found else empty + 1
        return list(self._gpm_last.get(device_id, ()))

    def processes(
        self, device_id: str, handle: Any, gpu: Gpu | None, *, slow: bool
    ) -> list[tuple[int, float | None, float | None]]:
        """(host PID, memory bytes, SM utilization) of the processes on a GPU or MIG handle.

        Memory from the compute, graphics and MPS-client lists (nvml.h: "processes with a
        Multi-Process Service (MPS) compute context"), which show only processes of the
        caller's PID namespace (docs/nvml.md, measured: a pod without hostPID sees none);
        utilization, for a whole GPU (`gpu`) and never under MIG, from the driver's
        samples, which carry host PIDs whatever the caller's namespace. A PID only sampled
        has no memory reading (None, not 0).

        The compute list is read every cycle. The graphics and MPS lists, empty on most
        nodes (no graphics under MIG; MPS only where a plugin shares a GPU through it),
        are read every cycle only while they list a process, and otherwise on the slow
        interval: on a dense MIG node that is two calls in three saved, and a graphics or MPS
        process on a device whose list was empty shows within `slow-interval`."""
        memory: dict[int, float | None] = {}
        # Before a device's first read, every list is read.
        used = self._lists_used.get(device_id, {f.__name__ for f in PROCESS_LISTS})
        listed: set[str] = set()
        for fn in PROCESS_LISTS:
            if fn is not PROCESS_LISTS[0] and not slow and fn.__name__ not in used:
                continue
            for proc in self.calls.get(fn, handle, handle=True) or []:
                pid = int(proc.pid)
                used_memory = None if proc.usedGpuMemory is None else float(proc.usedGpuMemory)
                # A process in several lists has one allocation, not two.
                memory[pid] = _largest(memory.get(pid), used_memory)
                listed.add(fn.__name__)
        self._lists_used[device_id] = listed
        busy: dict[int, float] | None = None
        if gpu is not None:
            if gpu.slow_now or gpu.device.id not in self._busy:
                self._busy[gpu.device.id] = self.process_utilization(gpu)
            busy = self._busy[gpu.device.id]
        found = []
        for pid in sorted(memory.keys() | (busy or {}).keys()):
            # When the driver returned samples, a listed process without one was idle in
            # those periods (behaviour `process-utilization-samples`): 0, not unknown.
            utilization = None if busy is None else busy.get(pid, 0.0)
            found.append((pid, memory.get(pid), utilization))
        return found

    def process_utilization(self, gpu: Gpu) -> dict[int, float] | None:
        """Mean SM utilization per PID over the driver's samples since the last cycle;
        None when the driver cannot say."""
        try:
            found = pynvml.nvmlDeviceGetProcessUtilization(gpu.handle, gpu.process_seen_us)
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_NOT_FOUND:
                # No sample since the last read: no period ended, or every process was
                # idle. The driver does not say which, so nothing is reported.
                return None
            self.calls.interpret(exc, "nvmlDeviceGetProcessUtilization")
            return None
        per_pid: dict[int, list[int]] = {}
        for s in found:
            per_pid.setdefault(int(s.pid), []).append(int(s.smUtil))
            gpu.process_seen_us = max(gpu.process_seen_us, int(s.timeStamp))
        return {pid: sum(pcts) / len(pcts) / 100 for pid, pcts in per_pid.items()}


def _largest(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return a if b is None else b
    return max(a, b)


_STATUS = {
    state: tuple(Sample("hw.status", float(s == state), (("hw.state", s),)) for s in STATES)
    for state in STATES
}


def status(state: str) -> tuple[Sample, ...]:
    """The status samples of a device in `state` (built once: samples are immutable)."""
    return _STATUS[state]
