"""The field-value answer of a GPU read through its last shape (fields.Shape: no return code
checked, the values unpacked in their own types at once, the counters updated as a row)
must give what the checked path gives for the same answer (readings.Reader._checked), on
every cycle, whatever the values, for every `nvmlValueType_t`, and when the shape changes.
The driver is a stand-in nvmlDeviceGetFieldValues that writes through the binding's struct."""

from __future__ import annotations

import ctypes
import logging
from typing import Any

import pynvml
import pytest

from exporter.model import Device, Key
from exporter.sources.nvml.calls import Calls
from exporter.sources.nvml.discovery import Gpu
from exporter.sources.nvml.fields import FIELDS
from exporter.sources.nvml.readings import Reader

MEMBERS = (
    (pynvml.NVML_VALUE_TYPE_DOUBLE, "dVal"),
    (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal"),
    (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG, "ulVal"),
    (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal"),
    (pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG, "sllVal"),
    (pynvml.NVML_VALUE_TYPE_SIGNED_INT, "siVal"),
    (pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT, "usVal"),
    (99, "ullVal"),  # a type this binding does not know: read as unsigned 64-bit
)
NOT_SUPPORTED: int = pynvml.NVML_ERROR_NOT_SUPPORTED
SUCCESS: int = pynvml.NVML_SUCCESS


class _Driver:
    """Answers each field by its id: a type from MEMBERS, a value that moves with `cycle`
    (a drop at cycle 5: a counter reset), one field not supported; from cycle 7 on, every
    field answers in the next type (a new shape)."""

    def __init__(self) -> None:
        self.cycle = 0

    def __call__(self, handle: Any, count: ctypes.c_int32, ref: Any) -> int:
        array_type = pynvml.c_nvmlFieldValue_t * count.value
        values = array_type.from_address(ctypes.addressof(ref._obj))
        for v in values:
            at = [f.field_id for f in FIELDS].index(v.fieldId)
            kind, member = MEMBERS[(at + (self.cycle >= 7)) % len(MEMBERS)]
            v.valueType = kind
            v.nvmlReturn = NOT_SUPPORTED if at == 3 else SUCCESS
            step = 1 if self.cycle == 5 else 1000 * self.cycle + 10
            number: float = (at + 1) * step + (0.5 if kind == pynvml.NVML_VALUE_TYPE_DOUBLE else 0)
            if kind == 99:
                number += 2**63  # read as unsigned, not signed
            setattr(v.value, member, type(getattr(v.value, member))(number))
        return SUCCESS


def _reader() -> Reader:
    return Reader(Calls(logging.getLogger("test")), lambda: 0.0, 10.0, 10.0)


def test_an_answer_read_through_its_shape_is_what_the_checked_path_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    driver = _Driver()
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", lambda name: driver)
    gpu = Gpu(None, 0, Device("GPU-1", "gpu", "nvidia", "test", "nvml"), mig_mode=False)
    shaped, checked = _reader(), _reader()
    fast_reads = 0
    for cycle in range(10):
        driver.cycle = cycle
        gpu.slow_now = cycle in (0, 4, 8)
        found: list[tuple[list[Key], list[float], bool]] = []
        for reader in (shaped, checked):
            plan = reader._plans.get(gpu.device.id)
            if reader is checked and plan is not None:
                plan.shapes = [None, None]  # never a shape: every answer checked
            elif plan is not None and plan.shapes[gpu.slow_now] is not None:
                fast_reads += 1
            keys: list[Key] = []
            values: list[float] = []
            degraded = reader.field_values(gpu, keys, values)
            found.append((keys, values, degraded))
        assert found[0] == found[1], f"cycle {cycle}"
        assert all(type(v) is float for v in found[0][1])
        assert shaped.counters.take_rejected() == checked.counters.take_rejected()
    assert fast_reads >= 5  # the shapes did serve (cycles 2, 3, 5, 6, 9 at least)
