"""ResourceSlices and DeviceTaintRules (`resource.k8s.io`), parsed into what the DRA join needs.

Shapes: the `resource.k8s.io/v1` API reference (Kubernetes 1.34+,
https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/resource-slice-v1/ and
`k8s.io/api/resource/v1/types.go`): `spec.driver`, `spec.nodeName`, `spec.pool{name,
generation, resourceSliceCount}`, `spec.sharedCounters[{name, counters{NAME{value}}}]`,
`spec.devices[{name, attributes{NAME{int|bool|string|version}}, capacity{NAME{value}},
consumesCounters[{counterSet, counters}], allowMultipleAllocations, taints[{key, value,
effect, timeAdded}]}]`. An attribute or capacity name without a domain is in the driver's
domain (types.go, `QualifiedName`): it is stored here as `DRIVER/NAME`.

DeviceTaintRule is `resource.k8s.io/v1beta2` in 1.36 (not served unless the API server's
`--runtime-config` asks, control-plane.md DRA item 8): `spec.deviceSelector{driver, pool,
device}` and `spec.taint{key, value, effect}`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True, order=True)
class Taint:
    key: str
    value: str
    effect: str
    """`NoSchedule`, `NoExecute` or `None` (v1 types.go `DeviceTaintEffect`)."""


@dataclass(frozen=True, slots=True)
class SliceDevice:
    driver: str
    pool: str
    name: str
    attributes: tuple[tuple[str, str], ...] = ()
    """(qualified name, value as text), sorted."""
    capacity: tuple[tuple[str, float], ...] = ()
    consumes: tuple[tuple[str, str, float], ...] = ()
    """(counter set, counter, amount) this device takes from its pool's shared counters."""
    multiple: bool = False
    """`allowMultipleAllocations`: several claims may share it (consumable capacity)."""
    taints: tuple[Taint, ...] = ()

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.name)

    def attribute(self, name: str) -> str | None:
        """A driver-domain attribute by its short name, or a qualified one."""
        qualified = name if "/" in name else f"{self.driver}/{name}"
        for k, v in self.attributes:
            if k == qualified:
                return v
        return None


@dataclass(frozen=True, slots=True)
class Slice:
    name: str
    driver: str
    pool: str
    generation: int
    devices: tuple[SliceDevice, ...] = ()
    counters: tuple[tuple[str, str, float], ...] = ()
    """(counter set, counter, value) the slice offers (`sharedCounters`)."""


@dataclass(frozen=True, slots=True)
class TaintRule:
    name: str
    driver: str
    pool: str
    device: str
    taint: Taint

    def selects(self, device: SliceDevice) -> bool:
        """An empty selector field matches every device (DeviceTaintSelector, v1beta2)."""
        return (
            (not self.driver or self.driver == device.driver)
            and (not self.pool or self.pool == device.pool)
            and (not self.device or self.device == device.name)
        )


_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?\d+|[KMGTPE]i|[numkMGTPE]|)$")
_SUFFIX = {
    "": 1.0, "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
    "P": 1e15, "E": 1e18, "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40,
    "Pi": 2.0**50, "Ei": 2.0**60,
}  # fmt: skip


def quantity(raw: object) -> float:
    """A `resource.Quantity` (`80Gi`, `1`, `500m`, `1e3`) as a float; ValueError if not one."""
    text = str(raw).strip()
    m = _QUANTITY.match(text)
    if not m:
        raise ValueError(f"not a quantity: {text!r}")
    number, suffix = float(m[1]), m[2]
    if suffix[:1] in ("e", "E"):
        return number * 10.0 ** int(suffix[1:])
    return number * _SUFFIX[suffix]


def _qualified(driver: str, name: str) -> str:
    return name if "/" in name else f"{driver}/{name}"


def _attribute_value(value: dict[str, Any]) -> str:
    for kind in ("string", "version", "int"):
        if kind in value:
            return str(value[kind])
    if "bool" in value:
        return "true" if value["bool"] else "false"
    return ""


def _taints(raw: Any) -> tuple[Taint, ...]:
    return tuple(
        sorted(
            Taint(str(t.get("key", "")), str(t.get("value", "") or ""), str(t.get("effect", "")))
            for t in raw or ()
        )
    )


def _counters(raw: Any) -> tuple[tuple[str, float], ...]:
    return tuple(sorted((str(k), quantity((v or {}).get("value"))) for k, v in (raw or {}).items()))


def parse_slice(obj: dict[str, Any]) -> Slice:
    """One ResourceSlice object (JSON) -> Slice. KeyError/ValueError on a broken object."""
    spec = obj["spec"]
    driver = str(spec["driver"])
    pool = spec.get("pool") or {}
    pool_name = str(pool.get("name", ""))
    devices = []
    for dev in spec.get("devices") or ():
        attrs = sorted(
            (_qualified(driver, str(k)), _attribute_value(v or {}))
            for k, v in (dev.get("attributes") or {}).items()
        )
        capacity = tuple(
            (_qualified(driver, name), value) for name, value in _counters(dev.get("capacity"))
        )
        consumes = tuple(
            (str(c.get("counterSet", "")), name, value)
            for c in dev.get("consumesCounters") or ()
            for name, value in _counters(c.get("counters"))
        )
        devices.append(
            SliceDevice(
                driver=driver,
                pool=pool_name,
                name=str(dev["name"]),
                attributes=tuple(attrs),
                capacity=capacity,
                consumes=consumes,
                multiple=bool(dev.get("allowMultipleAllocations")),
                taints=_taints(dev.get("taints")),
            )
        )
    counters = tuple(
        (str(cs.get("name", "")), name, value)
        for cs in spec.get("sharedCounters") or ()
        for name, value in _counters(cs.get("counters"))
    )
    return Slice(
        name=str(obj["metadata"]["name"]),
        driver=driver,
        pool=pool_name,
        generation=int(pool.get("generation") or 0),
        devices=tuple(devices),
        counters=counters,
    )


def parse_taint_rule(obj: dict[str, Any]) -> TaintRule:
    spec = obj["spec"]
    selector = spec.get("deviceSelector") or {}
    taint = spec.get("taint") or {}
    return TaintRule(
        name=str(obj["metadata"]["name"]),
        driver=str(selector.get("driver") or ""),
        pool=str(selector.get("pool") or ""),
        device=str(selector.get("device") or ""),
        taint=Taint(
            str(taint.get("key", "")), str(taint.get("value") or ""), str(taint.get("effect", ""))
        ),
    )
