"""The NVML calls of every cycle, made straight to the C functions.

Through nvidia-ml-py, each call builds its output objects, looks the C function up (a Python
call), checks the return code by raising, and hands structs back whose every member read
runs Python: on a dense node, several times what the C calls themselves cost (`python -m
bench nvml-calls`: collect() against the same C calls replayed bare). Here each function is
looked up once through the binding (so the library the binding loaded is the one called,
and a timer the bench puts there sees every call), writes into outputs made once and
reused, and its return code is compared, not raised: one that is not SUCCESS goes to
`Calls.interpret`, as every other call's error does (behaviour.py), so what a code means is
decided in one place. A function missing from this driver, or denied to this pod, is not
called again (`Calls.missing`, `Calls.forbidden`); where an older function does the same
(temperature, clock event reasons, memory) it is called instead.

One `Direct` per source, used by one thread at a time (collect()).
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
from typing import Any

import pynvml

from exporter.sources.nvml.behaviour import STALE_HANDLE
from exporter.sources.nvml.calls import Calls
from exporter.sources.nvml.structs import FieldBatch, MemoryV1, MemoryV2

_SUCCESS = pynvml.NVML_SUCCESS
_INSUFFICIENT_SIZE = pynvml.NVML_ERROR_INSUFFICIENT_SIZE
_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
_GONE = object()
"""In place of a function this driver lacks or this pod may not call."""
NOT_AVAILABLE = 2**64 - 1
"""nvml.h NVML_VALUE_NOT_AVAILABLE in an unsigned long long: a process's memory unknown."""


class Utilization(ctypes.Structure):
    """nvmlUtilization_t."""

    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class TemperatureV1(ctypes.Structure):
    """nvmlTemperature_v1_t (R550 and later: nvmlDeviceGetTemperatureV)."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("sensorType", ctypes.c_uint),
        ("temperature", ctypes.c_int),
    ]


class ProcessInfo(ctypes.Structure):
    """nvmlProcessInfo_t, as the `_v3` process lists fill it."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


_UNPACK_MEMORY_V2 = struct.Struct("@IQQQQ").unpack_from
"""version, total, reserved, free, used."""
assert struct.calcsize("@IQQQQ") == ctypes.sizeof(MemoryV2)
_UNPACK_UTILIZATION = struct.Struct("@II").unpack_from
assert struct.calcsize("@II") == ctypes.sizeof(Utilization)
_UNPACK_TEMPERATURE = struct.Struct("@IIi").unpack_from
"""version, sensorType, temperature."""
assert struct.calcsize("@IIi") == ctypes.sizeof(TemperatureV1)
_TEMPERATURE_VERSION = pynvml.nvmlTemperature_v1
_UNPACK_PROCESS = struct.Struct("@IQII").unpack_from
_PROCESS_SIZE = ctypes.sizeof(ProcessInfo)
assert struct.calcsize("@IQII") == _PROCESS_SIZE
_MEMORY_V2, _MEMORY_V2_VERSION = "nvmlDeviceGetMemoryInfo_v2", pynvml.nvmlMemory_v2
PROCESSES_KEPT = 64
"""Room for this many processes per list before the buffer grows (nvml.h: a list that
does not fit answers INSUFFICIENT_SIZE with the count it needs)."""


class Direct:
    """Each per-cycle call: its value, or None where NVML has none (see the module)."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self._fns: dict[str, Any] = {}
        self._uint, self._period, self._ull = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_ulonglong()
        self._uint_ref, self._period_ref = ctypes.byref(self._uint), ctypes.byref(self._period)
        self._ull_ref = ctypes.byref(self._ull)
        self._uint_view = memoryview(self._uint).cast("B").cast("I")
        self._ull_view = memoryview(self._ull).cast("B").cast("Q")
        """The outputs read as numbers (a ctypes `.value` costs more)."""
        self._util = Utilization()
        self._util_ref = ctypes.byref(self._util)
        self._util_bytes = memoryview(self._util).cast("B")
        self._temp = TemperatureV1()
        self._temp_ref = ctypes.byref(self._temp)
        self._temp_bytes = memoryview(self._temp).cast("B")
        self._temp_sensor: ctypes.c_uint | None = None
        """The sensor the temperature struct's inputs were last written for (None: write
        them before the next call), and its type."""
        self._temp_type = 0
        self._mem2, self._mem1 = MemoryV2(), MemoryV1()
        self._mem2.version = _MEMORY_V2_VERSION
        self._mem2_ref, self._mem1_ref = ctypes.byref(self._mem2), ctypes.byref(self._mem1)
        self._mem2_bytes = memoryview(self._mem2).cast("B")
        """The v2 struct as bytes: its answer read in one unpack, not member by member."""
        self._count = ctypes.c_uint()
        self._count_ref = ctypes.byref(self._count)
        self._count_view = memoryview(self._count).cast("B").cast("I")
        """The list's count, written and read as a number (a ctypes `.value` costs more)."""
        self._procs = (ProcessInfo * PROCESSES_KEPT)()
        self._capacity = PROCESSES_KEPT
        """len(self._procs), kept as a number."""

    # --- one output -----------------------------------------------------------------

    def uint(self, name: str, handle: Any, *args: Any) -> int | None:
        """`name(handle, *args, &unsigned int)`."""
        fn = self._fns.get(name) or self._resolve(name)
        if fn is _GONE:
            return None
        ret = fn(handle, *args, self._uint_ref)
        if ret == _SUCCESS:
            return self._uint_view[0]
        self._failed(name, ret)
        return None

    def codec(self, name: str, handle: Any) -> int | None:
        """nvmlDeviceGetEncoderUtilization / Decoder: the utilization (percent), not the
        sampling period."""
        fn = self._fns.get(name) or self._resolve(name)
        if fn is _GONE:
            return None
        ret = fn(handle, self._uint_ref, self._period_ref)
        if ret == _SUCCESS:
            return self._uint_view[0]
        self._failed(name, ret)
        return None

    def utilization(self, handle: Any) -> tuple[int, int] | None:
        """nvmlDeviceGetUtilizationRates: (gpu, memory) percent; a handle call."""
        name = "nvmlDeviceGetUtilizationRates"
        fn = self._fns.get(name) or self._resolve(name)
        if fn is _GONE:
            return None
        ret = fn(handle, self._util_ref)
        if ret == _SUCCESS:
            util: tuple[int, int] = _UNPACK_UTILIZATION(self._util_bytes)
            return util
        self._failed(name, ret, handle=True)
        return None

    def field_values(self, batch: FieldBatch, handle: Any) -> tuple[int, ...] | None:
        """nvmlDeviceGetFieldValues of `batch`'s requests: each field's value type and
        return code (`FieldBatch.codes()`; its values stay in the batch), None when the
        call itself failed."""
        name = "nvmlDeviceGetFieldValues"
        fn = self._fns.get(name) or self._resolve(name)
        if fn is _GONE:
            return None
        ret = batch.ask(fn, handle)
        if ret == _SUCCESS:
            return batch.codes()
        self._failed(name, ret)
        return None

    # --- newer functions first, older drivers fall through ----------------------------

    def temperature(self, handle: Any, sensor: ctypes.c_uint) -> int | None:
        """nvmlDeviceGetTemperatureV, before R550 nvmlDeviceGetTemperature (deprecated,
        gone in CUDA 14)."""
        name = "nvmlDeviceGetTemperatureV"
        fn = self._fns.get(name) or self._resolve(name)
        if fn is not _GONE:
            if sensor is not self._temp_sensor:
                self._temp_type = sensor.value
                self._temp.version, self._temp.sensorType = _TEMPERATURE_VERSION, self._temp_type
                self._temp_sensor = sensor
            ret = fn(handle, self._temp_ref)
            if ret == _SUCCESS:
                version, sensor_type, temperature = _UNPACK_TEMPERATURE(self._temp_bytes)
                if version != _TEMPERATURE_VERSION or sensor_type != self._temp_type:
                    self._temp_sensor = None  # inputs overwritten: written again
                return int(temperature)
            self._temp_sensor = None
            self._failed(name, ret)
        if not self._lacks(name):
            return None
        return self.uint("nvmlDeviceGetTemperature", handle, sensor)

    def clock_reasons(self, handle: Any) -> int | None:
        """nvmlDeviceGetCurrentClocksEventReasons, before R535 ...ThrottleReasons."""
        for name in (
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetCurrentClocksThrottleReasons",
        ):
            fn = self._fns.get(name) or self._resolve(name)
            if fn is not _GONE:
                ret = fn(handle, self._ull_ref)
                if ret == _SUCCESS:
                    return self._ull_view[0]
                self._failed(name, ret)
            if not self._lacks(name):
                return None
        return None

    def memory(self, handle: Any) -> tuple[float, ...] | None:
        """(used, total, free, reserved) bytes: nvmlDeviceGetMemoryInfo_v2 (R510 and
        later), else nvmlDeviceGetMemoryInfo: (used, total, free), reserved counted as
        used.

        The v2 struct's version is written when the struct is made and again whenever a
        call left another there (nvml.h does not say the driver leaves it alone): every
        call finds it set, without a ctypes member write per call."""
        return self.memories((handle,))[0]

    def memories(self, handles: Sequence[Any]) -> list[tuple[float, ...] | None]:
        """`memory` of each handle, in order, in one call (the MIG slices of a GPU): the
        same C calls, with the same outcome for each, as one `memory` call per handle."""
        found: list[tuple[float, ...] | None] = []
        put, ref, answer = found.append, self._mem2_ref, self._mem2_bytes
        fn = self._fns.get(_MEMORY_V2) or self._resolve(_MEMORY_V2)
        for handle in handles:
            if fn is _GONE:
                put(self._memory_without_v2(handle))
                continue
            ret = fn(handle, ref)
            if ret == _SUCCESS:
                version, total, reserved, free, used = _UNPACK_MEMORY_V2(answer)
                if version != _MEMORY_V2_VERSION:
                    self._mem2.version = _MEMORY_V2_VERSION
                put((float(used), float(total), float(free), float(reserved)))
            else:
                put(self._memory_v2_failed(handle, ret))
                fn = self._fns[_MEMORY_V2]  # missing or denied now: not called again
        return found

    def _memory_v2_failed(self, handle: Any, ret: int) -> tuple[float, ...] | None:
        """`memory` after nvmlDeviceGetMemoryInfo_v2 answered `ret`, not SUCCESS."""
        self._mem2.version = _MEMORY_V2_VERSION
        self._failed(_MEMORY_V2, ret)
        return self._memory_without_v2(handle)

    def _memory_without_v2(self, handle: Any) -> tuple[float, ...] | None:
        """`memory` where v2 gave nothing: v1 where this driver lacks v2, else None."""
        if not self._lacks(_MEMORY_V2):
            return None
        name = "nvmlDeviceGetMemoryInfo"
        fn = self._fns.get(name) or self._resolve(name)
        if fn is _GONE:
            return None
        mem1 = self._mem1
        ret = fn(handle, self._mem1_ref)
        if ret == _SUCCESS:
            return (float(mem1.used), float(mem1.total), float(mem1.free))
        self._failed(name, ret)
        return None

    # --- a list ---------------------------------------------------------------------

    def processes(self, name: str, handle: Any) -> list[tuple[int, float | None]] | None:
        """(pid, used memory bytes or None) of a `_v3` process list; a handle call. One call
        into a buffer kept from cycle to cycle; a list that does not fit grows it."""
        fn = self._fns.get(name) or self._resolve(name)
        if fn is _GONE:
            return None
        count = self._count_view
        count[0] = self._capacity
        ret = fn(handle, self._count_ref, self._procs)
        if ret == _SUCCESS:  # (most lists of most cycles: one call, nobody listed)
            return self._listed() if count[0] else []
        return self._processes_again(name, fn, handle, ret)

    def _processes_again(
        self, name: str, fn: Any, handle: Any, ret: int
    ) -> list[tuple[int, float | None]] | None:
        """`processes` after a first call that did not succeed: a list that did not fit
        grows the buffer and is asked again (it may grow between the calls), three calls in
        all."""
        calls = 1
        while ret == _INSUFFICIENT_SIZE:
            self._procs = (ProcessInfo * (self._count.value * 2 + 5))()
            self._capacity = len(self._procs)
            if calls == 3:
                break
            self._count.value = self._capacity
            ret = fn(handle, self._count_ref, self._procs)
            calls += 1
            if ret == _SUCCESS:
                return self._listed() if self._count.value else []
        self._failed(name, ret, handle=True)
        return None

    def _listed(self) -> list[tuple[int, float | None]]:
        count = min(self._count.value, len(self._procs))
        raw = ctypes.string_at(self._procs, count * _PROCESS_SIZE)
        found = []
        for at in range(0, len(raw), _PROCESS_SIZE):
            pid, memory, _, _ = _UNPACK_PROCESS(raw, at)
            found.append((pid, None if memory == NOT_AVAILABLE else float(memory)))
        return found

    # --- failures -------------------------------------------------------------------

    def _resolve(self, name: str) -> Any:
        """The C function (through the binding: its library, and its errors), or _GONE."""
        calls = self.calls
        fn: Any = _GONE
        if name not in calls.missing and name not in calls.forbidden:
            try:
                fn = pynvml._nvmlGetFunctionPointer(name)
            except pynvml.NVMLError as exc:
                calls.interpret(exc, name)  # FUNCTION_NOT_FOUND: said once, never called
        self._fns[name] = fn
        return fn

    def _failed(self, name: str, ret: int, *, handle: bool = False) -> None:
        """What `Calls.get` does with the binding's error for this code."""
        if ret == _NOT_SUPPORTED:  # no series, not an error (behaviour.py `not-supported`)
            return
        if handle and ret in STALE_HANDLE:
            self.calls.stale = True
        try:
            self.calls.interpret(pynvml.NVMLError(ret), name)
        finally:
            if name in self.calls.missing or name in self.calls.forbidden:
                self._fns[name] = _GONE

    def _lacks(self, name: str) -> bool:
        """This driver has no such function (an older one may do)."""
        return name in self.calls.missing
