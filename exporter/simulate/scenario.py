"""Scenario files: one YAML document describes a whole simulated node.

The kubelet part (`kubelet`, `allocatable`, `pods`, `pod_sets`) is parsed here; other
top-level sections (`nvidia`, `sysfs`) belong to the simulated devices and are kept raw
in `Scenario.sections` for their own parsers. The format is documented in
docs/simulation.md; bundled scenarios live in exporter/simulate/scenarios/.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from exporter.model import (
    ClaimResource,
    Container,
    ContainerDevices,
    ContainerMemory,
    DynamicResource,
    Pod,
)

DEVICE_SECTIONS = ("nvidia", "sysfs", "procfs")
"""Top-level sections owned by the simulated node parts (`procfs`: the host's /proc and
the kubelet's /var/log/containers, exporter/simulate/procfs.py)."""


class ScenarioError(ValueError):
    """A scenario file that cannot be used; the message names the file and the key."""


@dataclass(frozen=True, slots=True)
class KubeletBehaviour:
    api: str = "v1"
    """`v1` (serves v1 and v1alpha1, like a real kubelet) or `v1alpha1` (a pre-1.20 kubelet)."""
    get: bool = True
    """KubeletPodResourcesGet gate; off answers like a kubelet without it."""
    allocatable: bool = True
    rate_limit: bool = True
    qps: float = 100.0
    burst: int = 10
    latency: float = 0.0
    """Seconds added before every answer (a slow kubelet)."""


@dataclass(frozen=True, slots=True)
class TimedPod:
    pod: Pod
    start: float = 0.0
    end: float | None = None
    pids: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """(container name, host PIDs of its processes): what the host's /proc shows."""

    def alive(self, t: float) -> bool:
        return self.start <= t and (self.end is None or t < self.end)


@dataclass(frozen=True, slots=True)
class Unhealthy:
    """Device IDs their plugin reports unhealthy from `start` until `end` (scenario seconds).

    The kubelet keeps them in the containers that hold them (List) and drops them from
    GetAllocatableResources, which answers `allDevices.Filter(healthyDevices)`
    (pkg/kubelet/cm/devicemanager/manager.go, GetAllocatableDevices); the plugin's
    ListAndWatch update replaces healthyDevices at once (genericDeviceUpdateCallback), so
    the change shows in the next answer. An ID also covers its `::N` replicas."""

    ids: tuple[str, ...]
    start: float = 0.0
    end: float | None = None

    def covers(self, device_id: str, t: float) -> bool:
        if t < self.start or (self.end is not None and t >= self.end):
            return False
        return any(device_id == i or device_id.startswith(f"{i}::") for i in self.ids)


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    node: str
    description: str = ""
    kubelet: KubeletBehaviour = field(default_factory=KubeletBehaviour)
    allocatable: tuple[ContainerDevices, ...] = ()
    pods: tuple[TimedPod, ...] = ()
    sections: Mapping[str, Any] = field(default_factory=dict)
    path: Path | None = None
    unhealthy: tuple[Unhealthy, ...] = ()

    def pods_at(self, t: float) -> tuple[Pod, ...]:
        return tuple(p.pod for p in self.pods if p.alive(t))

    def allocatable_at(self, t: float) -> tuple[ContainerDevices, ...]:
        """`allocatable` less the devices their plugin reports unhealthy at `t`."""
        out = []
        for devs in self.allocatable:
            ids = tuple(
                i for i in devs.device_ids if not any(u.covers(i, t) for u in self.unhealthy)
            )
            if ids:
                out.append(replace(devs, device_ids=ids))
        return tuple(out)

    @property
    def has_processes(self) -> bool:
        return "procfs" in self.sections or any(p.pids for p in self.pods)


def bundled_names() -> list[str]:
    folder = resources.files("exporter.simulate") / "scenarios"
    return sorted(
        p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml")
    )


def load_scenario(name_or_path: str | Path) -> Scenario:
    """A bundled scenario by name (`demo`, `dense`...) or a YAML file path."""
    path = Path(name_or_path)
    if not path.suffix:
        bundled = resources.files("exporter.simulate") / "scenarios" / f"{name_or_path}.yaml"
        if not bundled.is_file():
            raise ScenarioError(
                f"no bundled scenario {str(name_or_path)!r} (have: {', '.join(bundled_names())})"
            )
        return parse_scenario(bundled.read_text(), name=str(name_or_path), path=Path(str(bundled)))
    try:
        text = path.read_text()
    except OSError as exc:
        raise ScenarioError(f"cannot read scenario {path}: {exc.strerror}") from exc
    return parse_scenario(text, name=path.stem, path=path)


def parse_scenario(text: str, *, name: str = "scenario", path: Path | None = None) -> Scenario:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{name}: not valid YAML: {exc}") from exc
    where = _Where(name)
    doc = where.mapping(doc, "")
    where.keys(
        doc,
        "",
        {
            "node",
            "description",
            "kubelet",
            "allocatable",
            "unhealthy",
            "pods",
            "pod_sets",
            *DEVICE_SECTIONS,
        },
    )
    pods = [_timed_pod(where, p, f"pods[{i}]") for i, p in enumerate(where.seq(doc, "pods"))]
    for i, spec in enumerate(where.seq(doc, "pod_sets")):
        pods += _pod_set(where, spec, f"pod_sets[{i}]")
    return Scenario(
        name=name,
        node=str(doc.get("node", "sim-node")),
        description=str(doc.get("description", "")),
        kubelet=_kubelet(where, doc.get("kubelet") or {}),
        allocatable=tuple(
            _devices(where, d, f"allocatable[{i}]")
            for i, d in enumerate(where.seq(doc, "allocatable"))
        ),
        pods=tuple(pods),
        sections={k: doc[k] for k in DEVICE_SECTIONS if k in doc},
        path=path,
        unhealthy=tuple(
            _unhealthy(where, u, f"unhealthy[{i}]")
            for i, u in enumerate(where.seq(doc, "unhealthy"))
        ),
    )


class _Where:
    """Validation helpers that name the file and key in every error."""

    def __init__(self, name: str) -> None:
        self.name = name

    def fail(self, key: str, problem: str) -> ScenarioError:
        return ScenarioError(f"{self.name}: {key or 'top level'}: {problem}")

    def mapping(self, value: Any, key: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a mapping, got {type(value).__name__}")
        return value

    def seq(self, doc: Mapping[str, Any], key: str) -> list[Any]:
        value = doc.get(key) or []
        if not isinstance(value, list):
            raise self.fail(key, f"expected a list, got {type(value).__name__}")
        return value

    def keys(self, doc: Mapping[str, Any], key: str, allowed: set[str]) -> None:
        unknown = sorted(set(doc) - allowed)
        if unknown:
            raise self.fail(key, f"unknown keys {unknown} (allowed: {sorted(allowed)})")

    def number(self, doc: Mapping[str, Any], key: str, where: str, default: float) -> float:
        value = doc.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(f"{where}.{key}", f"expected a number, got {value!r}")
        return float(value)


def _kubelet(where: _Where, doc: Any) -> KubeletBehaviour:
    doc = where.mapping(doc, "kubelet")
    where.keys(
        doc, "kubelet", {"api", "get", "allocatable", "rate_limit", "qps", "burst", "latency"}
    )
    api = doc.get("api", "v1")
    if api not in ("v1", "v1alpha1"):
        raise where.fail("kubelet.api", f"must be v1 or v1alpha1, got {api!r}")
    return KubeletBehaviour(
        api=api,
        get=bool(doc.get("get", True)),
        allocatable=bool(doc.get("allocatable", True)),
        rate_limit=bool(doc.get("rate_limit", True)),
        qps=where.number(doc, "qps", "kubelet", 100.0),
        burst=int(where.number(doc, "burst", "kubelet", 10)),
        latency=where.number(doc, "latency", "kubelet", 0.0),
    )


def _numa(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(n) for n in (value if isinstance(value, list) else [value]))


def _devices(where: _Where, doc: Any, key: str) -> ContainerDevices:
    doc = where.mapping(doc, key)
    where.keys(doc, key, {"resource", "ids", "numa"})
    if "resource" not in doc:
        raise where.fail(key, "needs 'resource'")
    ids = doc.get("ids") or []
    if not isinstance(ids, list):
        raise where.fail(f"{key}.ids", "expected a list of device IDs")
    return ContainerDevices(
        str(doc["resource"]), tuple(str(i) for i in ids), _numa(doc.get("numa"))
    )


def _unhealthy(where: _Where, doc: Any, key: str) -> Unhealthy:
    doc = where.mapping(doc, key)
    where.keys(doc, key, {"ids", "start", "end"})
    ids = doc.get("ids")
    if not isinstance(ids, list) or not ids:
        raise where.fail(f"{key}.ids", "expected a non-empty list of device IDs")
    end = doc.get("end")
    return Unhealthy(
        tuple(str(i) for i in ids),
        start=where.number(doc, "start", key, 0.0),
        end=None if end is None else where.number(doc, "end", key, 0.0),
    )


def _pids(where: _Where, doc: Any, key: str) -> tuple[int, ...]:
    if isinstance(doc, str) or doc is None:
        return ()
    pids = where.seq(doc, "pids")
    for i, pid in enumerate(pids):
        if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid < 2**22:
            raise where.fail(f"{key}.pids[{i}]", f"expected a PID (1..4194303), got {pid!r}")
    return tuple(pids)


def _container(where: _Where, doc: Any, key: str) -> Container:
    if isinstance(doc, str):
        return Container(doc)
    doc = where.mapping(doc, key)
    where.keys(doc, key, {"name", "devices", "cpu_ids", "memory", "claims", "pids"})
    memory = []
    for i, m in enumerate(where.seq(doc, "memory")):
        m = where.mapping(m, f"{key}.memory[{i}]")
        memory.append(
            ContainerMemory(
                str(m.get("type", "memory")), int(m.get("size", 0)), _numa(m.get("numa"))
            )
        )
    claims = []
    for i, c in enumerate(where.seq(doc, "claims")):
        ckey = f"{key}.claims[{i}]"
        c = where.mapping(c, ckey)
        where.keys(c, ckey, {"name", "namespace", "resources"})
        resources_ = []
        for j, r in enumerate(where.seq(c, "resources")):
            r = where.mapping(r, f"{ckey}.resources[{j}]")
            where.keys(r, f"{ckey}.resources[{j}]", {"driver", "pool", "device", "cdi", "share_id"})
            resources_.append(
                ClaimResource(
                    str(r.get("driver", "")),
                    str(r.get("pool", "")),
                    str(r.get("device", "")),
                    tuple(str(x) for x in r.get("cdi") or []),
                    str(r.get("share_id", "")),
                )
            )
        claims.append(
            DynamicResource(str(c.get("name", "")), str(c.get("namespace", "")), tuple(resources_))
        )
    return Container(
        name=str(doc.get("name", "main")),
        devices=tuple(
            _devices(where, d, f"{key}.devices[{i}]")
            for i, d in enumerate(where.seq(doc, "devices"))
        ),
        cpu_ids=tuple(int(c) for c in doc.get("cpu_ids") or []),
        memory=tuple(memory),
        dynamic_resources=tuple(claims),
    )


def _timed_pod(where: _Where, doc: Any, key: str) -> TimedPod:
    doc = where.mapping(doc, key)
    where.keys(doc, key, {"name", "namespace", "start", "end", "containers"})
    if "name" not in doc:
        raise where.fail(key, "needs 'name'")
    specs = where.seq(doc, "containers")
    containers = tuple(_container(where, c, f"{key}.containers[{i}]") for i, c in enumerate(specs))
    pids = tuple(
        (c.name, found)
        for i, (c, spec) in enumerate(zip(containers, specs, strict=True))
        if (found := _pids(where, spec, f"{key}.containers[{i}]"))
    )
    end = doc.get("end")
    return TimedPod(
        Pod(str(doc["name"]), str(doc.get("namespace", "default")), containers),
        start=where.number(doc, "start", key, 0.0),
        end=None if end is None else where.number(doc, "end", key, 0.0),
        pids=pids,
    )


def _pod_set(where: _Where, doc: Any, key: str) -> list[TimedPod]:
    """`count` pods named `<prefix>-<i>` with the same containers (no devices unless given)."""
    doc = where.mapping(doc, key)
    where.keys(doc, key, {"prefix", "namespace", "count", "containers", "start", "end"})
    template = _timed_pod(
        where,
        {k: v for k, v in doc.items() if k in ("namespace", "containers", "start", "end")}
        | {"name": doc.get("prefix", "pod")},
        key,
    )
    if template.pids:
        raise where.fail(key, "a pod set's containers cannot have pids (each PID is one process)")
    count = int(where.number(doc, "count", key, 1))
    return [
        TimedPod(
            Pod(f"{template.pod.name}-{i}", template.pod.namespace, template.pod.containers),
            template.start,
            template.end,
        )  # a pod set's pods have no processes: PIDs are one process's, not a template's
        for i in range(count)
    ]
