"""ResourceClaims (`resource.k8s.io/v1`), parsed into what the DRA view needs. Pure.

What PodResources does not carry lives only in the claim (control-plane.md, facts 12-15,
observed on the real 1.36 cluster): the capacity each share consumed, whether a result is
an admin-access one, which request (and so which container of an extended-resource claim)
each device serves, and the device status a driver writes (KEP-4817).

Shapes: `k8s.io/api/resource/v1/types.go` and the v1 API reference
(https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/resource-claim-v1/):
`status.allocation.devices.results[] {request, driver, pool, device, adminAccess, shareID,
consumedCapacity{NAME: quantity}}` and `status.devices[] {driver, pool, device, shareID,
conditions[] {type, status, reason}, networkData {interfaceName, ips[], hardwareAddress}}`.
As the real cluster wrote them: `{"consumedCapacity":{"memory":"20Gi"},"device":"gpu-0",
...,"shareID":"<uuid>"}`; an admin claim's result has `"adminAccess": true`. A capacity name
without a domain is in the driver's (types.go `QualifiedName`), stored as `DRIVER/NAME`
as the slices' are (slices.py).

Bounded: the API server caps what a claim holds (`AllocationResultsMaxSize`, 32 results;
conditions at 8, control-plane.md fact 15); the bounds here are above the API's, and
anything past them is dropped, so no answer grows what the exporter keeps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exporter.dra.slices import quantity

ClaimKey = tuple[str, str]
"""(namespace, name) as PodResources names a ResourceClaim."""

MAX_RESULTS = 128
MAX_DEVICE_STATUSES = 128
MAX_CONDITIONS = 8
MAX_IPS = 16
MAX_TEXT = 256
"""Longest name or value kept (a DNS subdomain is 253); longer ones are cut."""

DeviceKey = tuple[str, str, str]


def _text(value: object) -> str:
    return str(value or "")[:MAX_TEXT]


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """One device of a claim's allocation."""

    request: str
    driver: str
    pool: str
    device: str
    share_id: str = ""
    admin_access: bool = False
    consumed: tuple[tuple[str, float], ...] = ()
    """(capacity, amount in its base unit: bytes for memory) the share took, as the scheduler
    recorded it (rounded up to the device's request policy)."""

    @property
    def key(self) -> DeviceKey:
        return (self.driver, self.pool, self.device)


@dataclass(frozen=True, slots=True, order=True)
class Condition:
    type: str
    status: str
    """`True`, `False` or `Unknown` (metav1.Condition)."""
    reason: str = ""


@dataclass(frozen=True, slots=True)
class DeviceStatus:
    """What the driver wrote of one allocated device (`status.devices[]`, KEP-4817)."""

    driver: str
    pool: str
    device: str
    share_id: str = ""
    conditions: tuple[Condition, ...] = ()
    interface: str = ""
    """`networkData.interfaceName`: the name inside the pod's network namespace (DRANET
    moves the device there: dranet pkg/driver/nri_hooks.go)."""
    mac: str = ""
    ips: tuple[str, ...] = ()

    @property
    def key(self) -> DeviceKey:
        return (self.driver, self.pool, self.device)


@dataclass(frozen=True, slots=True)
class Claim:
    namespace: str
    name: str
    uid: str
    allocated: bool
    results: tuple[ClaimResult, ...] = ()
    devices: tuple[DeviceStatus, ...] = ()

    def result(self, driver: str, pool: str, device: str, share_id: str = "") -> ClaimResult | None:
        """The result for a device PodResources lists (with its share ID on a shared one)."""
        for r in self.results:
            if r.key == (driver, pool, device) and (not share_id or r.share_id == share_id):
                return r
        return None


def _qualified(driver: str, name: str) -> str:
    return name if "/" in name else f"{driver}/{name}"


def _result(raw: dict[str, Any]) -> ClaimResult:
    driver = _text(raw["driver"])
    consumed = tuple(
        sorted(
            (_qualified(driver, _text(name)), quantity(value))
            for name, value in (raw.get("consumedCapacity") or {}).items()
        )
    )
    return ClaimResult(
        request=_text(raw.get("request")),
        driver=driver,
        pool=_text(raw["pool"]),
        device=_text(raw["device"]),
        share_id=_text(raw.get("shareID")),
        admin_access=raw.get("adminAccess") is True,
        consumed=consumed,
    )


def _device_status(raw: dict[str, Any]) -> DeviceStatus:
    conditions = tuple(
        sorted(
            Condition(_text(c.get("type")), _text(c.get("status")), _text(c.get("reason")))
            for c in list(raw.get("conditions") or ())[:MAX_CONDITIONS]
        )
    )
    network = raw.get("networkData") or {}
    return DeviceStatus(
        driver=_text(raw["driver"]),
        pool=_text(raw["pool"]),
        device=_text(raw["device"]),
        share_id=_text(raw.get("shareID")),
        conditions=conditions,
        interface=_text(network.get("interfaceName")),
        mac=_text(network.get("hardwareAddress")),
        ips=tuple(_text(ip) for ip in list(network.get("ips") or ())[:MAX_IPS]),
    )


def parse_claim(obj: dict[str, Any]) -> Claim:
    """One ResourceClaim (JSON) -> Claim. KeyError, ValueError, TypeError or AttributeError
    on a broken object (the reader says so once and keeps the last good one)."""
    meta = obj["metadata"]
    status = obj.get("status") or {}
    allocation = status.get("allocation")
    results = (((allocation or {}).get("devices") or {}).get("results")) or ()
    return Claim(
        namespace=_text(meta.get("namespace")),
        name=_text(meta["name"]),
        uid=_text(meta.get("uid")),
        allocated=allocation is not None,
        results=tuple(_result(r) for r in list(results)[:MAX_RESULTS]),
        devices=tuple(
            _device_status(d) for d in list(status.get("devices") or ())[:MAX_DEVICE_STATUSES]
        ),
    )
