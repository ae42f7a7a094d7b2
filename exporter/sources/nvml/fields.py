"""The counters and gauges of the one batched `nvmlDeviceGetFieldValues` call per GPU:
which fields, their keys and scales, and each device's plan of them (made once)."""

from __future__ import annotations

from dataclasses import dataclass, field
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
from exporter.sources.nvml.behaviour import NOT_HERE

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


Shape = tuple[tuple[int, ...], tuple[int, ...], tuple[tuple[int, int, *PlannedField], ...]]
"""A field-value answer's return codes and value types, every code SUCCESS or one that
means no such value here, with the fields that answered: (index, value type, field)."""


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

    @classmethod
    def of(cls, device_id: str) -> FieldPlan:
        """The plan of the device `device_id` (what it holds depends on the id alone)."""
        all_, fast, slow = (
            tuple(
                (key, (device_id, f.field_id) if f.counter else None, f.scale, remap)
                for f, key, remap in keyed
            )
            for keyed in (_ALL_KEYED, _FAST_KEYED, _SLOW_KEYED)
        )
        return cls(all_, fast, slow)

    def remember(
        self,
        slow: bool,
        fields: tuple[PlannedField, ...],
        types: tuple[int, ...],
        rets: tuple[int, ...],
    ) -> None:
        """Keep the shape of this answer to `fields` (`Shape`) when every field of it
        answered or has no such value here; any other answer is checked field by field."""
        if all(ret == _SUCCESS or ret in NOT_HERE for ret in rets):
            self.shapes[slow] = (
                rets,
                types,
                tuple(
                    (at, value_type, *planned)
                    for at, (planned, value_type, ret) in enumerate(
                        zip(fields, types, rets, strict=True)
                    )
                    if ret == _SUCCESS
                ),
            )
