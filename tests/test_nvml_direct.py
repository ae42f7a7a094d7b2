"""`Direct` (exporter/sources/nvml/direct.py) calls the C functions itself and compares their
return codes: each code must mean what it meant through the binding (`Calls.get` and
behaviour.py). The driver here is stand-in C functions with the library's names and
arguments, answering the codes under test."""

from __future__ import annotations

import ctypes
import logging
from collections import Counter
from typing import Any

import pynvml
import pytest

from exporter.sources.nvml.calls import Calls, GpuLost
from exporter.sources.nvml.direct import Direct
from exporter.sources.nvml.fields import REQUEST_FAST
from exporter.sources.nvml.structs import FieldBatch

SUCCESS: int = pynvml.NVML_SUCCESS


class _Driver:
    """name -> the code it answers (SUCCESS writes `value`); names not listed are missing
    from this library (the binding raises FUNCTION_NOT_FOUND when it looks them up)."""

    def __init__(self, answers: dict[str, int], value: int = 250_000) -> None:
        self.answers = answers
        self.value = value
        self.calls: Counter[str] = Counter()

    def lookup(self, name: str) -> Any:
        if name not in self.answers:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

        def fn(handle: object, *args: Any) -> int:
            self.calls[name] += 1
            if self.answers[name] == SUCCESS:
                out = args[-1]._obj
                if isinstance(out, ctypes.Structure):  # nvmlMemory_t: total, free, used
                    out.total, out.free, out.used = 80, 30, 50
                else:
                    out.value = self.value
            return self.answers[name]

        return fn


def _direct(monkeypatch: pytest.MonkeyPatch, driver: _Driver) -> Direct:
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", driver.lookup)
    return Direct(Calls(logging.getLogger("test")))


def test_a_function_this_pod_may_not_call_is_called_once(monkeypatch: pytest.MonkeyPatch) -> None:
    driver = _Driver({"nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_NO_PERMISSION})
    direct = _direct(monkeypatch, driver)
    assert [direct.uint("nvmlDeviceGetPowerUsage", None) for _ in range(3)] == [None] * 3
    assert driver.calls["nvmlDeviceGetPowerUsage"] == 1
    assert direct.calls.forbidden == {"nvmlDeviceGetPowerUsage"}
    assert direct.calls.errors == 0  # denied is not a field error


def test_not_supported_is_no_value_and_no_error_and_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    driver = _Driver({"nvmlDeviceGetEncoderUtilization": pynvml.NVML_ERROR_NOT_SUPPORTED})
    direct = _direct(monkeypatch, driver)
    assert direct.codec("nvmlDeviceGetEncoderUtilization", None) is None
    assert direct.codec("nvmlDeviceGetEncoderUtilization", None) is None
    assert driver.calls["nvmlDeviceGetEncoderUtilization"] == 2  # a MIG mode can change
    assert direct.calls.errors == 0


def test_invalid_argument_marks_a_handle_stale_only_on_a_handle_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    invalid = pynvml.NVML_ERROR_INVALID_ARGUMENT
    driver = _Driver({"nvmlDeviceGetPowerUsage": invalid, "nvmlDeviceGetUtilizationRates": invalid})
    direct = _direct(monkeypatch, driver)
    assert direct.uint("nvmlDeviceGetPowerUsage", None) is None
    assert not direct.calls.stale and direct.calls.errors == 1  # a field error
    assert direct.utilization(None) is None
    assert direct.calls.stale  # rediscover next cycle (behaviour.py `mig-handle-invalid`)


def test_a_lost_gpu_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    direct = _direct(
        monkeypatch, _Driver({"nvmlDeviceGetClockInfo": pynvml.NVML_ERROR_GPU_IS_LOST})
    )
    with pytest.raises(GpuLost):
        direct.uint("nvmlDeviceGetClockInfo", None, ctypes.c_uint(0))


def test_an_older_driver_answers_through_the_older_functions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before R510 no memory v2 (reserved counted as used), before R550 no TemperatureV."""
    driver = _Driver({"nvmlDeviceGetMemoryInfo": SUCCESS, "nvmlDeviceGetTemperature": SUCCESS})
    driver.value = 41
    direct = _direct(monkeypatch, driver)
    for _ in range(2):
        assert direct.memory(None) == (50.0, 80.0, 30.0)  # used, total, free: no reserved
        assert direct.temperature(None, ctypes.c_uint(0)) == 41
    assert driver.calls == {"nvmlDeviceGetMemoryInfo": 2, "nvmlDeviceGetTemperature": 2}
    assert {"nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetTemperatureV"} <= direct.calls.missing


def test_a_failed_field_value_call_is_one_error_and_a_lost_gpu_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = "nvmlDeviceGetFieldValues"
    driver = _Driver({name: pynvml.NVML_ERROR_UNKNOWN})
    direct = _direct(monkeypatch, driver)
    batch = FieldBatch(REQUEST_FAST)
    assert direct.field_values(batch, None) is None
    assert direct.field_values(batch, None) is None
    assert driver.calls[name] == 2 and direct.calls.errors == 2  # one per failed call
    driver.answers[name] = pynvml.NVML_ERROR_GPU_IS_LOST
    with pytest.raises(GpuLost):
        direct.field_values(batch, None)
    driver.answers[name] = pynvml.NVML_ERROR_NO_PERMISSION
    assert [direct.field_values(batch, None) for _ in range(2)] == [None, None]
    assert driver.calls[name] == 4  # denied: not asked again
