"""The file-reading layer every sysfs source shares (amdgpu, intel, rdma, netdev).

Rules learnt from node_exporter/procfs: read each file once per cycle with one small
read (broken drivers answer EAGAIN forever, and some attributes are slow to produce), and
let no single file fail a cycle: an unreadable, garbage or vanished file skips that one
field and is counted. A file that was never there is "not supported" (no series, no error):
only a file that was readable before and is not now counts as an error, so a driver that
lacks `power1_input` is quiet while a hwmon that starts failing is visible.

Values are checked, not just parsed: a number must be plain ASCII decimal (or 0x hex for
integers) and inside what the field can hold (`U64` unless the caller gives a physical range:
a percentage is 0..100, a temperature above absolute zero); anything else is a field error
for that one field, never an exception. Counters go through `Counters`
(`exporter.sources.counters`): held while a file is briefly unreadable, reset only when a
second read confirms it, so one bad read can neither corrupt nor reverse a counter.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

from exporter.join import normalize_device_id, pci_address
from exporter.log import StateLog
from exporter.model import Attributes, Device, DeviceReading, ProcessUsage, Sample, SourceResult
from exporter.sources import SourceContext, add
from exporter.sources.counters import MonotonicCounters

T = TypeVar("T")

BUFFER_BYTES = 4096
"""One read of at most a page: what a sysfs attribute's show() can return."""

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

_KEYED_LINE = re.compile(r"^\s*(?P<key>[A-Za-z_]\w*)\s*:\s*(?P<value>[0-9]{1,20})\s*$", re.ASCII)
_INTEGER = re.compile(r"-?[0-9]{1,20}|0[xX][0-9a-fA-F]{1,16}")
_NUMBER = re.compile(r"-?[0-9]{1,20}(?:\.[0-9]{1,20})?")

Bounds = tuple[float, float]
U64: Bounds = (0, 2**64 - 2)
"""What an unsigned 64-bit sysfs attribute can hold, the default for every integer; all ones
(2^64-1) is excluded: it is -1 (a driver's error value) printed with %llu, never a count."""
PERCENT: Bounds = (0, 100)
MILLI_CELSIUS: Bounds = (-273_150, 500_000)
"""hwmon temperatures: above absolute zero, below what any sensor reports before it fails."""
MICROWATTS: Bounds = (0, 10**10)
"""hwmon power: up to 10 kW, more than any one device draws."""
HERTZ: Bounds = (0, 10**11)
MEGAHERTZ: Bounds = (0, 10**5)


class Reader:
    """One cycle's reads under one sysfs root. Paths are relative to the root."""

    def __init__(self, root: Path, seen: set[str]) -> None:
        self.root = root
        self.errors = 0
        self._seen = seen
        self._cache: dict[str, str | None] = {}

    def text(self, rel: str) -> str | None:
        """The file's content, stripped; None when absent or unreadable (counted)."""
        if rel in self._cache:
            return self._cache[rel]
        value = self._read(rel)
        self._cache[rel] = value
        return value

    def _read(self, rel: str) -> str | None:
        try:
            # O_NONBLOCK: a read that would block returns EAGAIN instead of hanging a worker.
            fd = os.open(self.root / rel, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            self._missing(rel)
            return None
        except OSError:
            self.errors += 1
            return None
        try:
            data = os.read(fd, BUFFER_BYTES)
        except OSError as exc:
            # EAGAIN (a driver with nothing to say), EIO, ENODATA (pcie_bw on APUs)...
            if exc.errno not in (errno.ENODATA, errno.EOPNOTSUPP) or rel in self._seen:
                self.errors += 1
            return None
        finally:
            os.close(fd)
        try:
            text = data.decode()
        except UnicodeDecodeError:
            self.errors += 1
            return None
        self._seen.add(rel)
        return text.strip()

    def _missing(self, rel: str) -> None:
        if rel in self._seen:
            self.errors += 1  # every cycle it stays away: that field is skipped each time

    def garbage(self) -> None:
        """The caller could not parse what it read: one more skipped field."""
        self.errors += 1

    def integer(self, rel: str, bounds: Bounds = U64) -> int | None:
        """A decimal or 0x-hex integer file within `bounds`; anything else is a field error."""
        text = self.text(rel)
        if text is None:
            return None
        value = parse_integer(text, bounds)
        if value is None:
            self.garbage()
        return value

    def first_integer(self, *alternatives: str, bounds: Bounds = U64) -> int | None:
        """The first of alternative files that exists (kernels name some things differently)."""
        for rel in alternatives:
            if self.exists(rel):
                return self.integer(rel, bounds)
        for rel in alternatives:
            self.text(rel)  # none there: counts one that was there before
        return None

    def number(self, rel: str, bounds: Bounds = U64) -> float | None:
        """A plain decimal file (`1.5`, no exponent, no inf/nan) within `bounds`."""
        text = self.text(rel)
        if text is None:
            return None
        value = parse_number(text, bounds)
        if value is None:
            self.garbage()
        return value

    def keyed(self, rel: str) -> dict[str, int] | None:
        """`key: value` lines (AMD RAS `ue: 0` / `ce: 3`); None when any line is garbage."""
        text = self.text(rel)
        if text is None:
            return None
        values: dict[str, int] = {}
        for line in text.splitlines():
            m = _KEYED_LINE.match(line)
            if not m:
                # e.g. "Query currently inaccessible" while RAS is busy
                self.garbage()
                return None
            count = int(m["value"])
            if count > U64[1]:
                self.garbage()
                return None
            values[m["key"].lower()] = count
        return values or None

    def listdir(self, rel: str) -> list[str]:
        """Sorted entries of a directory; [] when it does not exist."""
        try:
            return sorted(os.listdir(self.root / rel))
        except FileNotFoundError:
            return []
        except OSError:
            self.errors += 1
            return []

    def exists(self, rel: str) -> bool:
        return os.path.lexists(self.root / rel)

    def link_name(self, rel: str) -> str | None:
        """The last component of a symlink's target (a `driver` link -> `amdgpu`)."""
        try:
            return os.path.basename(os.readlink(self.root / rel))
        except FileNotFoundError:
            return None
        except OSError:
            self.errors += 1
            return None

    def pci_address_of(self, rel: str) -> str | None:
        """Canonical PCI address of the device a `device` link (or a device dir) names."""
        return pci_address(os.path.basename(os.path.realpath(self.root / rel)))


def parse_integer(text: str, bounds: Bounds = U64) -> int | None:
    """`text` as a sysfs integer within `bounds`, or None (never raises)."""
    text = text.strip()
    if not _INTEGER.fullmatch(text):
        return None
    value = int(text, 16) if text[:2] in ("0x", "0X") else int(text)
    return value if bounds[0] <= value <= bounds[1] else None


def numbered(entry: str, prefix: str) -> int | None:
    """N of a directory entry `<prefix>N` (ASCII digits only), else None."""
    digits = entry.removeprefix(prefix)
    if digits == entry or not (digits.isascii() and digits.isdigit()):
        return None
    return int(digits)


def parse_number(text: str, bounds: Bounds = U64) -> float | None:
    """`text` as a plain decimal within `bounds`, or None (never raises)."""
    text = text.strip()
    if not _NUMBER.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) and bounds[0] <= value <= bounds[1] else None


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


# --- hwmon -------------------------------------------------------------------------------

TEMPERATURE_LOCATIONS = {
    "edge": "edge",
    "junction": "junction",
    "mem": "memory",
    "vram": "memory",
    "pkg": "package",
}
"""hwmon `temp*_label` (amdgpu: edge/junction/mem; xe: pkg/vram) -> `hw.sensor_location`."""

CLOCK_TYPES = {"sclk": "graphics", "mclk": "memory"}
"""hwmon `freq*_label` (amdgpu) -> `hw.gpu.clock.type`."""

_CHANNEL = re.compile(r"^(?P<kind>temp|freq|energy|power)(?P<n>\d+)_input$")
_CHANNEL_BOUNDS = {"temp": MILLI_CELSIUS, "freq": HERTZ, "energy": U64, "power": MICROWATTS}


@dataclass(frozen=True, slots=True)
class HwmonReading:
    """One hwmon chip, converted to base units (sysfs: m°C, µW, µJ, Hz)."""

    name: str
    temperatures_celsius: dict[str, float] = field(default_factory=dict)
    clocks_hertz: dict[str, float] = field(default_factory=dict)
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules: float | None = None


def read_hwmon(reader: Reader, device_rel: str) -> list[HwmonReading]:
    """Every hwmon chip under a device (`<device>/hwmon/hwmon*`)."""
    chips = []
    for entry in reader.listdir(f"{device_rel}/hwmon"):
        if entry.startswith("hwmon"):
            chips.append(_read_chip(reader, f"{device_rel}/hwmon/{entry}"))
    return chips


def _read_chip(reader: Reader, rel: str) -> HwmonReading:
    temps: dict[str, float] = {}
    clocks: dict[str, float] = {}
    energy: dict[str, float] = {}
    for entry in reader.listdir(rel):
        m = _CHANNEL.match(entry)
        if not m or m["kind"] == "power":
            continue
        channel = f"{m['kind']}{m['n']}"
        label = (reader.text(f"{rel}/{channel}_label") or "").lower()
        value = reader.integer(f"{rel}/{entry}", _CHANNEL_BOUNDS[m["kind"]])
        if value is None:
            continue
        if m["kind"] == "temp":
            temps[TEMPERATURE_LOCATIONS.get(label, label or channel)] = value / 1000.0
        elif m["kind"] == "freq":
            clocks[CLOCK_TYPES.get(label, label or channel)] = float(value)
        else:
            energy[label or channel] = value / 1e6
    # amdgpu: power1_average (all kernels; averaged like NVML's) or power1_input (6.7+).
    power = reader.first_integer(f"{rel}/power1_average", f"{rel}/power1_input", bounds=MICROWATTS)
    limit = reader.first_integer(f"{rel}/power1_cap", f"{rel}/power1_max", bounds=MICROWATTS)
    return HwmonReading(
        name=reader.text(f"{rel}/name") or "",
        temperatures_celsius=temps,
        clocks_hertz=clocks,
        power_watts=None if power is None else power / 1e6,
        power_limit_watts=None if not limit else limit / 1e6,
        # xe labels its channels card/pkg: the card is the device's own energy.
        energy_joules=energy.get("card", energy.get("energy1")),
    )


def hwmon_samples(samples: list[Sample], chip: HwmonReading, counters: Counters, key: str) -> None:
    """The samples every hwmon chip gives, in the shared schema."""
    add(samples, "hw.power", chip.power_watts)
    add(samples, "hw.power.limit", chip.power_limit_watts)
    counters.add(samples, key, "hw.energy", chip.energy_joules)
    for location, celsius in sorted(chip.temperatures_celsius.items()):
        add(samples, "hw.temperature", celsius, ("hw.sensor_location", location))
    for clock, hertz in sorted(chip.clocks_hertz.items()):
        add(samples, "hw.gpu.clock", hertz, ("hw.gpu.clock.type", clock))


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
process's file descriptors took 5-7 ms per source and cycle on a developer machine with a
few hundred processes (56-97 ms with 1,093): too much for a 1 s interval."""


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
