"""What a source reads of one device: the device, and its values with their layout.

A source returns, per device, a `DeviceReading`: the `Device` (identity), a `Layout` (what
each value is: metric and attributes, the same cycle after cycle) and the values in base
units. `Sample` is one value with its key, for code that builds or reads them one at a time.
`exporter/model.py` re-exports every name here: the rest of the data contract lives there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

Attributes = tuple[tuple[str, str], ...]
"""Ordered (key, value) pairs; keys are OpenTelemetry attribute names."""

Key = tuple[str, Attributes]
"""What one value of a reading is: (metric, attributes)."""


@dataclass(frozen=True, slots=True)
class Device:
    """One physical or logical device a source can see (a GPU, a MIG slice, an IB port...).

    `id` is the stable `hw.id` (an NVIDIA UUID, an AMD unique id or PCI address...).
    `aliases` are every device-plugin ID form that names this device, already in the
    normalized form of `join.normalize_device_id` (PCI addresses lower-case, no replica
    suffixes). `pools` are resource names whose every device ID means "this device,
    shared" (RDMA shared-device pools hand opaque "0","1"... IDs).
    """

    id: str
    type: str
    vendor: str
    model: str
    source: str
    parent: str = ""
    attributes: Attributes = ()
    aliases: frozenset[str] = frozenset()
    pools: frozenset[str] = frozenset()


class Sample(NamedTuple):
    """One value of one metric (a key of `metrics.SPECS`) for one device, in base units.

    A named tuple, not a frozen dataclass: a dense node builds hundreds a cycle, and a frozen
    dataclass's `__init__` sets each field through `object.__setattr__`, several times the
    cost of a tuple (docs/design-figures.md; the NVML source builds them with
    `tuple.__new__`, cheaper still). Equal and hashed by (metric, value, attributes)."""

    metric: str
    value: float
    attributes: Attributes = ()


class Layout:
    """What each value of a device's reading is, in order: one (metric, attributes) key per
    value. A device's layout is the same cycle after cycle (only its values change), so it is
    made once (`Layout.of` hands out one object per distinct list of keys) and the sinks key
    what they derive from it (which values the metric groups keep, each series' text) by
    it, not by each value's key. Compared by its keys; hashed once."""

    __slots__ = ("_hash", "_positions", "attributes", "first", "keys", "metrics")

    keys: tuple[Key, ...]
    metrics: tuple[str, ...]
    """Each value's metric."""
    attributes: tuple[Attributes, ...]
    """Each value's attributes."""
    first: Mapping[str, int]
    """metric -> the position of its first value."""

    def __init__(self, keys: tuple[Key, ...]) -> None:
        self.keys = keys
        self.metrics = tuple(metric for metric, _ in keys)
        self.attributes = tuple(attributes for _, attributes in keys)
        first: dict[str, int] = {}
        for at, metric in enumerate(self.metrics):
            first.setdefault(metric, at)
        self.first = first
        self._hash = hash(keys)
        self._positions: dict[str, tuple[int, ...]] = {}

    def positions(self, metric: str) -> tuple[int, ...]:
        """Where the values of `metric` are (worked out once per layout and metric)."""
        found = self._positions.get(metric)
        if found is None:
            found = tuple(at for at, m in enumerate(self.metrics) if m == metric)
            self._positions[metric] = found
        return found

    @classmethod
    def of(cls, keys: tuple[Key, ...]) -> Layout:
        """The one layout of these keys (made on first use; past _MAX_LAYOUTS distinct
        ones the table starts over, so a layout is then made again, never wrong)."""
        layout = _LAYOUTS.get(keys)
        if layout is None:
            if len(_LAYOUTS) >= _MAX_LAYOUTS:
                _LAYOUTS.clear()
            layout = _LAYOUTS[keys] = cls(keys)
        return layout

    def __len__(self) -> int:
        return len(self.keys)

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, Layout) and self.keys == other.keys)

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"Layout({self.keys!r})"


_LAYOUTS: dict[tuple[Key, ...], Layout] = {}
_MAX_LAYOUTS = 4096
"""Distinct layouts remembered: a few per device model and configuration."""
_new = tuple.__new__


class _Reading(NamedTuple):
    device: Device
    layout: Layout
    values: tuple[float, ...]


class DeviceReading(_Reading):
    """One device's values this cycle, in base units: `values[i]` is a value of
    `layout.keys[i]`. Built from samples (`DeviceReading(device, samples)`) or, where a
    source keeps its layouts, from a layout and values (`DeviceReading.of`); `samples` gives
    them back as `Sample`s (made on each use: the sinks read the layout and the values).

    A named tuple, as `Sample` is: a source makes one per device and cycle, and a frozen
    dataclass's fields are each set through `object.__setattr__`. Equal and hashed by
    (device, layout, values)."""

    __slots__ = ()

    def __new__(
        cls,
        device: Device,
        samples: Iterable[Sample] | None = None,
        *,
        layout: Layout | None = None,
        values: Sequence[float] = (),
    ) -> DeviceReading:
        """From `samples`, or from `layout` and `values` (as many of each)."""
        if samples is not None or layout is None:
            found = tuple(samples or ())
            layout = Layout.of(tuple((s.metric, s.attributes) for s in found))
            values = tuple(s.value for s in found)
        elif len(values) != len(layout.keys):
            raise ValueError(f"{len(values)} values for a layout of {len(layout.keys)}")
        return _new(cls, (device, layout, tuple(values)))

    @classmethod
    def of(cls, device: Device, layout: Layout, values: tuple[float, ...]) -> DeviceReading:
        """A reading of `values` laid out by `layout`, as many of each (the sources' and
        sinks' way: nothing checked or copied)."""
        reading: DeviceReading = _new(cls, (device, layout, values))
        return reading

    def __getnewargs_ex__(self) -> tuple[tuple[Device], dict[str, object]]:
        """copy and pickle: this `__new__` takes the layout and the values by name."""
        return (self.device,), {"layout": self.layout, "values": self.values}

    @property
    def samples(self) -> tuple[Sample, ...]:
        return tuple(
            _new(Sample, (metric, value, attributes))
            for (metric, attributes), value in zip(self.layout.keys, self.values, strict=True)
        )
