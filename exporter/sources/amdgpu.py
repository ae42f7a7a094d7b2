"""AMD GPUs from amdgpu sysfs: activity, memory, hwmon, PCIe replays, RAS, partitions.

Device-plugin IDs (ROCm k8s-device-plugin) are PCI addresses (`0000:19:00.0`) for whole
GPUs and `amdgpu_xcp_<N>` for MI300 compute partitions. A GPU's `hw.id` is its persistent
`unique_id` where the driver has one (GFX9+), else its PCI address. Partitions are their
own devices (parent: the GPU), tied to it through the KFD topology: the partition's render
node is a KFD node whose `location_id`/`domain` is the GPU's PCI address.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from exporter.attribution.resolver import read_small
from exporter.model import Device, DeviceReading, ProcessUsage, Sample
from exporter.sources import SourceContext, add, option_values, register
from exporter.sources.sysfs.drmfdinfo import DrmProcesses, processes_option
from exporter.sources.sysfs.hwmon import hwmon_samples, read_hwmon
from exporter.sources.sysfs.reader import PERCENT, U64, Reader, numbered, parse_integer
from exporter.sources.sysfs.source import PciIdentity, SysfsSource, alias, device_reading

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
KFD_PROCESSES = "class/kfd/kfd/proc"
PARTITIONS = "devices/platform"


OPTIONS = (processes_option("per-process VRAM (KFD) and DRM fdinfo memory and engine time"),)
"""`--collector.amdgpu.*`."""


class AmdgpuSource(SysfsSource):
    name = "amdgpu"
    looks_for = "class/drm cards bound to amdgpu"

    def __init__(self, ctx: SourceContext) -> None:
        super().__init__(ctx)
        self.with_processes: bool = option_values(OPTIONS, ctx.options)["processes"]
        self.drm = DrmProcesses(ctx.procfs, ("amdgpu",), ctx.clock or time.monotonic, ctx.logger)
        self._kfd_devices: dict[str, str] = {}
        """KFD gpu_id -> the device it is (a partition's own node, else the GPU)."""
        self._partition_minors: dict[int, str] = {}
        """Render minor -> the partition (`amdgpu_xcp_<N>`) it belongs to."""

    def read(self, reader: Reader) -> Iterator[DeviceReading]:
        gpus: dict[str, Device] = {}
        for card, pci in self.drm_cards(reader, ("amdgpu",)):
            reading = self._gpu(reader, f"class/drm/{card}/device", pci)
            gpus[pci.address] = reading.device
            yield reading
        nodes = _kfd_nodes_by_render_minor(reader)
        partitions = list(self._partitions(reader, gpus, nodes))
        yield from partitions
        partition_ids = {p.device.id for p in partitions}
        self._kfd_devices = {}
        for minor, node in nodes.items():
            owner = self._partition_minors.get(minor)
            device_id = owner if owner in partition_ids else None
            if device_id is None and node.pci_address in gpus:
                device_id = gpus[node.pci_address].id
            if device_id is not None and node.gpu_id:
                self._kfd_devices[node.gpu_id] = device_id

    def processes(
        self, reader: Reader, readings: Sequence[DeviceReading]
    ) -> Iterator[ProcessUsage]:
        """KFD's per-process VRAM (ROCm compute: `/sys/class/kfd/kfd/proc/<pid>/vram_<gpu_id>`,
        host PIDs, world-readable) and DRM fdinfo (memory and engine time of every DRM
        client). A process KFD lists takes its memory from KFD only: its DRM file's VM
        holds the same buffers, and the two are never added."""
        if not self.with_processes:
            return
        kfd = self._kfd_memory()
        gpus = {
            dict(r.device.attributes).get("hw.pci.bus_id", ""): r.device.id
            for r in readings
            if not r.device.parent
        }
        kfd_pids = {pid for pid, _ in kfd}
        for (pid, device_id), vram in sorted(kfd.items()):
            yield ProcessUsage(device_id, pid, float(vram))
        for usage in self.drm.read(gpus):
            if usage.pid in kfd_pids:
                if usage.utilization is not None:
                    yield ProcessUsage(usage.device_id, usage.pid, None, usage.utilization)
                continue
            yield usage

    def _kfd_memory(self) -> dict[tuple[int, str], int]:
        """(pid, device) -> VRAM bytes. Read without the Reader's error accounting: a
        process that exits between the listing and the read is not a broken driver."""
        root = self.ctx.sysfs / KFD_PROCESSES
        try:
            pids = [int(e) for e in os.listdir(root) if e.isdigit()]
        except OSError:
            return {}
        out: dict[tuple[int, str], int] = {}
        for pid in pids:
            try:
                entries = os.listdir(root / str(pid))
            except OSError:
                continue
            for entry in entries:
                gpu_id = entry.removeprefix("vram_")
                device_id = self._kfd_devices.get(gpu_id)
                if entry == gpu_id or device_id is None:
                    continue
                text = (read_small(root / str(pid) / entry, 16 * 1024) or "").strip()
                if text.isdigit():
                    key = (pid, device_id)
                    out[key] = out.get(key, 0) + int(text)
        return out

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

    def _partitions(
        self, reader: Reader, gpus: dict[str, Device], nodes: dict[int, _KfdNode]
    ) -> Iterator[DeviceReading]:
        self._partition_minors = {}
        for entry in reader.listdir(PARTITIONS):
            if not entry.startswith("amdgpu_xcp_"):
                continue
            minor = next(
                (
                    m
                    for d in reader.listdir(f"{PARTITIONS}/{entry}/drm")
                    if (m := numbered(d, "renderD")) is not None and m in nodes
                ),
                None,
            )
            node = None if minor is None else nodes[minor]
            if minor is not None:
                self._partition_minors[minor] = entry
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
    gpu_id: str = ""
    """`topology/nodes/<n>/gpu_id`: what KFD's per-process files are named by."""


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
        gpu_id = (reader.text(f"{rel}/gpu_id") or "").strip()
        nodes[minor] = _KfdNode(rel, address, gpu_id if gpu_id.isdigit() else "")
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


register(
    "amdgpu",
    help="AMD GPUs and MI300 partitions from amdgpu sysfs and hwmon",
    options=OPTIONS,
)(AmdgpuSource)


def _ratio(percent: int | None) -> float | None:
    return None if percent is None else percent / 100.0
