"""The two NVML reads made for every device on every cycle, without the binding's per-call
allocations: one field-value array per GPU built once and reused, and one memory struct.

nvidia-ml-py builds a new ctypes array (and sets every request in it) for each
`nvmlDeviceGetFieldValues`, a new struct for each `nvmlDeviceGetMemoryInfo`, and its
structs' `__getattribute__` runs Python on every member read. On a dense node these two
calls are 58 of a cycle's ~160 NVML calls (`python -m bench nvml-calls`). The structs here
have the binding's layouts (nvml.h) as plain ctypes structures; the C functions are looked
up through the binding on each call (a dict hit), so the library the binding loaded, a
re-initialized one included, is the one called, and errors become the binding's
`NVMLError` subclasses as every other call's do.
"""

from __future__ import annotations

import ctypes
import struct
import sys
from collections.abc import Callable, Iterable
from typing import Any

import pynvml


class _Value(ctypes.Union):
    _fields_ = [
        ("dVal", ctypes.c_double),
        ("uiVal", ctypes.c_uint),
        ("ulVal", ctypes.c_ulong),
        ("ullVal", ctypes.c_ulonglong),
        ("sllVal", ctypes.c_longlong),
        ("siVal", ctypes.c_int),
        ("usVal", ctypes.c_ushort),
    ]


class FieldValue(ctypes.Structure):
    """nvmlFieldValue_t."""

    _fields_ = [
        ("fieldId", ctypes.c_uint32),
        ("scopeId", ctypes.c_uint32),
        ("timestamp", ctypes.c_int64),
        ("latencyUsec", ctypes.c_int64),
        ("valueType", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),
        ("value", _Value),
    ]


class MemoryV2(ctypes.Structure):
    """nvmlMemory_v2_t (R510 and later: `reserved` apart from `used`)."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("total", ctypes.c_ulonglong),
        ("reserved", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class MemoryV1(ctypes.Structure):
    """nvmlMemory_t (every driver; `used` includes the reserved memory)."""

    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


_VALUE_FORMAT = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "d",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "I",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "L",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "Q",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "q",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "i",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "H",
}
"""nvmlValueType_t -> the C type (native `struct` code) of the member of nvmlValue_t that
holds it; an unknown type reads as unsigned long long."""
_UNPACK_VALUE = {
    kind: struct.Struct("@" + code).unpack_from for kind, code in _VALUE_FORMAT.items()
}
_ULL = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
_UNPACK_ULL = _UNPACK_VALUE[_ULL]
_PACK_ULL = struct.Struct("@Q").pack
_UINT = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
_UINT_SHIFT = 0 if sys.byteorder == "little" else 32
"""Where an unsigned int member sits in the union's bytes read as unsigned 64-bit."""
_SUCCESS = pynvml.NVML_SUCCESS
_VALUE_TYPE_RETURN_AND_VALUE = f"{FieldValue.valueType.offset}xIIQ"
"""One nvmlFieldValue_t: the ids, timestamp and latency skipped, then valueType,
nvmlReturn (adjacent) and the value union's 8 bytes."""
assert struct.calcsize("@" + _VALUE_TYPE_RETURN_AND_VALUE) == ctypes.sizeof(FieldValue)
_VALUE_TYPE_AND_RETURN = f"{FieldValue.valueType.offset}xII8x"
"""One nvmlFieldValue_t's valueType and nvmlReturn, the rest skipped."""
assert struct.calcsize("@" + _VALUE_TYPE_AND_RETURN) == ctypes.sizeof(FieldValue)
_FIELD_SIZE = ctypes.sizeof(FieldValue)
_VALUE_OFFSET = FieldValue.value.offset
assert FieldValue.value.offset == FieldValue.valueType.offset + 8


class FieldBatch:
    """One GPU's field-value request, as a ctypes array made once and reused; the answers
    are read from one copy of its bytes (a ctypes member read per value costs more than
    the C call)."""

    def __init__(self, request: tuple[tuple[int, int], ...]) -> None:
        self.request = request
        self._array = (FieldValue * len(request))()
        self._requests = (FieldValue * len(request))()
        """The requests alone, copied over the array before each call."""
        for value, (field_id, scope) in zip(self._requests, request, strict=True):
            value.fieldId = field_id
            value.scopeId = scope
        self._bytes = memoryview(self._array).cast("B")
        self._request_bytes = memoryview(self._requests).cast("B")
        """Both as bytes: copied with a slice assignment (ctypes.memmove is a foreign call)."""
        self._unpack = struct.Struct("@" + _VALUE_TYPE_RETURN_AND_VALUE * len(request)).unpack_from
        """Every field's valueType, nvmlReturn and value (as unsigned 64-bit), in one call."""
        self._unpack_codes = struct.Struct("@" + _VALUE_TYPE_AND_RETURN * len(request)).unpack_from
        """Every field's valueType and nvmlReturn, without the values."""
        self._count = ctypes.c_int32(len(request))
        self._ref = ctypes.byref(self._array)

    def ask(self, fn: Any, handle: Any) -> int:
        """`fn` (nvmlDeviceGetFieldValues) called on the requests: its return code. They are
        written again on every call: nvml.h says the driver fills the outputs, not that it
        leaves the inputs alone."""
        self._bytes[:] = self._request_bytes
        ret: int = fn(handle, self._count, self._ref)
        return ret

    def answered(self) -> tuple[int, ...]:
        """valueType, nvmlReturn and the value's bytes as unsigned 64-bit (`number` reads
        them), per requested field, in one flat tuple: the last call's answers."""
        answers: tuple[int, ...] = self._unpack(self._bytes)
        return answers

    def codes(self) -> tuple[int, ...]:
        """valueType and nvmlReturn per requested field, in one flat tuple (`answered()`
        without the values)."""
        codes: tuple[int, ...] = self._unpack_codes(self._bytes)
        return codes

    @property
    def buffer(self) -> memoryview:
        """The answers' bytes, for a `typed_values` reader."""
        return self._bytes


def typed_values(answered: Iterable[tuple[int, int]]) -> Callable[[memoryview], tuple[Any, ...]]:
    """A reader of the values of the fields answered at these (index, nvmlValueType_t) of a
    field-value array, each as the member of the union its type names (what `number` makes
    of the unsigned 64-bit bytes, before `float`), in one call."""
    parts, at = ["@"], 0
    for index, value_type in answered:
        offset = index * _FIELD_SIZE + _VALUE_OFFSET
        code = _VALUE_FORMAT.get(value_type, "Q")
        parts.append(f"{offset - at}x{code}")
        at = offset + struct.calcsize("@" + code)
        assert struct.calcsize("".join(parts)) == at  # no alignment padding of its own
    reader: Callable[[memoryview], tuple[Any, ...]] = struct.Struct("".join(parts)).unpack_from
    return reader


def number(value_type: int, raw: int) -> float:
    """A field's value from its nvmlValueType_t and the union's bytes as unsigned 64-bit."""
    if value_type == _ULL:
        return float(raw)
    if value_type == _UINT:  # the union's first four bytes
        return float((raw >> _UINT_SHIFT) & 0xFFFFFFFF)
    # the union's bytes again, read as the member the type names
    return float(_UNPACK_VALUE.get(value_type, _UNPACK_ULL)(_PACK_ULL(raw))[0])
