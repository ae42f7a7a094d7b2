"""hwmon chips under a device (`<device>/hwmon/hwmon*`): temperatures, clocks, power, energy.

The kernel's hwmon sysfs interface (Documentation/hwmon/sysfs-interface.rst) in milli-degrees,
microwatts, microjoules and hertz, converted to base units here; `hwmon_samples` turns a
chip into the shared `hw.*` samples for amdgpu and intel.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from exporter.model import Sample
from exporter.sources import add
from exporter.sources.sysfs.reader import HERTZ, MICROWATTS, MILLI_CELSIUS, U64, Reader
from exporter.sources.sysfs.source import Counters

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
