"""`FieldBatch` (exporter/sources/nvml/structs.py) reads a field-value answer from the bytes
of its array, not through ctypes members: every `nvmlValueType_t` must come out as the
binding's own `c_nvmlFieldValue_t` holds it, through both readers the source uses
(`answered()` with `number`, and `typed_values`). The simulated library answers only unsigned
int and unsigned long long fields, so the driver here is a stand-in C function that writes
the answers through the binding's struct into the very memory the batch passes."""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml

from exporter.sources.nvml import structs
from exporter.sources.nvml.structs import FieldBatch, typed_values

ANSWERS = (
    (pynvml.NVML_VALUE_TYPE_DOUBLE, "dVal", 12.5),
    (pynvml.NVML_VALUE_TYPE_DOUBLE, "dVal", -0.25),
    (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal", 4_000_000_000),
    (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG, "ulVal", 2**63 + 5),
    (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal", 2**64 - 1),
    (pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG, "sllVal", -(2**40)),
    (pynvml.NVML_VALUE_TYPE_SIGNED_INT, "siVal", -7),
    (pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT, "usVal", 65535),
    (99, "ullVal", 123456789),  # a type this binding does not know: read as unsigned 64-bit
)
SUCCESS: int = pynvml.NVML_SUCCESS
GPU_IS_LOST: int = pynvml.NVML_ERROR_GPU_IS_LOST
REQUEST = tuple((100 + i, i % 3) for i in range(len(ANSWERS) + 1))
"""One field per answer, and a last one the driver does not support."""


class _Driver:
    """nvmlDeviceGetFieldValues(handle, count, values): checks the requests it is given,
    answers them, and overwrites each request (nvml.h does not promise to keep them)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, handle: Any, count: ctypes.c_int32, ref: Any) -> int:
        self.calls += 1
        array_type = pynvml.c_nvmlFieldValue_t * count.value
        values = array_type.from_address(ctypes.addressof(ref._obj))
        assert [(v.fieldId, v.scopeId) for v in values] == list(REQUEST)
        for v, (kind, member, number) in zip(values, ANSWERS, strict=False):
            v.valueType, v.nvmlReturn = kind, pynvml.NVML_SUCCESS
            setattr(v.value, member, number)
        values[-1].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        values[-1].value.ullVal = 42  # what a field in error holds is never read
        for v in values:
            v.fieldId, v.scopeId = 0, 0
        return SUCCESS


def _ask(batch: FieldBatch, driver: Any) -> list[tuple[int, float]]:
    """What the checked path (readings.py `_checked`) makes of one call: (nvmlReturn,
    number) per requested field, from `answered()`."""
    assert batch.ask(driver, None) == SUCCESS
    flat = batch.answered()
    return [
        (ret, structs.number(value_type, raw) if ret == SUCCESS else 0.0)
        for value_type, ret, raw in zip(flat[0::3], flat[1::3], flat[2::3], strict=True)
    ]


def test_every_value_type_reads_as_the_binding_holds_it() -> None:
    driver = _Driver()
    batch = FieldBatch(REQUEST)
    expected = [(SUCCESS, float(number)) for _, _, number in ANSWERS]
    expected.append((pynvml.NVML_ERROR_NOT_SUPPORTED, 0.0))
    assert _ask(batch, driver) == expected
    # The driver wiped the requests: the second call asks for the same fields again.
    assert _ask(batch, driver) == expected
    assert driver.calls == 2


def test_the_fast_reader_agrees_with_the_checked_one() -> None:
    """fields.py reads an answer shaped like the last one with `typed_values` over the
    answered fields alone, each in its own C type: the same numbers as `number` makes."""
    batch = FieldBatch(REQUEST)
    assert batch.ask(_Driver(), None) == SUCCESS
    codes = batch.codes()
    assert codes[0::2][:-1] == tuple(kind for kind, _, _ in ANSWERS)
    answered = [
        (at, kind)
        for at, (kind, ret) in enumerate(zip(codes[0::2], codes[1::2], strict=True))
        if ret == SUCCESS
    ]
    assert len(answered) == len(ANSWERS)  # the unsupported last field is left out
    read = typed_values(answered)
    assert [float(v) for v in read(batch.buffer)] == [float(n) for _, _, n in ANSWERS]


def test_a_failed_call_is_its_return_code() -> None:
    """The call's own failure comes back as its code, for Direct.field_values to interpret
    (tests/test_nvml_direct.py), not as an exception from here."""

    def lost(*_: Any) -> int:
        return GPU_IS_LOST

    assert FieldBatch(REQUEST).ask(lost, None) == GPU_IS_LOST
