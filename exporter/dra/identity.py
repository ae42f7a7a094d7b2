"""DRA devices: which physical device a (driver, pool, device) of a ResourceSlice is, what
the node's slices still offer, and their taints. Pure.

PodResources names a claimed device by (driver, pool, device name) only (KEP-3695); the
name is the driver's own (`gpu-0` is NVIDIA's `gpu-<minor>`, AMD's `gpu-<card>-<render>`,
Intel's a PCI-derived UID). What ties it to hardware is the device's attributes in its
ResourceSlice, which each driver publishes (sources, docs/dra.md):

- NVIDIA k8s-dra-driver-gpu, `cmd/gpu-kubelet-plugin/deviceinfo.go`: `uuid` (GPU-...,
  MIG-... for MIG devices, with `parentUUID`), `pcieBusID` (a MIG device's is its parent's),
  `type` (`gpu`, `mig`, `vfio`), `profile`;
- AMD ROCm/k8s-gpu-dra-driver, `cmd/gpu-kubeletplugin/deviceinfo.go`: the standard
  `resource.kubernetes.io/pciBusID` (a partition carries its parent's), `pciAddr` (VFIO),
  `type`, `partitionProfile`, `numaNode`; no UUID;
- Intel intel-resource-drivers-for-kubernetes, `cmd/kubelet-gpu-plugin/node_state.go`:
  `resource.kubernetes.io/pciBusID` and the deprecated `pciAddress`;
- the standard attribute: k8s.io/dynamic-resource-allocation/deviceattribute
  `StandardDeviceAttributePCIBusID` (`resource.kubernetes.io/pciBusID`);
- NVIDIA's partitions made at prepare (KEP-4815, dra-driver-nvidia-gpu
  `cmd/gpu-kubelet-plugin/mig.go`, `partitions.go`): no UUID (the MIG device does not exist
  until a claim is prepared), `parentUUID`, `profile`, and the name
  `gpu-<minor>-mig-<profile>-<profile ID>-<placement start>` (`MigSpecTuple.ToCanonicalName`):
  the MIG device the NVML source reads with that GPU, profile ID and placement start (as
  the driver finds it, nvlib.go `FindMigDevBySpec`); where NVML denies the placement to
  the exporter, such a device stays unidentified (counted, named in the log);
- Google's DRANET, `pkg/inventory/db.go` and `pkg/apis/attributes.go`: `dra.net/pciAddress`
  and the interface's host-side name `dra.net/ifName`.

An identifying value that more than one device of the same driver publishes (a MIG
device's or an AMD partition's parent bus ID) identifies none of them: it is skipped, and a
device left with no identifying value is unidentified, never guessed.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.ids import (
    interface_key,
    mig_placement_key,
    normalize_device_id,
    pci_address,
)
from exporter.model import Allocation, AllocationKind, ClaimResource, Container, Device

if TYPE_CHECKING:  # the API client (exporter.kubeapi) loads only with --kubernetes.api
    from exporter.dra.slices import Slice, SliceDevice, Taint, TaintRule


DeviceKey = tuple[str, str, str]
"""(driver, pool, device name), as PodResources and the slices name a DRA device."""


ID_ATTRIBUTES: tuple[tuple[str, bool], ...] = (
    ("uuid", False),  # NVIDIA: GPU and MIG UUIDs, the hw.id of the NVML source
    ("resource.kubernetes.io/pciBusID", True),  # the standard one: AMD, Intel
    ("pcieBusID", True),  # NVIDIA
    ("pciAddress", True),  # Intel (deprecated for the standard one)
    ("pciAddr", True),  # AMD VFIO devices
    ("dra.net/pciAddress", True),  # DRANET's NICs
)
"""(attribute, is a PCI address), in the order they are tried; a short name is in the
driver's own domain."""

NUMA_SUFFIX = "/numaNode"
"""Where a device's NUMA node is published: any attribute named `<domain>/numaNode` with an int
value, the kubelet's own rule for DRA topology hints (pkg/kubelet/cm/dra, the hint provider's
`topologyNUMAAttributeSuffix`): the standard `resource.kubernetes.io/numaNode` (KEP-6072) and
AMD's `numaNode` (ROCm/k8s-gpu-dra-driver deviceinfo.go, in its driver's domain). NVIDIA's
VFIO devices say `numa` (k8s-dra-driver-gpu deviceinfo.go), taken too; its GPU and MIG
devices publish only `resource.kubernetes.io/pcieRoot`, a root complex, not a node."""

DYNAMIC_MIG = re.compile(r"^gpu-(?P<minor>\d+)-mig-(?P<profile>.+)-(?P<id>\d+)-(?P<start>\d+)$")
"""NVIDIA's name for a MIG placement (mig.go `canonicalMigNameRegex`)."""

BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
"""A device tainted so is not allocated to a claim that does not tolerate it."""


@dataclass(frozen=True, slots=True)
class Identity:
    devices: Mapping[DeviceKey, str]
    """Every slice device identified -> the hw.id of the source device it is."""
    unmatched: tuple[DeviceKey, ...] = ()
    """Slice devices whose identifying values no source device carries."""
    slices: tuple[SliceDevice, ...] = ()
    """Every device of the current slices."""


def identify(slices: Iterable[Slice], devices: Sequence[Device]) -> Identity:
    current = current_slices(list(slices))
    slice_devices = tuple(d for s in current for d in s.devices)
    index: dict[str, list[Device]] = defaultdict(list)
    for device in devices:
        for alias in {normalize_device_id(a)[0] for a in (device.id, *device.aliases)}:
            index[alias].append(device)
    keyed = {d.key: _id_values(d) for d in slice_devices}
    published = Counter((k[0], v) for k, values in keyed.items() for v in values)
    found: dict[DeviceKey, str] = {}
    unmatched = []
    for key, values in keyed.items():
        hw_id = None
        for value in values:
            if published[(key[0], value)] > 1:
                continue  # a parent's bus ID on its MIG devices or partitions: names none
            hw_id = _one(index.get(value, ()))
            if hw_id:
                break
        if hw_id:
            found[key] = hw_id
        else:
            unmatched.append(key)
    return Identity(found, tuple(sorted(unmatched)), slice_devices)


def _id_values(device: SliceDevice) -> list[str]:
    values = []
    for name, is_pci in ID_ATTRIBUTES:
        raw = device.attribute(name)
        if not raw:
            continue
        value = pci_address(raw) if is_pci else normalize_device_id(raw)[0]
        if value and value not in values:
            values.append(value)
    parent = device.attribute("parentUUID")
    placed = DYNAMIC_MIG.match(device.name) if parent else None
    if parent and placed:
        values.append(mig_placement_key(parent, int(placed["id"]), int(placed["start"])))
    interface = device.attribute("dra.net/ifName")
    if interface:
        values.append(interface_key(interface))
    return values


def _one(candidates: Sequence[Device]) -> str | None:
    """The device a value names; a PCI address names a GPU and its MIG devices alike (or a
    NIC and its RDMA port), and then means the one that is no other candidate's child."""
    ids = {d.id for d in candidates}
    if len(ids) == 1:
        return next(iter(ids))
    roots = {d.id for d in candidates if d.parent not in ids}
    return next(iter(roots)) if len(roots) == 1 else None


def numa_nodes(slice_devices: Iterable[SliceDevice]) -> dict[DeviceKey, int]:
    """(driver, pool, device) -> the NUMA node the device's slice publishes (a negative
    value, "no NUMA" in sysfs terms, is left out, as the kubelet does)."""
    out = {}
    for device in slice_devices:
        named = [v for k, v in device.attributes if k.endswith(NUMA_SUFFIX)]
        raw = named[0] if named else device.attribute("numa")
        if raw is not None and raw.lstrip("-").isdigit() and int(raw) >= 0:
            out[device.key] = int(raw)
    return out


def unidentified(allocations: Iterable[Allocation]) -> tuple[DeviceKey, ...]:
    """The DRA devices containers hold that no source device was joined to."""
    return tuple(
        sorted(
            {
                (a.driver, a.pool, a.raw_id)
                for a in allocations
                if a.kind is AllocationKind.DRA and not a.device_id
            }
        )
    )


def device_kind(device: SliceDevice) -> str:
    """What the device is, from its own `type` and profile attributes (`gpu`, `mig/1g.10gb`,
    an AMD partition's `partitionProfile`); `device` for a driver that publishes none."""
    kind = device.attribute("type") or "device"
    profile = device.attribute("profile") or device.attribute("partitionProfile")
    return f"{kind}/{profile}" if profile else kind


def device_taints(
    slice_devices: Iterable[SliceDevice], rules: Iterable[TaintRule]
) -> list[tuple[SliceDevice, Taint, str]]:
    """(device, taint, `slice` or the DeviceTaintRule's name), one per taint, sorted."""
    rules = list(rules)
    out = []
    for device in slice_devices:
        out += [(device, t, "slice") for t in device.taints]
        out += [(device, r.taint, r.name) for r in rules if r.selects(device)]
    return sorted(out, key=lambda x: (x[0].key, x[1], x[2]))


def current_slices(slices: list[Slice]) -> list[Slice]:
    """Only the newest generation of each (driver, pool): a driver republishing a pool
    leaves older slices behind for a moment, and the scheduler ignores them
    (k8s.io/dynamic-resource-allocation/structured: pools with an older generation)."""
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        key = (s.driver, s.pool)
        newest[key] = max(newest.get(key, s.generation), s.generation)
    return [s for s in slices if s.generation == newest[(s.driver, s.pool)]]


# --- the join's two questions about claimed devices ------------------------------


def dra_ids(dra: Mapping[DeviceKey, str] | None, res: ClaimResource) -> list[str]:
    """The join's answer for a claimed device the slices know ([hw.id], [""] for one no
    source has); [] when they do not know it (the join then looks it up by name)."""
    key = (res.driver_name, res.pool_name, res.device_name)
    return [dra[key]] if dra is not None and key in dra else []


def dra_placements(container: Container, numa: Mapping[DeviceKey, int]) -> set[tuple[str, int]]:
    """(driver, NUMA node) of each DRA device a container holds whose slice says its node."""
    return {
        (r.driver_name, numa[key])
        for claim in container.dynamic_resources
        for r in claim.claim_resources
        if (key := (r.driver_name, r.pool_name, r.device_name)) in numa
    }
