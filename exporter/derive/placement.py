"""GPU-NIC placement: how far apart, in the PCIe tree, a container's GPUs and NICs sit.

GPUDirect RDMA moves data between a GPU and a NIC over PCIe peer-to-peer; it is fast only
when the two meet below the CPU (one PCIe switch), slower through a root complex, and
slowest across the CPU interconnect (UPI/xGMI). The levels are nvidia-smi `topo -m`'s and
NVML's `nvmlGpuTopologyLevel_t`, best first:

| level | NVML                        | nvidia-smi legend                                     |
|-------|-----------------------------|-------------------------------------------------------|
| PIX 1 | NVML_TOPOLOGY_SINGLE        | traversing a single PCIe switch (at most one bridge)  |
| PXB 2 | NVML_TOPOLOGY_MULTIPLE      | traversing multiple PCIe switches, not the host bridge|
| PHB 3 | NVML_TOPOLOGY_HOSTBRIDGE    | traversing PCIe as well as a PCIe host bridge         |
| NODE 4| NVML_TOPOLOGY_NODE          | ... the interconnect between host bridges in a NUMA node |
| SYS 5 | NVML_TOPOLOGY_SYSTEM        | ... the SMP interconnect between NUMA nodes (QPI/UPI) |

Where a device sits comes from sysfs, which mirrors the kernel's device tree
(Documentation/filesystems/sysfs.rst: "devices/ ... maps directly to the internal kernel
device tree"; Documentation/PCI/sysfs-pci.rst): `bus/pci/devices/<BDF>` links to
`devices/pci<domain>:<bus>/<root port>/<switch upstream port>/<downstream port>/<BDF>`.
`pci<domain>:<bus>` is the root bus behind one host bridge; every `dddd:bb:dd.f` below it
is a PCI-to-PCI bridge (a root port, then each switch's upstream and downstream ports, as
a PCIe switch is one upstream and several downstream virtual bridges on an internal bus,
PCIe Base Specification §1.3.3) until the device itself. `numa_node` is the node the
device is attached to, -1 if unknown (Documentation/ABI/testing/sysfs-bus-pci).

Reads happen in the poller's worker thread, at most once per PCI address every
`refresh` seconds (the tree changes only with hotplug), never on a scrape.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

from exporter.model import (
    Allocation,
    Device,
    Holder,
    JoinedDevice,
    PairPlacement,
    Snapshot,
)
from exporter.runtime import hostfiles
from exporter.runtime.evolve import evolve

_HOST_BRIDGE = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


class Level(IntEnum):
    """Rank of a GPU-NIC path: lower is closer (the value of the series)."""

    PIX = 1
    PXB = 2
    PHB = 3
    NODE = 4
    SYS = 5


@dataclass(frozen=True, slots=True)
class PciPath:
    """Where one PCI function sits: its host bridge, the bridges above it, its NUMA node."""

    address: str
    host_bridge: str
    """`pci0000:00`: the root bus of one host bridge."""
    bridges: tuple[str, ...]
    """Root port first, down to the bridge the device hangs from."""
    numa_node: int | None
    """None when sysfs says -1 (unknown) or the file is unreadable."""


def parse_device_path(address: str, resolved: str) -> tuple[str, tuple[str, ...]] | None:
    """(host bridge, bridges) from the resolved `devices/...` path of `address`; None when
    the path has no `pciDDDD:BB` root or does not end in `address`."""
    parts = resolved.split("/")
    roots = [i for i, part in enumerate(parts) if _HOST_BRIDGE.match(part)]
    if not roots or parts[-1] != address:
        return None
    root = roots[-1]  # a virtual machine's bus (VMBus, PNP0A03) may sit above it
    chain = parts[root + 1 : -1]
    if not all(_BDF.match(part) for part in chain):
        return None
    return parts[root], tuple(chain)


def read_pci_path(sysfs: Path, address: str) -> PciPath | None:
    """The PCI path of `address` from `<sysfs>/bus/pci/devices/<address>`; None when the
    device is not there (hot-removed, another node's sysfs) or the link is not a PCI path."""
    link = sysfs / "bus" / "pci" / "devices" / address
    try:
        resolved = os.path.realpath(link, strict=True)
    except OSError:
        return None
    parsed = parse_device_path(address, resolved)
    if parsed is None:
        return None
    text = hostfiles.read_text(Path(resolved) / "numa_node", 64, nofollow=True)
    try:
        node: int | None = int(text) if text is not None else None
    except ValueError:
        node = None
    return PciPath(address, parsed[0], parsed[1], node if node is not None and node >= 0 else None)


def _switch_of(bridges: tuple[str, ...], index: int) -> str:
    """The unit a bridge belongs to: the root port itself (index 0), else its switch, named
    by the switch's upstream port (odd indexes are upstream ports, even their downstream)."""
    if index == 0:
        return bridges[0]
    return bridges[index if index % 2 else index - 1]


def level(a: PciPath, b: PciPath, *, single_node: bool = False) -> Level | None:
    """The nvidia-smi level between two PCI functions; None when it cannot be told (NUMA
    node unknown for a pair on different host bridges of a multi-node machine).
    `single_node`: the machine has one NUMA node, so an unknown node is that one."""
    if a.host_bridge == b.host_bridge:
        common = 0
        for x, y in zip(a.bridges, b.bridges, strict=False):
            if x != y:
                break
            common += 1
        if common == 0:
            return Level.PHB
        touched = {
            _switch_of(path.bridges, i)
            for path in (a, b)
            for i in range(common - 1, len(path.bridges))
        }
        return Level.PIX if len(touched) <= 1 else Level.PXB
    if single_node:
        return Level.NODE
    if a.numa_node is None or b.numa_node is None:
        return None
    return Level.NODE if a.numa_node == b.numa_node else Level.SYS


def device_pci_address(device: Device, devices: Mapping[str, Device]) -> str:
    """The PCI address of a device, or of its parent (a MIG slice's GPU); "" if none."""
    for candidate in (device, devices.get(device.parent)):
        if candidate is None:
            continue
        for key, value in candidate.attributes:
            if key == "hw.pci.bus_id" and value:
                return value
    return ""


class PlacementReader:
    """Pairs of every container holding both GPUs and NICs, with their level.

    PCI paths are read once per address and kept for `refresh` seconds."""

    def __init__(
        self,
        sysfs: Path,
        *,
        refresh: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sysfs = sysfs
        self.refresh = refresh
        self._clock = clock
        self._paths: dict[str, PciPath | None] = {}
        self._read_at = 0.0
        self._looked_up = 0
        """Calls of `path` so far: a result that made none does not age with the paths."""
        self._last: tuple[object, bool, tuple[PairPlacement, ...]] | None = None
        """(what the last pairs were made of, whether they read PCI paths, the pairs)."""

    def path(self, address: str) -> PciPath | None:
        self._looked_up += 1
        now = self._clock()
        if now - self._read_at > self.refresh:
            self._paths.clear()
            self._read_at = now
        if address not in self._paths:
            self._paths[address] = read_pci_path(self.sysfs, address)
        return self._paths[address]

    def step(self, snapshot: Snapshot, cpu_nodes: Mapping[int, int]) -> Snapshot:
        """A snapshot step (Poller `steps`): adds `placements`. The pairs are made again
        only when the allocations, the devices or the CPU map changed, or when the PCI
        paths they were made from are due to be read again (`refresh`)."""
        key = (
            snapshot.allocations,
            tuple(j.reading.device for j in snapshot.devices),
            len(set(cpu_nodes.values())) == 1,
        )
        last = self._last
        if (
            last is None
            or last[0] != key
            or (last[1] and self._clock() - self._read_at > self.refresh)
        ):
            looked_up = self._looked_up
            pairs = self.placements(snapshot.allocations, snapshot.devices, cpu_nodes)
            last = self._last = (key, self._looked_up != looked_up, pairs)
        return evolve(snapshot, placements=last[2])

    def placements(
        self,
        allocations: Iterable[Allocation],
        joined: Iterable[JoinedDevice],
        cpu_nodes: Mapping[int, int],
    ) -> tuple[PairPlacement, ...]:
        devices = {j.reading.device.id: j.reading.device for j in joined}
        held: dict[Holder, tuple[set[str], set[str]]] = {}
        for alloc in allocations:
            device = devices.get(alloc.device_id)
            if device is None or device.type not in ("gpu", "network"):
                continue
            gpus, nics = held.setdefault(alloc.holder, (set(), set()))
            (gpus if device.type == "gpu" else nics).add(device.id)
        single_node = len(set(cpu_nodes.values())) == 1
        out: list[PairPlacement] = []
        for holder in sorted(held):
            gpus, nics = held[holder]
            for gpu in sorted(gpus):
                gpu_path = self.path(device_pci_address(devices[gpu], devices))
                for nic in sorted(nics):
                    nic_path = self.path(device_pci_address(devices[nic], devices))
                    if gpu_path is None or nic_path is None:
                        continue
                    found = level(gpu_path, nic_path, single_node=single_node)
                    if found is not None:
                        out.append(PairPlacement(holder, gpu, nic, int(found), found.name))
        return tuple(out)
