"""One cycle's reads of a discovered GPU and its MIG slices: what moves, in base units.

Counters are batched into one `nvmlDeviceGetFieldValues` call per GPU (never
`nvmlDeviceGetPcieThroughput`: it blocks for a sampling period on every call).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
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

# What a cycle builds for every GPU, built once: metric names and attribute tuples do not
# change between cycles, only the values do (a dense node makes ~450 samples a cycle).
_new = tuple.__new__
"""`_new(Sample, (metric, value, attributes))`: a Sample without a Python-level call."""
_SUCCESS, _GPU_IS_LOST = pynvml.NVML_SUCCESS, pynvml.NVML_ERROR_GPU_IS_LOST
_UTILIZATION, _BANDWIDTH = "hw.gpu.utilization", "hw.gpu.memory.bandwidth.utilization"
_GENERAL = (("hw.gpu.task", "general"),)
_CODECS = (
    (pynvml.nvmlDeviceGetEncoderUtilization, (("hw.gpu.task", "encoder"),)),
    (pynvml.nvmlDeviceGetDecoderUtilization, (("hw.gpu.task", "decoder"),)),
)
_CLOCKS = tuple((clock, (("hw.gpu.clock.type", kind),)) for kind, clock in CLOCKS)
_GPU_SENSOR = (("hw.sensor_location", "gpu"),)
_THROTTLE = "hw.gpu.clock.throttled"
_THROTTLED = tuple((bit, (("hw.gpu.clock.throttle_reason", r),)) for r, bit in THROTTLE_REASONS)
_TEMPERATURE = (
    # nvmlDeviceGetTemperature is deprecated (gone in CUDA 14); before R550 it is all there is.
    ("nvmlDeviceGetTemperatureV", pynvml.nvmlDeviceGetTemperatureV),
    ("nvmlDeviceGetTemperature", pynvml.nvmlDeviceGetTemperature),
)
_THROTTLE_REASONS = (  # renamed in R535
    ("nvmlDeviceGetCurrentClocksEventReasons", pynvml.nvmlDeviceGetCurrentClocksEventReasons),
    ("nvmlDeviceGetCurrentClocksThrottleReasons", pynvml.nvmlDeviceGetCurrentClocksThrottleReasons),
)


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
        slow_interval: float,
        gpm_interval: float,
    ) -> None:
        self.calls = calls
        self.counters = MonotonicCounters()
        self.clock = clock
        self.slow_interval = slow_interval
        self.gpm_interval = gpm_interval
        self._gpm_read_at: dict[str, float] = {}
        """Per device: when its GPM sample was last taken on the GPM interval."""
        memory = MemoryRead()
        self._memory_calls = (  # drivers before R510 have only v1 (reserved counted as used)
            ("nvmlDeviceGetMemoryInfo_v2", memory.v2),
            ("nvmlDeviceGetMemoryInfo", memory.v1),
        )
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
        put = samples.append
        if not gpu.mig_mode:
            util = get(pynvml.nvmlDeviceGetUtilizationRates, h, handle=True)
            if util is not None:
                put(_new(Sample, (_UTILIZATION, float(util.gpu / 100), _GENERAL)))
                put(_new(Sample, (_BANDWIDTH, float(util.memory / 100), ())))
        if gpu.gpm is not None:
            samples += self._gpm(
                gpu.device.id, pynvml.nvmlGpmSampleGet, h, gpm=gpu.gpm, mig=gpu.mig_mode
            )
        for fn, task in _CODECS:
            value = get(fn, h)
            if value is not None:
                put(_new(Sample, (_UTILIZATION, float(value and value[0] / 100), task)))
        self.memory_samples(h, samples)
        power = get(pynvml.nvmlDeviceGetPowerUsage, h)
        add(samples, "hw.power", power and power / 1000)
        limit = get(pynvml.nvmlDeviceGetEnforcedPowerLimit, h)
        add(samples, "hw.power.limit", limit and limit / 1000)
        temp = self.calls.newest(_TEMPERATURE, h, GPU_SENSOR)
        if temp is not None:
            put(_new(Sample, ("hw.temperature", float(temp), _GPU_SENSOR)))
        for clock, kind in _CLOCKS:
            mhz = get(pynvml.nvmlDeviceGetClockInfo, h, clock)
            if mhz is not None:
                put(_new(Sample, ("hw.gpu.clock", float(mhz and mhz * 1e6), kind)))
        reasons = self.calls.newest(_THROTTLE_REASONS, h)
        if reasons is not None:
            for bit, reason in _THROTTLED:
                put(_new(Sample, (_THROTTLE, 1.0 if reasons & bit else 0.0, reason)))
        degraded = self.field_samples(gpu, samples)
        return samples, degraded

    def memory_samples(self, handle: Any, samples: list[Sample]) -> None:
        mem = self.calls.newest(self._memory_calls, handle)
        if mem is None:
            return
        total, free, used, reserved = mem
        put = samples.append
        put(_new(Sample, ("hw.gpu.memory.usage", float(used), ())))
        put(_new(Sample, ("hw.gpu.memory.limit", float(total), ())))
        put(_new(Sample, ("hw.gpu.memory.free", float(free), ())))
        if reserved is not None:
            put(_new(Sample, ("hw.gpu.memory.reserved", float(reserved), ())))

    def field_samples(self, gpu: Gpu, samples: list[Sample]) -> bool:
        """The batched counters; True when a row remap is pending or has failed."""
        fields, batch = (FIELDS, self._all) if gpu.slow_now else (_FAST, self._fast)
        device_id, put, counters = gpu.device.id, samples.append, self.counters
        for spec in () if gpu.slow_now else _SLOW:  # between slow reads: the last value
            last = counters.last((device_id, spec.field_id))
            if last is not None:
                put(_new(Sample, (spec.metric, float(last), spec.attributes)))
        values = self.calls.get(batch.read, gpu.handle, name="nvmlDeviceGetFieldValues")
        degraded = False
        for spec, (ret, number) in zip(
            fields, (_UNREAD,) * len(fields) if values is None else values, strict=True
        ):
            if ret == _SUCCESS:
                raw = number * spec.scale
                total = counters.update((device_id, spec.field_id), raw) if spec.counter else raw
                if total is not None:
                    put(_new(Sample, (spec.metric, float(total), spec.attributes)))
                degraded |= spec.field_id in _REMAP_FLAGS and (total or 0.0) > 0
            elif ret == _GPU_IS_LOST:
                raise GpuLost("nvmlDeviceGetFieldValues")
            elif ret not in NOT_HERE:
                if values is not None:  # (a failed call was counted once, not per field)
                    self.calls.errors += 1
                if spec.counter:
                    # A counter that failed to read keeps its last value; it does not vanish.
                    add(
                        samples,
                        spec.metric,
                        counters.last((device_id, spec.field_id)),
                        *spec.attributes,
                    )
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
        used = self._lists_used.get(device_id)
        listed: set[str] = set()
        for fn in PROCESS_LISTS:
            skip = not slow and used is not None and fn.__name__ not in used
            if skip and fn is not PROCESS_LISTS[0]:
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
        if not memory and not busy:
            return []
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
