"""Intel GPUs from i915 and xe sysfs: frequency, idle residency, hwmon energy and temperatures.

The Intel GPU plugin hands out `cardN-i` IDs (`i` a sharing slot); the join strips `-i`,
so a GPU answers to `cardN` and to its PCI address, which is its `hw.id`.

Neither driver has a busy counter in sysfs: busy is derived from the GT idle (RC6)
residency, `1 - Δidle / Δt`, and power from the hwmon energy counter, `Δenergy / Δt`,
both between two cycles (the first cycle after start has neither). A GPU with several
render/compute GTs (multi-tile parts) reports their mean; media GTs (xe `gtN-mc`) are
left out, as their idleness says nothing about compute.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import replace

from exporter.model import Device, DeviceReading, ProcessUsage, Sample
from exporter.sources import SourceContext, add, option_values, register
from exporter.sources.sysfs.drmfdinfo import DrmProcesses, processes_option
from exporter.sources.sysfs.hwmon import hwmon_samples, read_hwmon
from exporter.sources.sysfs.reader import MEGAHERTZ, Reader, numbered
from exporter.sources.sysfs.source import PciIdentity, SysfsSource, alias, device_reading

MODELS = {
    "0x56c0": "Intel Data Center GPU Flex 170",
    "0x56c1": "Intel Data Center GPU Flex 140",
    "0x0bd5": "Intel Data Center GPU Max 1550",
    "0x0bda": "Intel Data Center GPU Max 1100",
    "0xe20b": "Intel Arc B580",
}
"""PCI device IDs of common data-center parts; others are named by driver and IDs."""

DEVICE_HWMON = {"i915", "xe"}
"""hwmon chip names of the whole device (i915 also has per-GT `i915_gtN` chips)."""


OPTIONS = (processes_option("per-process memory and engine time from DRM fdinfo"),)
"""`--collector.intel.*`."""


class IntelSource(SysfsSource):
    name = "intel"
    looks_for = "class/drm cards bound to i915 or xe"

    def __init__(self, ctx: SourceContext) -> None:
        super().__init__(ctx)
        self.with_processes: bool = option_values(OPTIONS, ctx.options)["processes"]
        self.drm = DrmProcesses(ctx.procfs, ("i915", "xe"), ctx.clock or time.monotonic, ctx.logger)

    def processes(
        self, reader: Reader, readings: Sequence[DeviceReading]
    ) -> Iterator[ProcessUsage]:
        """Per-process device memory and engine time from DRM fdinfo (i915 and xe have no
        other per-process source); a GPU's `hw.id` is its PCI address, as `drm-pdev`."""
        if self.with_processes:
            yield from self.drm.read({r.device.id: r.device.id for r in readings})

    def read(self, reader: Reader) -> Iterator[DeviceReading]:
        for card, pci in self.drm_cards(reader, ("i915", "xe")):
            yield self._gpu(reader, card, pci)

    def _gpu(self, reader: Reader, card: str, pci: PciIdentity) -> DeviceReading:
        device = Device(
            id=pci.address,
            type="gpu",
            vendor="intel",
            model=MODELS.get(pci.device_id, pci.generic_model),
            source=self.name,
            attributes=(("hw.pci.bus_id", pci.address), ("hw.gpu.partition", card)),
            aliases=frozenset({alias(pci.address), card}),
        )
        samples: list[Sample] = []
        gts = _gts_xe(reader, card) if pci.driver == "xe" else _gts_i915(reader, card)
        clocks: list[float] = []
        idle: list[float] = []
        for gt, freq_rel, idle_rel in gts:
            mhz = reader.number(freq_rel, MEGAHERTZ)
            if mhz is not None:
                clocks.append(mhz * 1e6)
            # Each GT's counter is kept monotonic on its own, so their mean is too.
            idle_ms = self.counters.value(f"{device.id}/{gt}", "idle_ms", reader.number(idle_rel))
            if idle_ms is not None:
                idle.append(idle_ms / 1000.0)
        if clocks:
            add(
                samples,
                "hw.gpu.clock",
                sum(clocks) / len(clocks),
                ("hw.gpu.clock.type", "graphics"),
            )
        if idle and len(idle) == len(gts):
            idle_seconds = sum(idle) / len(idle)
            add(samples, "hw.gpu.idle.time", idle_seconds)
            idle_fraction = self.rates.per_second(f"{device.id}/idle", idle_seconds)
            if idle_fraction is not None:
                busy = min(1.0, max(0.0, 1.0 - idle_fraction))
                add(samples, "hw.gpu.utilization", busy, ("hw.gpu.task", "general"))
        for chip in read_hwmon(reader, f"class/drm/{card}/device"):
            if chip.name not in DEVICE_HWMON:
                continue
            if chip.power_watts is None:
                # No power file on i915/xe: power is the energy counter's rate.
                power = self.rates.per_second(f"{device.id}/energy", chip.energy_joules)
                chip = replace(chip, power_watts=power)
            hwmon_samples(samples, chip, self.counters, device.id)
        return device_reading(device, samples)


register(
    "intel",
    help="Intel GPUs (i915, xe) from sysfs and hwmon",
    options=OPTIONS,
)(IntelSource)


def _gts_i915(reader: Reader, card: str) -> list[tuple[str, str, str]]:
    """(gt, actual-frequency file, RC6 residency file) per GT; legacy single-GT paths."""
    base = f"class/drm/{card}"
    gts = [g for g in reader.listdir(f"{base}/gt") if g.startswith("gt")]
    if not gts:
        return [("gt0", f"{base}/gt_act_freq_mhz", f"{base}/power/rc6_residency_ms")]
    return [
        (gt, f"{base}/gt/{gt}/rps_act_freq_mhz", f"{base}/gt/{gt}/rc6_residency_ms") for gt in gts
    ]


def _gts_xe(reader: Reader, card: str) -> list[tuple[str, str, str]]:
    """(tile/gt, `freq0/act_freq`, `gtidle/idle_residency_ms`) of every non-media GT."""
    dev = f"class/drm/{card}/device"
    found = []
    for tile in (t for t in reader.listdir(dev) if numbered(t, "tile") is not None):
        for gt in (g for g in reader.listdir(f"{dev}/{tile}") if g.startswith("gt")):
            rel = f"{dev}/{tile}/{gt}"
            if (reader.text(f"{rel}/gtidle/name") or "").endswith("-mc"):
                continue
            found.append(
                (f"{tile}/{gt}", f"{rel}/freq0/act_freq", f"{rel}/gtidle/idle_residency_ms")
            )
    return found
