"""One cycle's reads of a discovered GPU and its MIG slices: what moves, in base units.

Counters are batched into one `nvmlDeviceGetFieldValues` call per GPU (never
`nvmlDeviceGetPcieThroughput`: it blocks for a sampling period on every call).
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable
from typing import Any

import pynvml

from exporter.metrics import THROTTLE_REASONS
from exporter.model import Key, Sample
from exporter.sources.counters import MonotonicCounters
from exporter.sources.nvml.behaviour import NOT_HERE
from exporter.sources.nvml.calls import Calls, GpuLost
from exporter.sources.nvml.direct import Direct
from exporter.sources.nvml.discovery import Gpu, Mig
from exporter.sources.nvml.fields import REQUEST_ALL, REQUEST_FAST, FieldPlan, PlannedField
from exporter.sources.nvml.gpm import Gpm
from exporter.sources.nvml.gpm import read as gpm_read
from exporter.sources.nvml.processes import ProcessLists
from exporter.sources.nvml.structs import FieldBatch, number

GPM_RETRIES = 3
"""GPM reads in a row, one per cycle, that may give no rate before the slow interval rules."""

CLOCKS = (("sm", pynvml.NVML_CLOCK_SM), ("memory", pynvml.NVML_CLOCK_MEM))
GPU_SENSOR = pynvml.NVML_TEMPERATURE_GPU

# What a cycle reads of every GPU, as (metric, attributes) keys made once: only the values
# change between cycles, and each device's layout is kept (`Layouts`).
_SUCCESS, _GPU_IS_LOST = pynvml.NVML_SUCCESS, pynvml.NVML_ERROR_GPU_IS_LOST
_GENERAL: Key = ("hw.gpu.utilization", (("hw.gpu.task", "general"),))
_BANDWIDTH: Key = ("hw.gpu.memory.bandwidth.utilization", ())
_CODECS: tuple[tuple[str, Key], ...] = (
    ("nvmlDeviceGetEncoderUtilization", ("hw.gpu.utilization", (("hw.gpu.task", "encoder"),))),
    ("nvmlDeviceGetDecoderUtilization", ("hw.gpu.utilization", (("hw.gpu.task", "decoder"),))),
)
_MEMORY: tuple[Key, Key, Key, Key] = tuple(  # type: ignore[assignment]  # four, as written
    (f"hw.gpu.memory.{what}", ()) for what in ("usage", "limit", "free", "reserved")
)
_POWER: Key = ("hw.power", ())
_POWER_LIMIT: Key = ("hw.power.limit", ())
_TEMPERATURE: Key = ("hw.temperature", (("hw.sensor_location", "gpu"),))
_SENSOR = ctypes.c_uint(GPU_SENSOR)
_CLOCKS: tuple[tuple[ctypes.c_uint, Key], ...] = tuple(
    (ctypes.c_uint(clock), ("hw.gpu.clock", (("hw.gpu.clock.type", kind),)))
    for kind, clock in CLOCKS
)
_THROTTLED: tuple[tuple[int, Key], ...] = tuple(
    (bit, ("hw.gpu.clock.throttled", (("hw.gpu.clock.throttle_reason", r),)))
    for r, bit in THROTTLE_REASONS
)
_THROTTLED_KEYS = tuple(key for _, key in _THROTTLED)
_THROTTLE_MASK = sum(bit for bit, _ in _THROTTLED)
_THROTTLED_VALUES: dict[int, tuple[float, ...]] = {}
"""The values of `_THROTTLED_KEYS` per mask of the reasons they say (at most 2^9), each
made once: a GPU's reasons change seldom, and are read on every cycle."""


def _throttled(reasons: int) -> tuple[float, ...]:
    """The values of `_THROTTLED_KEYS` for these clock event reasons (kept)."""
    mask = reasons & _THROTTLE_MASK
    found = _THROTTLED_VALUES[mask] = tuple(1.0 if mask & bit else 0.0 for bit, _ in _THROTTLED)
    return found


_ULL = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
_NEVER = -math.inf


def _unread(fields: int) -> tuple[int, ...]:
    """`FieldBatch.answers` of a call that failed: every field UNKNOWN (counted once, as
    the call)."""
    return (_ULL, pynvml.NVML_ERROR_UNKNOWN, 0) * fields


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
        self.direct = Direct(calls)
        self.procs = ProcessLists(calls, self.direct)
        self._all, self._fast = FieldBatch(REQUEST_ALL), FieldBatch(REQUEST_FAST)
        """Reused on every call: a Reader is used by one thread at a time (collect())."""
        self._gpm_last: dict[str, list[Sample]] = {}
        """The last GPM activity per device (between GPM reads)."""
        self._gpm_quiet: dict[str, float] = {}
        """Per device: until when its last GPM activity stands without a call."""
        self.now = -math.inf
        """The cycle's start (the source sets it): no GPM call is due before the quiet time."""
        self._gpm_empty: dict[str, int] = {}
        """Per device: how many GPM reads in a row gave no rate."""
        self._plans: dict[str, FieldPlan] = {}
        """Per device: its fields with their counter keys (`FieldPlan`)."""

    def slow_due(self, gpu: Gpu) -> bool:
        """Whether this cycle reads the slow values of `gpu` (decided once per cycle)."""
        return self.clock() - gpu.slow_read_at >= self.slow_interval

    def gpu_values(self, gpu: Gpu, keys: list[Key], values: list[float]) -> bool:
        """A whole GPU's values, appended; True when a row remap is pending or has failed."""
        direct, h = self.direct, gpu.handle
        kput, vput = keys.append, values.append
        if not gpu.mig_mode:
            util = direct.utilization(h)
            if util is not None:
                kput(_GENERAL)
                vput(util[0] / 100)
                kput(_BANDWIDTH)
                vput(util[1] / 100)
        if gpu.gpm is not None:
            device_id = gpu.device.id
            if self.now < self._gpm_quiet.get(device_id, _NEVER):  # `_gpm` would call nothing
                found = self._gpm_last.get(device_id)
            else:
                found = self._gpm(
                    device_id, pynvml.nvmlGpmSampleGet, h, gpm=gpu.gpm, mig=gpu.mig_mode
                )
            if found:
                put_samples(found, keys, values)
        for name, key in _CODECS:
            percent = direct.codec(name, h)
            if percent is not None:
                kput(key)
                vput(percent / 100)
        mem = direct.memory(h)
        if mem is not None:
            keys += memory_keys(mem)
            values += mem
        power = direct.uint("nvmlDeviceGetPowerUsage", h)
        if power is not None:
            kput(_POWER)
            vput(power / 1000)
        limit = direct.uint("nvmlDeviceGetEnforcedPowerLimit", h)
        if limit is not None:
            kput(_POWER_LIMIT)
            vput(limit / 1000)
        temp = direct.temperature(h, _SENSOR)
        if temp is not None:
            kput(_TEMPERATURE)
            vput(float(temp))
        for clock, key in _CLOCKS:
            mhz = direct.uint("nvmlDeviceGetClockInfo", h, clock)
            if mhz is not None:
                kput(key)
                vput(mhz * 1e6)
        reasons = direct.clock_reasons(h)
        if reasons is not None:
            keys += _THROTTLED_KEYS
            values += _THROTTLED_VALUES.get(reasons & _THROTTLE_MASK) or _throttled(reasons)
        return self.field_values(gpu, keys, values)

    def field_values(self, gpu: Gpu, keys: list[Key], values: list[float]) -> bool:
        """The batched counters, appended; True when a row remap is pending or has failed."""
        plan = self._plans.get(gpu.device.id) or self._plan(gpu.device.id)
        counters, slow = self.counters, gpu.slow_now
        if slow:
            fields, batch = plan.all, self._all
        else:
            fields, batch = plan.fast, self._fast
            lasts = counters.totals(plan.slow_series)  # between slow reads: the last
            if None in lasts:
                for key, last in zip(plan.slow_keys, lasts, strict=True):
                    if last is not None:
                        keys.append(key)
                        values.append(last)
            else:
                keys += plan.slow_keys
                values += lasts  # type: ignore[arg-type]  # no None in it
        codes = self.direct.field_values(batch, gpu.handle)
        shape = plan.shapes[slow]
        if codes is not None and shape is not None and shape.codes == codes:
            # The fields that answered as last cycle did: the present ones only, unchecked.
            return shape.read(batch.buffer, counters, keys, values)
        if codes is not None:
            plan.remember(slow, fields, codes, counters)
        return self._checked(fields, None if codes is None else batch.answered(), keys, values)

    def _checked(
        self,
        fields: tuple[PlannedField, ...],
        flat: tuple[int, ...] | None,
        keys: list[Key],
        values: list[float],
    ) -> bool:
        """`field_values` of an answer (`FieldBatch.answered()`, None when the call failed)
        checked field by field."""
        counters = self.counters
        update = counters.update
        kput, vput = keys.append, values.append
        read = flat is not None
        if flat is None:
            flat = _unread(len(fields))
        degraded = False
        for (key, counter, scale, remap), value_type, ret, raw in zip(
            fields, flat[0::3], flat[1::3], flat[2::3], strict=True
        ):
            if ret == _SUCCESS:
                value = (float(raw) if value_type == _ULL else number(value_type, raw)) * scale
                total = value if counter is None else update(counter, value)
                if total is not None:
                    kput(key)
                    vput(total)
                    if remap and total > 0:
                        degraded = True
            elif ret == _GPU_IS_LOST:
                raise GpuLost("nvmlDeviceGetFieldValues")
            elif ret not in NOT_HERE:
                if read:  # (a failed call was counted once, not per field)
                    self.calls.errors += 1
                # A counter that failed to read keeps its last value; it does not vanish.
                last = None if counter is None else counters.last(counter)
                if last is not None:
                    kput(key)
                    vput(last)
        return degraded

    def _plan(self, device_id: str) -> FieldPlan:
        plan = self._plans[device_id] = FieldPlan.of(device_id, self.counters)
        return plan

    def gpm_quiet(self, gpu: Gpu) -> bool:
        """No MIG slice of `gpu` has GPM activity to report this cycle, nor a GPM call due
        (`mig_gpm` would hand each of them nothing, without a call)."""
        now, quiet, last = self.now, self._gpm_quiet, self._gpm_last
        for mig in gpu.migs:
            if mig.gpm is not None:
                device_id = mig.device.id
                if now >= quiet.get(device_id, _NEVER) or last.get(device_id):
                    return False
        return True

    def mig_gpm(self, gpu: Gpu, mig: Mig) -> list[Sample] | None:
        """A MIG slice's GPM activity (`_gpm`), without a call in the cycles where it would
        only hand the last back."""
        assert mig.gpm is not None
        device_id = mig.device.id
        if self.now < self._gpm_quiet.get(device_id, _NEVER):
            return self._gpm_last.get(device_id)
        return self._gpm(
            device_id, pynvml.nvmlGpmMigSampleGet, gpu.handle, mig.gi, gpm=mig.gpm, mig=True
        )

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
        retrying = 0 < self._gpm_empty[device_id] < GPM_RETRIES
        quiet = self._gpm_read_at.get(device_id, -math.inf) + self.gpm_interval
        self._gpm_quiet[device_id] = -math.inf if retrying else quiet
        return list(self._gpm_last.get(device_id, ()))


def memory_keys(memory: tuple[float, ...]) -> tuple[Key, ...]:
    """The keys of `Direct.memory`'s values (no reserved memory before R510)."""
    return _MEMORY if len(memory) == 4 else _MEMORY[:3]


def put_samples(samples: list[Sample], keys: list[Key], values: list[float]) -> None:
    for metric, value, attributes in samples:
        keys.append((metric, attributes))
        values.append(value)
