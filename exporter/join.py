"""The join: PodResources assignments x device readings -> who holds what. Pure.

Device plugins hand the kubelet many ID forms for one device (see
../shared/reference/device-plugin-ids.md). `normalize_device_id` turns a raw ID into a
lookup key plus a replica; sources declare the keys that name each of their devices
(`Device.aliases`), so the join itself knows no vendor.
"""

from __future__ import annotations

import fnmatch
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from exporter.model import (
    Allocation,
    AllocationKind,
    ContainerDevices,
    Device,
    Holder,
    JoinedDevice,
    PodResourcesState,
    SourceResult,
)

DEFAULT_RESOURCE_PATTERNS = (
    "nvidia.com/*",
    "*.shared",
    "amd.com/*",
    "gpu.intel.com/*",
    "rdma/*",
    "intel.com/*",
    "mellanox.com/*",
    "openshift.io/*",
)
"""nvidia.com/gpu and nvidia.com/mig-* (and renames), AMD, Intel GPUs, the RDMA shared-device
plugin and the SR-IOV network device plugin's default prefixes."""

_REPLICA = re.compile(r"^(?P<id>.+?)::(?P<replica>\d+)$")
_GKE_VGPU = re.compile(r"^(?P<id>nvidia\d+(?:/gi\d+)?)/vgpu(?P<replica>\d+)$")
_INTEL_CARD = re.compile(r"^(?P<id>card\d+)-(?P<replica>\d+)$")
_PCI = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})\.(?P<fn>[0-7])$"
)


def pci_address(raw: str) -> str | None:
    """Canonical PCI address `dddd:bb:dd.f`, or None. Accepts NVML's 8-digit domain
    (`00000000:07:00.0`) and the short `07:00.0`."""
    m = _PCI.match(raw.strip())
    if not m:
        return None
    domain = int(m["domain"] or "0", 16)
    return f"{domain:04x}:{m['bus'].lower()}:{m['dev'].lower()}.{m['fn']}"


def normalize_device_id(raw: str) -> tuple[str, str]:
    """A raw device-plugin ID -> (lookup key, replica or "").

    `GPU-x::3` -> (`GPU-x`, `3`); GKE `nvidia0/vgpu2` -> (`nvidia0`, `2`);
    Intel `card1-4` -> (`card1`, `4`); `0000:19:00.0` in any case/domain width ->
    `0000:19:00.0`. Everything else is its own key.
    """
    raw = raw.strip()
    for pattern in (_REPLICA, _GKE_VGPU, _INTEL_CARD):
        m = pattern.match(raw)
        if m:
            key, replica = m["id"], m["replica"]
            return normalize_device_id(key)[0], replica
    return pci_address(raw) or raw, ""


@dataclass(frozen=True, slots=True)
class JoinResult:
    devices: tuple[JoinedDevice, ...]
    allocations: tuple[Allocation, ...]


class ResourceMatcher:
    def __init__(self, patterns: Iterable[str] = DEFAULT_RESOURCE_PATTERNS) -> None:
        self.patterns = tuple(patterns)

    def __call__(self, resource_name: str) -> bool:
        return any(fnmatch.fnmatchcase(resource_name, p) for p in self.patterns)


def join(
    results: Sequence[SourceResult],
    state: PodResourcesState | None,
    matcher: ResourceMatcher | None = None,
) -> JoinResult:
    matcher = matcher or ResourceMatcher()
    readings = [r for result in results for r in result.readings]
    devices = [r.device for r in readings]
    index, pools = _index(devices)
    state = state or PodResourcesState()

    allocations: list[Allocation] = []
    for pod in state.pods:
        for container in pod.containers:
            holder = Holder(pod.namespace, pod.name, container.name)
            for devs in container.devices:
                if matcher(devs.resource_name):
                    allocations += _device_plugin(holder, devs, index, pools)
            for claim in container.dynamic_resources:
                for res in claim.claim_resources:
                    allocations.append(
                        Allocation(
                            holder=holder,
                            resource_name=res.driver_name,
                            raw_id=res.device_name,
                            device_id=_lookup(index, res.device_name, res.driver_name),
                            shared=bool(res.share_id),
                            replica=res.share_id,
                            kind=AllocationKind.DRA,
                            claim=f"{claim.claim_namespace}/{claim.claim_name}",
                            driver=res.driver_name,
                            pool=res.pool_name,
                        )
                    )

    holders: dict[str, set[Holder]] = defaultdict(set)
    for a in allocations:
        if a.device_id:
            holders[a.device_id].add(a.holder)
    allocations = [
        _replace_shared(a) if a.device_id and len(holders[a.device_id]) > 1 else a
        for a in allocations
    ]
    allocatable = _allocatable_ids(state.allocatable, index, pools, matcher)

    joined = []
    for reading in readings:
        who = holders.get(reading.device.id, set())
        joined.append(
            JoinedDevice(
                reading=reading,
                holder=next(iter(who)) if len(who) == 1 else None,
                holders=len(who),
                allocatable=reading.device.id in allocatable,
            )
        )
    allocations.sort(key=lambda a: (a.holder, a.kind.value, a.resource_name, a.raw_id, a.device_id))
    return JoinResult(tuple(joined), tuple(_dedupe(allocations)))


def _index(devices: Sequence[Device]) -> tuple[dict[str, str], dict[str, list[str]]]:
    index: dict[str, str] = {}
    pools: dict[str, list[str]] = defaultdict(list)
    for device in devices:
        for alias in (device.id, *sorted(device.aliases)):
            index.setdefault(normalize_device_id(alias)[0], device.id)
        for pool in sorted(device.pools):
            pools[pool].append(device.id)
    return index, pools


def _lookup(index: dict[str, str], raw: str, driver: str = "") -> str:
    key = normalize_device_id(raw)[0]
    return index.get(key) or (index.get(f"{driver}/{key}", "") if driver else "")


def _device_plugin(
    holder: Holder, devs: ContainerDevices, index: dict[str, str], pools: dict[str, list[str]]
) -> list[Allocation]:
    out = []
    renamed_shared = devs.resource_name.endswith(".shared")
    for raw in devs.device_ids:
        key, replica = normalize_device_id(raw)
        found = index.get(key)
        targets = [found] if found else pools.get(devs.resource_name, [""])
        pooled = not found and devs.resource_name in pools
        for device_id in targets:
            out.append(
                Allocation(
                    holder=holder,
                    resource_name=devs.resource_name,
                    raw_id=raw,
                    device_id=device_id,
                    replica=replica,
                    shared=bool(replica) or renamed_shared or pooled,
                    numa_nodes=devs.numa_nodes,
                )
            )
    return out


def _replace_shared(a: Allocation) -> Allocation:
    return replace(a, shared=True)


def _allocatable_ids(
    allocatable: Sequence[ContainerDevices],
    index: dict[str, str],
    pools: dict[str, list[str]],
    matcher: ResourceMatcher,
) -> set[str]:
    ids: set[str] = set()
    for devs in allocatable:
        if not matcher(devs.resource_name):
            continue
        for raw in devs.device_ids:
            found = index.get(normalize_device_id(raw)[0])
            ids.update([found] if found else pools.get(devs.resource_name, []))
    return ids


def _dedupe(allocations: list[Allocation]) -> list[Allocation]:
    seen: set[Allocation] = set()
    out = []
    for a in allocations:
        if a not in seen:
            seen.add(a)
            out.append(a)
    return out
