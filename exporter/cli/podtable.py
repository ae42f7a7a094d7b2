"""`podresources` as a table, and its filters: what a person reads, kubectl-style.

A busy node's List answer is mostly pods that hold no device (188 of 200 on `dense`); the
filters keep the rows that matter, the table puts one container's devices of one resource
on one line. The JSON view (`-o json`) is the same answer, filtered the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase

from exporter.model import Container, ContainerDevices, Pod

NONE = "<none>"


@dataclass(frozen=True, slots=True)
class Filter:
    """Which pods and devices to show; empty fields filter nothing."""

    devices_only: bool = False
    """Only containers holding a device (device plugin or DRA)."""
    resources: tuple[str, ...] = ()
    """Resource-name globs (`nvidia.com/*`); DRA devices match as `DRIVER/POOL`."""
    namespace: str = ""

    def pods(self, pods: Iterable[Pod]) -> list[Pod]:
        shown = []
        for pod in pods:
            if self.namespace and pod.namespace != self.namespace:
                continue
            containers = tuple(self._container(c) for c in pod.containers)
            kept = tuple(c for c in containers if not self._hides(c))
            if kept:
                shown.append(replace(pod, containers=kept))
        return shown

    def allocatable(self, devices: Iterable[ContainerDevices]) -> list[ContainerDevices]:
        return [d for d in devices if self._wanted(d.resource_name)]

    def _container(self, container: Container) -> Container:
        if not self.resources:
            return container
        return replace(
            container,
            devices=tuple(d for d in container.devices if self._wanted(d.resource_name)),
            dynamic_resources=tuple(
                replace(r, claim_resources=kept)
                for r in container.dynamic_resources
                if (
                    kept := tuple(
                        c
                        for c in r.claim_resources
                        if self._wanted(f"{c.driver_name}/{c.pool_name}")
                    )
                )
            ),
        )

    def _hides(self, container: Container) -> bool:
        holds = bool(container.devices or container.dynamic_resources)
        return not holds and (self.devices_only or bool(self.resources))

    def _wanted(self, resource: str) -> bool:
        return not self.resources or any(fnmatchcase(resource, g) for g in self.resources)


def rows(pods: Iterable[Pod]) -> list[tuple[str, ...]]:
    """NAMESPACE, POD, CONTAINER, RESOURCE, DEVICES, NUMA: one row per container and
    resource (a container with none: one row of `<none>`)."""
    out: list[tuple[str, ...]] = []
    for pod in pods:
        for c in pod.containers:
            who = (pod.namespace, pod.name, c.name)
            held = [
                (d.resource_name, ",".join(d.device_ids), _numa(d.numa_nodes)) for d in c.devices
            ]
            held += [
                (
                    f"{cr.driver_name}/{cr.pool_name}",
                    cr.device_name,
                    f"claim {r.claim_namespace}/{r.claim_name}",
                )
                for r in c.dynamic_resources
                for cr in r.claim_resources
            ]
            out += [(*who, *h) for h in _merged(held)] or [(*who, NONE, NONE, NONE)]
    return out


def _merged(held: Sequence[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """The parser keeps one entry per (resource, NUMA nodes): one row per resource here."""
    by_resource: dict[str, tuple[list[str], list[str]]] = {}
    for resource, ids, numa in held:
        ids_list, numa_list = by_resource.setdefault(resource, ([], []))
        ids_list.append(ids)
        if numa not in numa_list:
            numa_list.append(numa)
    return [(r, ",".join(ids), ",".join(n for n in numa if n != NONE) or NONE)
            for r, (ids, numa) in by_resource.items()]  # fmt: skip


def _numa(nodes: Sequence[int]) -> str:
    return ",".join(str(n) for n in nodes) if nodes else NONE


def allocatable_rows(devices: Iterable[ContainerDevices]) -> list[tuple[str, ...]]:
    """RESOURCE, COUNT, DEVICES of what the node can allocate."""
    by_resource: dict[str, list[str]] = {}
    for d in devices:
        by_resource.setdefault(d.resource_name, []).extend(d.device_ids)
    return [(r, str(len(ids)), _some(sorted(ids))) for r, ids in sorted(by_resource.items())]


def _some(ids: Sequence[str], shown: int = 3) -> str:
    """A node lists dozens of MIG slices: the first few, and how many more (`-o json` has all)."""
    more = f",... (+{len(ids) - shown})" if len(ids) > shown else ""
    return ",".join(ids[:shown]) + more


def render(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, three spaces apart, as kubectl prints."""
    lines = [header, *body]
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    return "\n".join(
        "   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in lines
    )


POD_HEADER = ("NAMESPACE", "POD", "CONTAINER", "RESOURCE", "DEVICES", "NUMA")
ALLOCATABLE_HEADER = ("RESOURCE", "COUNT", "DEVICES")


def table(pods: Sequence[Pod], allocatable: Sequence[ContainerDevices] | None) -> str:
    """The pods' table, then (for List) the node's allocatable devices."""
    parts = [render(POD_HEADER, rows(pods)) if pods else "No pods match."]
    if allocatable is not None:
        parts.append(
            render(ALLOCATABLE_HEADER, allocatable_rows(allocatable))
            if allocatable
            else "No allocatable devices listed."
        )
    return "\n\n".join(parts)
