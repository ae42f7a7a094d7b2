"""The counters and gauges of the one batched `nvmlDeviceGetFieldValues` call per GPU:
which fields, their keys and scales, and each device's plan of them (made once)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from operator import mul
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

from exporter.model import Key
from exporter.sources.counters import MonotonicCounters, Series
from exporter.sources.nvml.behaviour import NOT_HERE
from exporter.sources.nvml.structs import typed_values

_SUCCESS = pynvml.NVML_SUCCESS


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
_REMAP_FLAGS = frozenset(
    f.field_id for f in FIELDS if f.metric.startswith("hw.gpu.memory.row_remap")
)
_ALL_KEYED, _FAST_KEYED, _SLOW_KEYED = (
    tuple((f, (f.metric, f.attributes), f.field_id in _REMAP_FLAGS) for f in fields)
    for fields in (FIELDS, _FAST, _SLOW)
)
"""Each field with its key (made once) and whether it says the GPU is degraded."""
REQUEST_ALL = tuple((f.field_id, f.scope) for f in FIELDS)
REQUEST_FAST = tuple((f.field_id, f.scope) for f in _FAST)
"""The field-value requests of a cycle with the slow fields and of one without."""
PlannedField = tuple[Key, tuple[str, int] | None, float, bool]
"""A field of one device: its key, its counter's key (None for a gauge), its scale, and
whether it says the GPU is degraded."""


@dataclass(frozen=True, slots=True)
class Shape:
    """A field-value answer's value types and return codes (`codes`: `FieldBatch.codes()`),
    every code SUCCESS or one that means no such value here, and how to read an answer
    coded alike: the answered fields' values in one unpack (`structs.typed_values`), their
    keys, scales, counters (position, counter key, its series) and the positions of the
    fields that say the GPU is degraded."""

    codes: tuple[int, ...]
    values: Callable[[memoryview], tuple[Any, ...]]
    keys: tuple[Key, ...]
    scales: tuple[float, ...]
    counters: tuple[tuple[int, tuple[str, int], Series], ...]
    remaps: tuple[int, ...]

    def read(
        self,
        buffer: memoryview,
        counters: MonotonicCounters,
        keys: list[Key],
        values: list[float],
    ) -> bool:
        """The answered fields of an answer coded `codes` (no return code checked; the
        fields with no value here not visited), appended; True when a row remap is pending
        or has failed. Each value as the checked path makes it: its member, as a float,
        times its scale, a counter's through its `MonotonicCounters`."""
        row: list[float | None] = list(map(mul, self.values(buffer), self.scales))
        if counters.update_each(row, self.counters):
            keys += self.keys
            values += row  # type: ignore[arg-type]  # every total trusted: no None
        else:  # a counter with no trusted total yet has no series
            for key, total in zip(self.keys, row, strict=True):
                if total is not None:
                    keys.append(key)
                    values.append(total)
        for at in self.remaps:
            total = row[at]
            if total is not None and total > 0:
                return True
        return False


@dataclass(slots=True)
class FieldPlan:
    """One device's fields, as the cycle reads them (with or without the slow ones) and the
    slow ones alone (their last totals stand between slow reads): each key and counter key
    made once, not per field per cycle. `shapes[slow]`: the last answer's shape (`Shape`)
    of a cycle without (False) and with (True) the slow fields; an answer of the same shape
    needs no return code checked, and the fields with no value here are not visited."""

    all: tuple[PlannedField, ...]
    fast: tuple[PlannedField, ...]
    slow: tuple[PlannedField, ...]
    shapes: list[Shape | None] = field(default_factory=lambda: [None, None])
    slow_keys: tuple[Key, ...] = ()
    slow_series: tuple[Series, ...] = ()
    """The slow fields' keys and counters (every slow field is a counter)."""

    @classmethod
    def of(cls, device_id: str, counters: MonotonicCounters) -> FieldPlan:
        """The plan of the device `device_id` (what it holds depends on the id alone), its
        counters kept in `counters`."""
        all_, fast, slow = (
            tuple(
                (key, (device_id, f.field_id) if f.counter else None, f.scale, remap)
                for f, key, remap in keyed
            )
            for keyed in (_ALL_KEYED, _FAST_KEYED, _SLOW_KEYED)
        )
        series = tuple(counters.series(counter) for _, counter, _, _ in slow if counter)
        assert len(series) == len(slow), "a slow field that is no counter has no last total"
        return cls(all_, fast, slow, slow_keys=tuple(key for key, *_ in slow), slow_series=series)

    def remember(
        self,
        slow: bool,
        fields: tuple[PlannedField, ...],
        codes: tuple[int, ...],
        counters: MonotonicCounters,
    ) -> None:
        """Keep the shape of this answer to `fields` (`Shape`; `codes`: its value types and
        return codes, `FieldBatch.codes()`) when every field of it answered or has no such
        value here; any other answer is checked field by field."""
        types, rets = codes[0::2], codes[1::2]
        if not all(ret == _SUCCESS or ret in NOT_HERE for ret in rets):
            return
        answered = [
            (at, value_type, planned)
            for at, (planned, value_type, ret) in enumerate(zip(fields, types, rets, strict=True))
            if ret == _SUCCESS
        ]
        self.shapes[slow] = Shape(
            codes,
            typed_values((at, value_type) for at, value_type, _ in answered),
            tuple(key for _, _, (key, _, _, _) in answered),
            tuple(scale for _, _, (_, _, scale, _) in answered),
            tuple(
                (i, counter, counters.series(counter))
                for i, (_, _, (_, counter, _, _)) in enumerate(answered)
                if counter is not None
            ),
            tuple(i for i, (_, _, (_, _, _, remap)) in enumerate(answered) if remap),
        )
