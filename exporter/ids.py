"""Device IDs and resource names: the forms device plugins use, and which resources we attribute.

Device plugins hand the kubelet many ID forms for one device (docs/device-ids.md lists
them with the plugins' source files). `normalize_device_id` turns a raw ID into a lookup
key plus a replica, so sources can declare the keys that name each of their devices
(`Device.aliases`) and the join needs no vendor knowledge. Sources, the join and the flags
read these helpers from here; none of them needs the join itself.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable

from exporter.settings.table import DEFAULT_RESOURCE_PATTERNS

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


def mig_placement_key(parent_uuid: str, profile_id: int, start: int) -> str:
    """The key of a MIG device by what NVIDIA's DRA driver names a partition with (its GPU,
    GPU instance profile ID and placement start: dra-driver-nvidia-gpu
    cmd/gpu-kubelet-plugin/mig.go `MigSpecTuple`), the NVML source's alias of a MIG device
    whose GPU instance it could read."""
    return f"{parent_uuid}/mig-placement/{profile_id}/{start}"


def interface_key(name: str) -> str:
    """The key of a network device by its interface name in the host's namespace (DRANET
    publishes it as `dra.net/ifName`)."""
    return f"netdev/{name}"


class ResourceMatcher:
    def __init__(self, patterns: Iterable[str] = DEFAULT_RESOURCE_PATTERNS) -> None:
        self.patterns = tuple(patterns)

    def __call__(self, resource_name: str) -> bool:
        return any(fnmatch.fnmatchcase(resource_name, p) for p in self.patterns)
