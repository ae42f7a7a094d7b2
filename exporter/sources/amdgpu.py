"""AMD GPUs from amdgpu sysfs: activity, memory, hwmon, PCIe replays, RAS, partitions.

Device-plugin IDs (ROCm k8s-device-plugin) are PCI addresses (`0000:19:00.0`) for whole
GPUs and `amdgpu_xcp_<N>` for MI300 compute partitions. A GPU's `hw.id` is its persistent
`unique_id` where the driver has one (GFX9+), else its PCI address. Partitions are their
own devices (parent: the GPU), tied to it through the KFD topology: the partition's render
node is a KFD node whose `location_id`/`domain` is the GPU's PCI address.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from exporter.model import Device, DeviceReading, Sample
from exporter.sources import add, register
from exporter.sources.sysfs import (
    PERCENT,
    U64,
    PciIdentity,
    Reader,
    SysfsSource,
    alias,
    device_reading,
    hwmon_samples,
    numbered,
    parse_integer,
    read_hwmon,
)

MEMORY_FILES = (
    ("hw.gpu.memory.usage", "mem_info_vram_used"),
    ("hw.gpu.memory.limit", "mem_info_vram_total"),
    ("hw.gpu.memory.visible.usage", "mem_info_vis_vram_used"),
    ("hw.gpu.memory.visible.limit", "mem_info_vis_vram_total"),
    ("hw.gpu.memory.gtt.usage", "mem_info_gtt_used"),
    ("hw.gpu.memory.gtt.limit", "mem_info_gtt_total"),
)
"""(metric, file in bytes) pairs under the PCI device directory."""

RAS_ERROR_TYPES = {"ue": "ecc_uncorrected", "ce": "ecc_corrected", "de": "ecc_deferred"}
"""`ras/<block>_err_count` line keys -> `error.type`."""

KFD_NODES = "class/kfd/kfd/topology/nodes"
PARTITIONS = "devices/platform"


class AmdgpuSource(SysfsSource):
    name = "amdgpu"
    looks_for = "class/drm cards bound to amdgpu"

    def read(self, reader: Reader) -> Iterator[DeviceReading]:
        gpus: dict[str, Device] = {}
        for card, pci in self.drm_cards(reader, ("amdgpu",)):
            reading = self._gpu(reader, f"class/drm/{card}/device", pci)
            gpus[pci.address] = reading.device
            yield reading
        yield from self._partitions(reader, gpus)

    def _gpu(self, reader: Reader, dev: str, pci: PciIdentity) -> DeviceReading:
        device = self.stable(reader, f"gpu/{pci.address}", lambda: self._identity(reader, dev, pci))
        device_id = device.id
        samples: list[Sample] = []
        busy = reader.integer(f"{dev}/gpu_busy_percent", PERCENT)
        add(samples, "hw.gpu.utilization", _ratio(busy), ("hw.gpu.task", "general"))
        mem_busy = reader.integer(f"{dev}/mem_busy_percent", PERCENT)
        add(samples, "hw.gpu.memory.bandwidth.utilization", _ratio(mem_busy))
        for metric, filename in MEMORY_FILES:
            add(samples, metric, reader.integer(f"{dev}/{filename}"))
        for chip in read_hwmon(reader, dev):
            hwmon_samples(samples, chip, self.counters, device_id)
        replays = reader.integer(f"{dev}/pcie_replay_count")
        self.counters.add(samples, device_id, "hw.errors", replays, ("error.type", "pcie_replay"))
        self._ras(reader, dev, device_id, samples)
        return device_reading(device, samples)

    def _identity(self, reader: Reader, dev: str, pci: PciIdentity) -> Device:
        unique_id = (reader.text(f"{dev}/unique_id") or "").lower()
        return Device(
            id=unique_id if unique_id.strip("0") else pci.address,
            type="gpu",
            vendor="amd",
            model=reader.text(f"{dev}/product_name") or pci.generic_model,
            source=self.name,
            attributes=(
                ("hw.pci.bus_id", pci.address),
                ("hw.serial_number", reader.text(f"{dev}/serial_number") or ""),
            ),
            aliases=frozenset({alias(pci.address)}),
        )

    def _ras(self, reader: Reader, dev: str, device_id: str, samples: list[Sample]) -> None:
        for entry in reader.listdir(f"{dev}/ras"):
            if not entry.endswith("_err_count"):
                continue
            block = entry.removesuffix("_err_count")
            counts = reader.keyed(f"{dev}/ras/{entry}") or {}
            for key, error_type in RAS_ERROR_TYPES.items():
                # A busy RAS answers "Query currently inaccessible": Counters repeats the last.
                self.counters.add(
                    samples,
                    device_id,
                    "hw.errors",
                    counts.get(key),
                    ("error.type", error_type),
                    ("hw.error.block", block),
                )

    def _partitions(self, reader: Reader, gpus: dict[str, Device]) -> Iterator[DeviceReading]:
        nodes = _kfd_nodes_by_render_minor(reader)
        for entry in reader.listdir(PARTITIONS):
            if not entry.startswith("amdgpu_xcp_"):
                continue
            node = next(
                (
                    nodes[minor]
                    for d in reader.listdir(f"{PARTITIONS}/{entry}/drm")
                    if (minor := numbered(d, "renderD")) is not None and minor in nodes
                ),
                None,
            )
            # A render node KFD does not list is not a usable partition (as the plugin does).
            if node is None or node.pci_address not in gpus:
                continue
            gpu = gpus[node.pci_address]
            device = Device(
                id=entry,
                type="gpu",
                vendor="amd",
                model=gpu.model,
                source=self.name,
                parent=gpu.id,
                attributes=(("hw.pci.bus_id", node.pci_address), ("hw.gpu.partition", entry)),
                aliases=frozenset({entry}),
            )
            samples: list[Sample] = []
            bank = f"{node.rel}/mem_banks/0"
            add(samples, "hw.gpu.memory.usage", reader.integer(f"{bank}/used_memory"))
            size = _properties(reader.text(f"{bank}/properties") or "").get("size_in_bytes")
            add(samples, "hw.gpu.memory.limit", size)
            yield device_reading(device, samples)


@dataclass(frozen=True, slots=True)
class _KfdNode:
    rel: str
    pci_address: str


def _kfd_nodes_by_render_minor(reader: Reader) -> dict[int, _KfdNode]:
    nodes: dict[int, _KfdNode] = {}
    for entry in reader.listdir(KFD_NODES):
        rel = f"{KFD_NODES}/{entry}"
        props = _properties(reader.text(f"{rel}/properties") or "")
        minor, location = props.get("drm_render_minor", 0), props.get("location_id")
        if minor <= 0 or location is None:
            continue  # a CPU node
        # location_id is the PCI bus/device/function as bus<<8 | device<<3 | function.
        bus, slot, fn = location >> 8, (location >> 3) & 0x1F, location & 0x7
        address = f"{props.get('domain', 0):04x}:{bus:02x}:{slot:02x}.{fn}"
        nodes[minor] = _KfdNode(rel, address)
    return nodes


def _properties(text: str) -> dict[str, int]:
    """KFD `properties` files: one `name value` pair a line (unsigned; others skipped)."""
    props: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        value = parse_integer(parts[1], U64) if len(parts) == 2 else None
        if value is not None:
            props[parts[0]] = value
    return props


register("amdgpu", help="AMD GPUs and MI300 partitions from amdgpu sysfs and hwmon")(AmdgpuSource)


def _ratio(percent: int | None) -> float | None:
    return None if percent is None else percent / 100.0
