"""What every sysfs source shares (amdgpu, intel, rdma, netdev): the `SysfsSource` base.

One `Reader` a cycle (`exporter.sources.sysfs.reader`: checked reads, field errors), state kept
between cycles (counters that one bad read cannot corrupt, per-second rates, identity files
read once), the identity of a PCI device, and per-process data read every
`PROCESS_INTERVAL` rather than every cycle.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from exporter.ids import normalize_device_id
from exporter.model import Attributes, Device, DeviceReading, ProcessUsage, Sample, SourceResult
from exporter.runtime.log import StateLog
from exporter.sources import SourceContext, add
from exporter.sources.counters import MonotonicCounters
from exporter.sources.sysfs.reader import Reader

T = TypeVar("T")

PCI_VENDORS = {
    "0x1002": "amd",
    "0x8086": "intel",
    "0x15b3": "mellanox",
    "0x10de": "nvidia",
    "0x14e4": "broadcom",
    "0x1077": "qlogic",
    "0x1924": "solarflare",
    "0x19a2": "emulex",
}
"""PCI vendor IDs -> `hw.vendor` values; unknown vendors keep their hex ID."""


# --- identity of a PCI device ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PciIdentity:
    address: str
    vendor_id: str
    device_id: str
    driver: str

    @property
    def vendor(self) -> str:
        return PCI_VENDORS.get(self.vendor_id, self.vendor_id.removeprefix("0x"))

    @property
    def generic_model(self) -> str:
        """What to call a device whose driver names no product: `ice [8086:159b]`."""
        ids = f"{self.vendor_id.removeprefix('0x')}:{self.device_id.removeprefix('0x')}"
        return f"{self.driver} [{ids}]" if self.driver else f"[{ids}]"


def pci_identity(reader: Reader, device_rel: str) -> PciIdentity | None:
    """PCI address, IDs and driver of the device a `device` link or PCI dir points at."""
    address = reader.pci_address_of(device_rel)
    if address is None:
        return None
    return PciIdentity(
        address=address,
        vendor_id=(reader.text(f"{device_rel}/vendor") or "").lower(),
        device_id=(reader.text(f"{device_rel}/device") or "").lower(),
        driver=reader.link_name(f"{device_rel}/driver") or "",
    )


def alias(raw: str) -> str:
    """A device-plugin ID in the join's lookup form."""
    return normalize_device_id(raw)[0]


# --- state kept between cycles ---------------------------------------------------------------


class Counters:
    """Device counters per (device, metric, attributes), monotonic and glitch-proof.

    A failed read repeats the last value (the series neither vanishes nor drops); resets
    and glitches follow `MonotonicCounters`' rule.
    """

    def __init__(self) -> None:
        self.totals = MonotonicCounters()

    def value(
        self, key: str, metric: str, raw: float | None, attrs: Attributes = ()
    ) -> float | None:
        k = (key, metric, attrs)
        return self.totals.last(k) if raw is None else self.totals.update(k, raw)

    def add(
        self,
        samples: list[Sample],
        key: str,
        metric: str,
        raw: float | None,
        *attrs: tuple[str, str],
    ) -> None:
        add(samples, metric, self.value(key, metric, raw, tuple(attrs)), *attrs)


class Rates:
    """Per-second rates of counters between two cycles (Intel busy and power)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._last: dict[str, tuple[float, float]] = {}

    def per_second(self, key: str, value: float | None) -> float | None:
        """Growth per second since the last call with this key; None on the first."""
        if value is None:
            return None
        now = self._clock()
        last = self._last.get(key)
        self._last[key] = (value, now)
        if last is None or now <= last[1] or value < last[0]:
            return None
        return (value - last[0]) / (now - last[1])


PROCESS_INTERVAL = 10.0
"""Seconds between two reads of per-process data (KFD, DRM fdinfo): a scan of every
process's file descriptors grows with the processes on the node, too much to repeat at a
1 s interval (docs/design-figures.md)."""


class SysfsSource:
    """What the sysfs sources share: the context, one Reader a cycle, counters, rates.

    Subclasses implement `read(reader)`; constructing one touches no file, so a node
    without the hardware just reports no devices.
    """

    name = ""
    looks_for = ""
    """What the source looks for, for the "no devices here" line (`class/drm` cards...)."""

    def __init__(self, ctx: SourceContext) -> None:
        self.ctx = ctx
        self._absent_said = ""
        self.counters = Counters()
        self.rates = Rates(ctx.clock or time.monotonic)
        self._seen: set[str] = set()
        self._stable: dict[str, Any] = {}
        self._read_state = StateLog(ctx.logger or logging.getLogger("exporter.sources"))
        self._clock = ctx.clock or time.monotonic
        self._processes: tuple[ProcessUsage, ...] = ()
        self._processes_at = -math.inf

    def collect(self) -> SourceResult:
        reader = Reader(self.ctx.sysfs, self._seen)
        readings: list[DeviceReading] = []
        stopped = False
        try:
            for reading in self.read(reader):
                readings.append(reading)
        except Exception as exc:  # noqa: BLE001 - a bug on one device keeps what was read
            stopped = True
            reader.garbage()
            self._read_state.failed("read", f"{self.name}: reading stopped early: {exc!r}")
        else:
            self._read_state.ok("read", f"{self.name}: reading every device again")
        errors = reader.errors + self.counters.totals.take_rejected()
        absent = "" if readings or stopped else f"no {self.looks_for} under {self.ctx.sysfs}"
        if absent and absent != self._absent_said:
            self.ctx.logger.info("no %s devices here: %s", self.name, absent)
        self._absent_said = absent
        now = self._clock()
        if not readings:
            self._processes, self._processes_at = (), -math.inf
        elif now - self._processes_at >= PROCESS_INTERVAL:
            # Walking every process's fds costs milliseconds per cycle on a busy node:
            # per-process data is read every PROCESS_INTERVAL and kept in between.
            self._processes, self._processes_at = tuple(self.processes(reader, readings)), now
        processes = self._processes
        return SourceResult(
            self.name, tuple(readings), processes, field_errors=errors, absent=absent
        )

    def read(self, reader: Reader) -> Iterator[DeviceReading]:
        raise NotImplementedError

    def processes(
        self, reader: Reader, readings: Sequence[DeviceReading]
    ) -> Iterator[ProcessUsage]:
        """Processes using this source's devices (host PIDs); none unless overridden."""
        return iter(())

    def stable(self, reader: Reader, key: str, read: Callable[[], T]) -> T:
        """`read()` once per key and keep it, if it read without errors: an identity file
        that fails briefly (unique_id, product_name, vendor) must not rename a device."""
        if key in self._stable:
            return cast(T, self._stable[key])
        before = reader.errors
        value = read()
        if reader.errors == before:
            self._stable[key] = value
        return value

    def pci_identity(self, reader: Reader, device_rel: str) -> PciIdentity | None:
        """`pci_identity`, kept per PCI address."""
        address = reader.pci_address_of(device_rel)
        if address is None:
            return None
        return self.stable(reader, f"pci/{address}", lambda: pci_identity(reader, device_rel))

    def drm_cards(
        self, reader: Reader, drivers: Sequence[str]
    ) -> Iterator[tuple[str, PciIdentity]]:
        """`class/drm/cardN` entries whose PCI device is bound to one of `drivers`."""
        for card in reader.listdir("class/drm"):
            if not DRM_CARD.match(card):
                continue
            if reader.link_name(f"class/drm/{card}/device/driver") not in drivers:
                continue
            identity = self.pci_identity(reader, f"class/drm/{card}/device")
            if identity is not None:
                yield card, identity

    def close(self) -> None:
        return None


def device_reading(device: Device, samples: list[Sample]) -> DeviceReading:
    return DeviceReading(device, tuple(samples))


DRM_CARD = re.compile(r"^card\d+$")
