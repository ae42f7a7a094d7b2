"""`Direct`'s outputs read without ctypes member reads: `memories` (every MIG slice's memory
in one call) must answer what a `memory` call per handle answers, code for code; the v2
memory struct's and the temperature struct's inputs, written once, must be written again
when a call leaves other values there. The driver is stand-in C functions with the
library's names and arguments, whose answers change from call to call."""

from __future__ import annotations

import ctypes
import logging
from typing import Any

import pynvml
import pytest

from exporter.sources.nvml.calls import Calls, GpuLost
from exporter.sources.nvml.direct import Direct, TemperatureV1
from exporter.sources.nvml.structs import MemoryV1, MemoryV2

SUCCESS: int = pynvml.NVML_SUCCESS
V2, V1 = "nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetMemoryInfo"


class _Memory:
    """Per handle (an int): the code each call answers next (SUCCESS when none is queued),
    and values that move on every call; `scribble` has a call leave another version in
    the struct. Checks that every v2 call finds its version set."""

    def __init__(self, names: tuple[str, ...] = (V2, V1)) -> None:
        self.names = names
        self.codes: dict[int, list[int]] = {}
        self.calls: list[tuple[str, int]] = []
        self.tick = 0
        self.scribble = False

    def lookup(self, name: str) -> Any:
        if name not in self.names:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

        def fn(handle: int, ref: Any) -> int:
            self.calls.append((name, handle))
            out = ref._obj
            if isinstance(out, MemoryV2):
                assert out.version == pynvml.nvmlMemory_v2, "called without its version"
            queued = self.codes.get(handle)
            if queued:
                return queued.pop(0)
            self.tick += 1
            base = 2**40 + 3 * self.tick + (handle << 20)  # above 2^32: every byte counts
            out.total, out.free, out.used = base + 7, base // 3, base - base // 3
            if isinstance(out, MemoryV2):
                out.reserved = 5 + handle
                if self.scribble:
                    out.version = 0
            return SUCCESS

        return fn


def _direct(monkeypatch: pytest.MonkeyPatch, driver: Any) -> Direct:
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", driver.lookup)
    return Direct(Calls(logging.getLogger("test")))


def _each(direct: Direct, handles: list[int]) -> list[tuple[float, ...] | None]:
    return [direct.memory(h) for h in handles]


@pytest.mark.parametrize(
    "codes",
    [
        {},
        {1: [pynvml.NVML_ERROR_NOT_SUPPORTED]},
        {2: [pynvml.NVML_ERROR_UNKNOWN]},
        {0: [pynvml.NVML_ERROR_INVALID_ARGUMENT], 3: [pynvml.NVML_ERROR_UNKNOWN]},
    ],
)
def test_memories_answer_what_a_memory_call_per_handle_answers(
    monkeypatch: pytest.MonkeyPatch, codes: dict[int, list[int]]
) -> None:
    handles = [0, 1, 2, 3]
    one, batch = _Memory(), _Memory()
    by_call = _direct(monkeypatch, one)
    answers = [_each(by_call, handles) for _ in range(3)]
    batched = _direct(monkeypatch, batch)
    one.codes, batch.codes = {h: list(c) for h, c in codes.items()}, codes
    one.tick = batch.tick = 0
    one.calls.clear()
    answers = [_each(by_call, handles) for _ in range(3)]
    assert [batched.memories(handles) for _ in range(3)] == answers
    assert batch.calls == one.calls
    assert batched.calls.errors == by_call.calls.errors
    assert all(isinstance(v, float) for a in answers for m in a if m for v in m)
    assert answers[0][0] != answers[1][0]  # the values moved: none was kept


def test_a_slice_denied_its_memory_is_not_asked_again_nor_are_the_next_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    driver = _Memory()
    driver.codes = {1: [pynvml.NVML_ERROR_NO_PERMISSION]}
    direct = _direct(monkeypatch, driver)
    found = direct.memories([0, 1, 2])
    assert found[0] is not None and found[1:] == [None, None]
    assert driver.calls == [(V2, 0), (V2, 1)]
    assert direct.memories([0]) == [None] and len(driver.calls) == 2
    assert direct.calls.errors == 0


def test_without_memory_v2_every_slice_is_read_through_v1(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    driver = _Memory(names=(V1,))
    direct = _direct(monkeypatch, driver)
    found = direct.memories([0, 1])
    assert [m is not None and len(m) for m in found] == [3, 3]  # no reserved before R510
    assert driver.calls == [(V1, 0), (V1, 1)]
    assert V2 in direct.calls.missing


def test_a_lost_gpu_raises_at_the_slice_that_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    driver = _Memory()
    direct = _direct(monkeypatch, driver)
    direct.memories([0, 1, 2])
    driver.calls.clear()
    driver.codes = {1: [pynvml.NVML_ERROR_GPU_IS_LOST]}
    with pytest.raises(GpuLost):
        direct.memories([0, 1, 2])
    assert driver.calls == [(V2, 0), (V2, 1)]


def test_a_version_the_driver_left_in_the_struct_is_written_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stand-in asserts the version on every call; it overwrites it on each."""
    driver = _Memory()
    driver.scribble = True
    direct = _direct(monkeypatch, driver)
    for _ in range(3):
        assert direct.memory(0) is not None
        assert all(m is not None for m in direct.memories([0, 1]))
    driver.scribble = False
    driver.codes = {0: [pynvml.NVML_ERROR_UNKNOWN]}
    assert direct.memories([0, 1])[0] is None
    assert direct.memory(1) is not None


class _Temperature:
    """nvmlDeviceGetTemperatureV answering the sensor's number plus the call's count; it
    checks its inputs and may leave others behind (`scribble`)."""

    def __init__(self) -> None:
        self.count = 0
        self.scribble = False
        self.code = SUCCESS

    def lookup(self, name: str) -> Any:
        if name != "nvmlDeviceGetTemperatureV":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

        def fn(handle: object, ref: Any) -> int:
            out: TemperatureV1 = ref._obj
            assert out.version == pynvml.nvmlTemperature_v1, "called without its version"
            self.count += 1
            if self.code != SUCCESS:
                out.sensorType = 99
                return self.code
            out.temperature = 1000 * out.sensorType + self.count
            if self.scribble:
                out.version, out.sensorType = 0, 7
            return SUCCESS

        return fn


def test_the_temperature_inputs_are_written_again_when_left_changed_or_the_sensor_differs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    driver = _Temperature()
    direct = _direct(monkeypatch, driver)
    gpu, other = ctypes.c_uint(0), ctypes.c_uint(2)
    assert [direct.temperature(None, gpu) for _ in range(2)] == [1, 2]
    assert direct.temperature(None, other) == 2003
    driver.scribble = True
    assert [direct.temperature(None, other) for _ in range(2)] == [2004, 2005]
    assert direct.temperature(None, gpu) == 6
    driver.scribble, driver.code = False, pynvml.NVML_ERROR_UNKNOWN
    assert direct.temperature(None, gpu) is None
    driver.code = SUCCESS
    assert direct.temperature(None, gpu) == 8
    assert direct.calls.errors == 1


def test_memory_v1_layout_is_unchanged() -> None:
    assert ctypes.sizeof(MemoryV1) == 24


def test_gpm_quiet_exactly_when_no_slice_has_a_gpm_call_due_or_activity_to_report(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`Reader.gpm_quiet` lets a cycle read the slices' memory in one call: it must be True
    exactly when `mig_gpm` would hand every slice nothing, without a call."""
    import itertools

    from exporter.model import Sample
    from exporter.reading import Device
    from exporter.sources.nvml.discovery import Gpu, Mig
    from exporter.sources.nvml.gpm import Gpm
    from exporter.sources.nvml.readings import Reader

    reader = Reader(Calls(logging.getLogger("test")), lambda: 100.0, 10.0, 10.0)
    called: list[str] = []

    def gpm(device_id: str, *args: Any, **kw: Any) -> list[Sample]:
        called.append(device_id)
        return []

    monkeypatch.setattr(reader, "_gpm", gpm)
    reader.now = 100.0

    def device(name: str) -> Device:
        return Device(name, "gpu", "nvidia", "t", "nvml")

    migs = [Mig(None, device(f"MIG-{i}"), i, 0, Gpm(None, None)) for i in range(2)]
    migs.append(Mig(None, device("MIG-none"), 2, 0, None))  # no GPM on this one
    gpu = Gpu(None, 0, device("GPU-1"), True, migs)
    activity = [Sample("hw.gpu.sm.activity", 0.5, ())]
    states = list(itertools.product((None, 50.0, 100.0, 150.0), (None, [], activity)))
    for first, second in itertools.product(states, repeat=2):
        for mig, (quiet, last) in zip(migs, (first, second), strict=False):
            reader._gpm_quiet.pop(mig.device.id, None)
            reader._gpm_last.pop(mig.device.id, None)
            if quiet is not None:
                reader._gpm_quiet[mig.device.id] = quiet
            if last is not None:
                reader._gpm_last[mig.device.id] = last
        called.clear()
        nothing = not any(reader.mig_gpm(gpu, m) for m in migs if m.gpm is not None)
        assert reader.gpm_quiet(gpu) == (nothing and not called), (first, second)


def test_every_width_of_output_is_read_whole_and_anew_on_each_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The unsigned int and unsigned long long outputs are read through views of their
    bytes: each call's value, every bit of it."""
    values = iter(range(10))

    def lookup(name: str) -> Any:
        def fn(handle: object, *args: Any) -> int:
            step = next(values)
            if name == "nvmlDeviceGetUtilizationRates":
                args[-1]._obj.gpu, args[-1]._obj.memory = 2**31 + step, 7 + step
            elif name.startswith("nvmlDeviceGetCurrentClocks"):
                args[-1]._obj.value = 2**63 + 2**40 + step
            else:  # the codecs write the utilization first, then the sampling period
                args[0 if "coder" in name else -1]._obj.value = 2**31 + 2**20 + step
            return SUCCESS

        return fn

    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", lookup)
    direct = Direct(Calls(logging.getLogger("test")))
    assert direct.uint("nvmlDeviceGetPowerUsage", None) == 2**31 + 2**20
    assert direct.uint("nvmlDeviceGetPowerUsage", None) == 2**31 + 2**20 + 1
    assert direct.clock_reasons(None) == 2**63 + 2**40 + 2
    assert direct.clock_reasons(None) == 2**63 + 2**40 + 3
    assert direct.codec("nvmlDeviceGetEncoderUtilization", None) == 2**31 + 2**20 + 4
    assert direct.utilization(None) == (2**31 + 5, 12)
    assert direct.utilization(None) == (2**31 + 6, 13)
