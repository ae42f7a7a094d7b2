"""The kubelet's restart window: empty answers from a new socket are held, for a while.

Right after a restart the kubelet answers List and GetAllocatableResources successfully
with nothing: 1.32 for about 0.1-0.25 s (List) and 0.3 s (allocatable, until its device
plugins register again); 1.36 List with no pods for 0.96-0.97 s while allocatable is back
within 0.14-0.5 s (docs/podresources.md, real kubelet K4 and C11).
Believed, such an answer drops every running pod's allocation series for a cycle and turns
every device's `hw_device_allocatable` to 0, which is what `KubeDeviceNotAllocatable`
alerts on.

So while the socket is new (its identity changed less than `window` seconds ago), an
empty List is replaced by the last good one, and a resource that the last good
GetAllocatableResources had and this one lacks keeps its last good devices (plugins
register one by one). After the window an empty answer is believed: the pods are gone, the
plugin did not come back. The default window, 5 s, is several times the longest empty
answers measured on real kubelets (docs/podresources.md, docs/design-figures.md),
and holds a plugin that re-registers when it sees the new kubelet socket (the NVIDIA
plugin watches it with inotify); a pod that really left during a restart shows as gone at
most 5 s late, nothing against the alerts' `for: 1m`. A device that turns unhealthy is not
held: only whole resources that are missing are.
"""

from __future__ import annotations

from collections.abc import Callable

from exporter.model import ContainerDevices, Pod
from exporter.runtime.log import StateLog

DEFAULT_SETTLE_SECONDS = 5.0

LIST = "List"
ALLOCATABLE = "GetAllocatableResources"


class RestartSettle:
    """Holds the last good answers while the kubelet's socket is new and answers are empty."""

    def __init__(self, window: float, clock: Callable[[], float], states: StateLog) -> None:
        self.window = window
        self._clock = clock
        self._states = states
        self._new_since: float | None = None
        self._pods: tuple[Pod, ...] = ()
        self._allocatable: tuple[ContainerDevices, ...] = ()
        self.held: dict[str, bool] = {LIST: False, ALLOCATABLE: False}
        """method -> whether its last answer was replaced by the last good one."""
        self.listed: frozenset[str] = frozenset()
        """Every resource an allocatable answer (held ones included) listed a device of: one
        missing later has lost its plugin (`hw_allocation_resource_registered` 0)."""

    def new_socket(self) -> None:
        """The socket file changed identity (a kubelet started on it): the window opens."""
        self._new_since = self._clock()

    def settling(self) -> bool:
        since = self._new_since
        return since is not None and self._clock() - since < self.window

    def pods(self, pods: tuple[Pod, ...]) -> tuple[Pod, ...]:
        """This List answer, or the last good one while a new kubelet answers empty."""
        hold = not pods and bool(self._pods) and self.settling()
        if not hold:
            self._pods = pods
        self._note(LIST, hold, f"{len(self._pods)} pods")
        return self._pods

    def allocatable(self, devices: tuple[ContainerDevices, ...]) -> tuple[ContainerDevices, ...]:
        """This answer, plus the last good devices of every resource it lacks while the
        socket is new (a plugin not registered again yet)."""
        have = {d.resource_name for d in devices}
        missing = tuple(d for d in self._allocatable if d.resource_name not in have)
        hold = bool(missing) and self.settling()
        if hold:
            devices = tuple(sorted(devices + missing, key=_device_key))
        self._allocatable = devices
        self.listed |= {d.resource_name for d in devices if d.device_ids}
        resources = sorted({d.resource_name for d in missing})
        self._note(ALLOCATABLE, hold, f"resources {', '.join(resources)}")
        return devices

    def _note(self, method: str, hold: bool, what: str) -> None:
        self.held[method] = hold
        if hold:
            self._states.failed(
                f"held/{method}",
                f"PodResources {method} answered empty from a kubelet that restarted "
                f"(its restart window); holding the last good answer ({what}) for up to "
                f"{self.window:g}s",
            )
        else:
            self._states.ok(f"held/{method}", f"PodResources {method}: answers believed again")


def _device_key(d: ContainerDevices) -> tuple[str, tuple[int, ...], tuple[str, ...]]:
    return (d.resource_name, d.numa_nodes, d.device_ids)
