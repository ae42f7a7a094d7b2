"""Scenario files: one YAML document describes a whole simulated node.

The kubelet part (`kubelet`, `allocatable`, `pods`, `pod_sets`) is parsed here; other
top-level sections (`nvidia`, `sysfs`) belong to the simulated devices and are kept raw
in `Scenario.sections` for their own parsers. The format is documented in
docs/simulation.md; bundled scenarios live in simulator/scenarios/.
"""

from __future__ import annotations

from collections.abc import Mapping
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
from simulator.scenario_model import (
    KubeletBehaviour,
    PluginDown,
    Scenario,
    TimedPod,
    Unhealthy,
)

DEVICE_SECTIONS = ("nvidia", "sysfs", "procfs", "dra")
"""Top-level sections owned by the simulated node parts (`procfs`: the host's /proc and
the kubelet's /var/log/containers, simulator/procfs.py)."""


class ScenarioError(ValueError):
    """A scenario file that cannot be used; the message names the file and the key."""


def bundled_names() -> list[str]:
    folder = resources.files("simulator") / "scenarios"
    return sorted(
        p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml")
    )


def load_scenario(name_or_path: str | Path) -> Scenario:
    """A bundled scenario by name (`demo`, `dense`...) or a YAML file path."""
    path = Path(name_or_path)
    if not path.suffix:
        bundled = resources.files("simulator") / "scenarios" / f"{name_or_path}.yaml"
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
            "plugin_down",
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
        plugin_down=tuple(
            _plugin_down(where, u, f"plugin_down[{i}]")
            for i, u in enumerate(where.seq(doc, "plugin_down"))
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
        doc,
        "kubelet",
        {
            "api",
            "get",
            "allocatable",
            "rate_limit",
            "qps",
            "burst",
            "latency",
            "shuffle",
            "restart_list_empty",
            "restart_allocatable_empty",
        },
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
        shuffle=bool(doc.get("shuffle", True)),
        restart_list_empty=where.number(doc, "restart_list_empty", "kubelet", 0.97),
        restart_allocatable_empty=where.number(doc, "restart_allocatable_empty", "kubelet", 0.5),
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


def _plugin_down(where: _Where, doc: Any, key: str) -> PluginDown:
    doc = where.mapping(doc, key)
    where.keys(doc, key, {"resources", "start", "end"})
    names = doc.get("resources")
    if not isinstance(names, list) or not names:
        raise where.fail(f"{key}.resources", "expected a non-empty list of resource names")
    end = doc.get("end")
    return PluginDown(
        tuple(str(n) for n in names),
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
    where.keys(
        doc, key, {"name", "devices", "cpu_ids", "memory", "claims", "pids", "init", "sidecar"}
    )
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


def _init_kind(where: _Where, spec: Any, key: str) -> str:
    """ "init" (an ordinary init container), "sidecar" (`restartPolicy: Always`) or ""."""
    if not isinstance(spec, dict):
        return ""
    init, sidecar = bool(spec.get("init", False)), bool(spec.get("sidecar", False))
    if init and sidecar:
        raise where.fail(key, "a container is an ordinary init container or a sidecar, not both")
    return "init" if init else "sidecar" if sidecar else ""


def _timed_pod(where: _Where, doc: Any, key: str) -> TimedPod:
    doc = where.mapping(doc, key)
    where.keys(doc, key, {"name", "namespace", "start", "end", "failed", "containers"})
    if "name" not in doc:
        raise where.fail(key, "needs 'name'")
    kinds = [
        (_init_kind(where, spec, f"{key}.containers[{i}]"), i, spec)
        for i, spec in enumerate(where.seq(doc, "containers"))
    ]
    # Ordinary init containers never appear in List (their device goes to the app
    # container); sidecar init containers are listed before the app containers
    # (real kubelet K8).
    listed = [k for k in kinds if k[0] == "sidecar"] + [k for k in kinds if k[0] == ""]
    specs = [spec for _, _, spec in listed]
    containers = tuple(_container(where, spec, f"{key}.containers[{i}]") for _, i, spec in listed)
    pids = tuple(
        (c.name, found)
        for i, (c, spec) in enumerate(zip(containers, specs, strict=True))
        if (found := _pids(where, spec, f"{key}.containers[{i}]"))
    )
    end, failed = doc.get("end"), doc.get("failed")
    return TimedPod(
        Pod(str(doc["name"]), str(doc.get("namespace", "default")), containers),
        start=where.number(doc, "start", key, 0.0),
        end=None if end is None else where.number(doc, "end", key, 0.0),
        pids=pids,
        sidecars=sum(1 for k in kinds if k[0] == "sidecar"),
        failed=None if failed is None else where.number(doc, "failed", key, 0.0),
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
            sidecars=template.sidecars,
        )  # a pod set's pods have no processes: PIDs are one process's, not a template's
        for i in range(count)
    ]


__all__ = [
    "KubeletBehaviour",
    "PluginDown",
    "Scenario",
    "ScenarioError",
    "TimedPod",
    "Unhealthy",
    "bundled_names",
    "load_scenario",
    "parse_scenario",
]
