"""What a scenario describes, as frozen values: the kubelet's behaviour, the pods over time,
device health and plugin outages. Parsed from YAML by simulator/scenario.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from exporter.model import ContainerDevices, Pod


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
    shuffle: bool = True
    """Pods, containers and devices in a different order on each call, as the kubelet's map
    iteration gives them (real kubelet K2; real kubelet C10)."""
    restart_list_empty: float = 0.97
    """Seconds after a restart in which List answers successfully with no pods: 1.36 measured
    0.96-0.97 s (real kubelet C11), 1.32 about 0.1-0.25 s (real kubelet K4);
    the newer kubelet's is the default."""
    restart_allocatable_empty: float = 0.5
    """Seconds after a restart in which GetAllocatableResources answers with no devices (its
    plugins have not re-registered): 1.36 0.14-0.5 s (real kubelet C11), 1.32 about
    0.3 s (real kubelet K4); the upper end of the newer kubelet's is the default."""


@dataclass(frozen=True, slots=True)
class TimedPod:
    pod: Pod
    start: float = 0.0
    end: float | None = None
    pids: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """(container name, host PIDs of its processes): what the host's /proc shows."""
    sidecars: int = 0
    """How many of `pod.containers`, first, are sidecar init containers (`restartPolicy:
    Always`): the kubelet lists them before the app containers (real kubelet K8)."""
    failed: float | None = None
    """Scenario second the pod fails: it stays in List with its containers and no devices
    (real kubelet K6: List reports all pods, not only active ones)."""

    def alive(self, t: float) -> bool:
        return self.start <= t and (self.end is None or t < self.end)

    def listed(self, t: float) -> Pod:
        """The pod as List shows it at `t`."""
        if self.failed is None or t < self.failed:
            return self.pod
        return replace(
            self.pod, containers=tuple(replace(c, devices=()) for c in self.pod.containers)
        )


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
class PluginDown:
    """The device plugin of `resources` stopped from `start` until `end`: all its devices
    leave GetAllocatableResources at once and List is unchanged; they return when it
    registers again (real kubelet K10). Not the same as a device turning unhealthy,
    which leaves one device (K9)."""

    resources: tuple[str, ...]
    start: float = 0.0
    end: float | None = None

    def covers(self, resource: str, t: float) -> bool:
        if t < self.start or (self.end is not None and t >= self.end):
            return False
        return resource in self.resources


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
    plugin_down: tuple[PluginDown, ...] = ()

    def pods_at(self, t: float) -> tuple[Pod, ...]:
        return tuple(p.listed(t) for p in self.pods if p.alive(t))

    def listed_at(self, t: float) -> tuple[TimedPod, ...]:
        """The pods List answers at `t` (failed ones without devices), with their timing."""
        return tuple(replace(p, pod=p.listed(t)) for p in self.pods if p.alive(t))

    def allocatable_at(self, t: float) -> tuple[ContainerDevices, ...]:
        """`allocatable` less the devices their plugin reports unhealthy at `t`, and less
        every device of a resource whose plugin is down."""
        out = []
        for devs in self.allocatable:
            if any(p.covers(devs.resource_name, t) for p in self.plugin_down):
                continue
            ids = tuple(
                i for i in devs.device_ids if not any(u.covers(i, t) for u in self.unhealthy)
            )
            if ids:
                out.append(replace(devs, device_ids=ids))
        return tuple(out)

    @property
    def has_processes(self) -> bool:
        return "procfs" in self.sections or any(p.pids for p in self.pods)
