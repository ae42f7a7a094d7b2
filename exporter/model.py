"""The data that flows one way: sources -> join -> snapshot -> sinks.

Sources return `SourceResult`s (devices and their samples, in base units). The
PodResources client returns a `PodResourcesState`. `join.join()` turns both into an
immutable `Snapshot`, which the sinks only read. Attribute keys are OpenTelemetry
attribute names (`hw.id`, `k8s.pod.name`); the Prometheus sink translates them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from exporter.reading import Attributes, Device, DeviceReading, Key, Layout, Sample

__all__ = ["Attributes", "Device", "DeviceReading", "Key", "Layout", "Sample"]
"""The names of exporter/reading.py, re-exported: every part of the contract is here."""


@dataclass(frozen=True, slots=True)
class ProcessUsage:
    """A host process using a device (from NVML process lists, KFD, DRM fdinfo)."""

    device_id: str
    pid: int
    """In the host's PID namespace (what KFD, the host's /proc and NVML's utilization
    samples show)."""
    memory_bytes: float | None = None
    """None when the reader cannot say (NVML hides the memory of processes outside the
    caller's PID namespace), never 0."""
    utilization: float | None = None
    """Fraction of time the process kept the device busy (NVIDIA: SM samples; DRM: its
    busiest engine class)."""


@dataclass(frozen=True, slots=True)
class SourceResult:
    source: str
    readings: tuple[DeviceReading, ...] = ()
    processes: tuple[ProcessUsage, ...] = ()
    field_errors: int = 0
    """Fields skipped this cycle (unreadable files, driver errors): counted, never fatal."""
    absent: str = ""
    """Why the source has no devices because the hardware is not on this node (library not
    installed, driver not loaded, sysfs class empty); empty when it is. Absent is success."""


# --- the kubelet's view -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    resource_name: str
    device_ids: tuple[str, ...]
    numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ContainerMemory:
    memory_type: str
    size_bytes: int
    numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ClaimResource:
    driver_name: str
    pool_name: str
    device_name: str
    cdi_devices: tuple[str, ...] = ()
    share_id: str = ""


@dataclass(frozen=True, slots=True)
class DynamicResource:
    claim_name: str
    claim_namespace: str
    claim_resources: tuple[ClaimResource, ...] = ()


@dataclass(frozen=True, slots=True)
class Container:
    name: str
    devices: tuple[ContainerDevices, ...] = ()
    cpu_ids: tuple[int, ...] = ()
    memory: tuple[ContainerMemory, ...] = ()
    dynamic_resources: tuple[DynamicResource, ...] = ()


@dataclass(frozen=True, slots=True)
class Pod:
    name: str
    namespace: str
    containers: tuple[Container, ...] = ()


@dataclass(frozen=True, slots=True)
class PodResourcesState:
    """One consistent read of the kubelet: who holds what, and what the node can allocate."""

    pods: tuple[Pod, ...] = ()
    allocatable: tuple[ContainerDevices, ...] = ()
    allocatable_known: bool = False
    api_version: str = ""
    resources_listed: frozenset[str] = frozenset()
    """Every resource GetAllocatableResources listed a device of since this process started
    (the client remembers): one listed by none now has lost its plugin, not never had one."""


# --- the joined result ---------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class Holder:
    namespace: str
    pod: str
    container: str


class AllocationKind(StrEnum):
    DEVICE_PLUGIN = "device_plugin"
    DRA = "dra"


@dataclass(frozen=True, slots=True)
class Allocation:
    """One (device, holder) pair, as PodResources reported it."""

    holder: Holder
    resource_name: str
    raw_id: str
    device_id: str = ""
    """`hw.id` of the device the raw ID resolved to; empty when no source knows it."""
    replica: str = ""
    shared: bool = False
    numa_nodes: tuple[int, ...] = ()
    kind: AllocationKind = AllocationKind.DEVICE_PLUGIN
    claim: str = ""
    driver: str = ""
    pool: str = ""


@dataclass(frozen=True, slots=True)
class Owner:
    """The container a host process runs in: pod UID and container ID from its cgroup,
    the names from the kubelet's `/var/log/containers` entry of that container ID."""

    namespace: str
    pod: str
    container: str
    pod_uid: str = ""
    container_id: str = ""

    @property
    def holder(self) -> Holder:
        return Holder(self.namespace, self.pod, self.container)


@dataclass(frozen=True, slots=True)
class ContainerUsage:
    """What one container's processes use of one device, summed; `owner` None is the one
    bucket of processes of no pod (host processes, or not resolvable yet)."""

    device_id: str
    owner: Owner | None
    processes: int
    memory_bytes: float | None = None
    """None when no process of the group had a memory reading."""
    utilization: float | None = None
    requested: bool = False
    """The container holds this device (or its parent or a slice of it) per PodResources."""


@dataclass(frozen=True, slots=True)
class JoinedDevice:
    reading: DeviceReading
    holder: Holder | None = None
    """The one container holding the device, or None when nobody or several do."""
    holders: int = 0
    allocatable: bool = False
    resource: str = ""
    """The extended resource the kubelet lists this device under now, or listed it under
    earlier in this process's life, or under which a container holds it; empty when none
    is known (a MIG-mode parent, a device no plugin advertises) or the kubelet's
    allocatable list is not known. `allocatable` False with a resource: the device plugin
    reported the device unhealthy (see docs/podresources.md)."""


_new_object = object.__new__


def _slot_setter(cls: type, name: str) -> Callable[[Any, Any], None]:
    """The setter of one slot of `cls` (no frozen dataclass's check on the way)."""
    setter: Callable[[Any, Any], None] = getattr(cls, name).__set__
    return setter


def joined_device(
    reading: DeviceReading,
    holder: Holder | None,
    holders: int,
    allocatable: bool,
    resource: str,
) -> JoinedDevice:
    """`JoinedDevice(reading, holder, holders, allocatable, resource)`, its slots set
    directly: the join and the series budget make one per device every cycle, and a frozen
    dataclass's `__init__` goes through `object.__setattr__` for each field."""
    joined: JoinedDevice = _new_object(JoinedDevice)
    _set_reading(joined, reading)
    _set_holder(joined, holder)
    _set_holders(joined, holders)
    _set_allocatable(joined, allocatable)
    _set_resource(joined, resource)
    return joined


_set_reading = _slot_setter(JoinedDevice, "reading")
_set_holder = _slot_setter(JoinedDevice, "holder")
_set_holders = _slot_setter(JoinedDevice, "holders")
_set_allocatable = _slot_setter(JoinedDevice, "allocatable")
_set_resource = _slot_setter(JoinedDevice, "resource")


@dataclass(frozen=True, slots=True)
class ContainerNuma:
    """Where one container's resources sit, by NUMA node (see join.container_numa).

    `aligned` is True when the NUMA nodes of its exclusive CPUs and of its pinned memory
    are each exactly the NUMA nodes of its devices, False when not, None when there is
    nothing to compare (no device topology, shared-pool CPUs and no pinned memory, or an
    exclusive CPU the node's CPU map does not know)."""

    holder: Holder
    devices: tuple[tuple[str, int], ...] = ()
    """(resource, NUMA node) of its devices, from PodResources topology."""
    exclusive_cpus: int = 0
    """CPUs the static CPU manager gave it alone; 0: it runs on the shared pool."""
    cpus: tuple[int, ...] = ()
    """NUMA nodes of its exclusive CPUs, from the node's CPU -> NUMA map (sysfs)."""
    memory: tuple[tuple[str, int], ...] = ()
    """(memory type, NUMA node) of memory the memory manager pinned for it."""
    aligned: bool | None = None


@dataclass(frozen=True, slots=True)
class PairPlacement:
    """How far apart, in the PCIe tree, one GPU and one NIC of a container sit
    (exporter/derive/placement.py): `level` 1 (PIX, one PCIe switch) to 5 (SYS, across the CPU
    interconnect), `level_name` nvidia-smi's word for it."""

    holder: Holder
    gpu_id: str
    nic_id: str
    level: int
    level_name: str


class ContainerEnergy(NamedTuple):
    """Joules of one device credited to one holder since the exporter started
    (exporter/derive/energy.py); `holder` None: the device's energy while nobody held it.
    A named tuple, as `Sample` is: a node of many holders makes one per holder and metered
    device every cycle."""

    device_id: str
    holder: Holder | None
    joules: float


@dataclass(frozen=True, slots=True)
class SourceHealth:
    name: str
    success: bool
    duration_seconds: float
    field_errors_total: int = 0
    error: str = ""
    absent: str = ""
    """Set when the source succeeded with no hardware on this node: the reason."""


@dataclass(frozen=True, slots=True)
class PodResourcesHealth:
    api_version: str = ""
    connected: bool = False
    last_success_timestamp: float = 0.0
    requests_total: Mapping[tuple[str, str], int] = field(default_factory=dict)
    """(method, grpc code name) -> count."""
    last_duration_seconds: Mapping[str, float] = field(default_factory=dict)
    invalid_device_ids_total: int = 0
    """Empty or malformed device IDs skipped so far."""
    held: tuple[str, ...] = ()
    """Methods whose last answer was replaced by the last good one (a restarting kubelet's
    empty answers, exporter/podresources/settle.py)."""
    refused: Mapping[tuple[str, str], int] = field(default_factory=dict)
    """(method, reason) -> answers that did not decode, dropped (the last good kept)."""


@dataclass(frozen=True, slots=True)
class PodInfo:
    """What the Kubernetes API says about a pod holding devices (`--kubernetes.api`)."""

    namespace: str
    pod: str
    attributes: Attributes = ()
    """`k8s.pod.uid`, the workload and owner names, allowed `k8s.pod.label.<key>`s."""


@dataclass(frozen=True, slots=True)
class KubeApiHealth:
    up: bool = False
    """The pod watch is established and its cache in sync."""
    pods: int = 0
    """Pods of this node in the cache."""
    requests_total: Mapping[tuple[str, str, str], int] = field(default_factory=dict)
    """(verb, resource, HTTP status code or error) -> count."""
    source: str = "kubernetes-api"
    """Where the pods come from: `kubernetes-api` (the API server's pod watch) or
    `kubelet-pods-api` (the kubelet's Pods API; owners above ReplicaSet/Job still from the API)."""
    refused: Mapping[tuple[str, str, str], int] = field(default_factory=dict)
    """(peer, request, reason) -> answers dropped at the decode boundary (answers.py)."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one cycle learned. Immutable; the sinks only read it."""

    timestamp: float
    node: str
    devices: tuple[JoinedDevice, ...] = ()
    allocations: tuple[Allocation, ...] = ()
    allocatable: tuple[ContainerDevices, ...] = ()
    processes: tuple[ProcessUsage, ...] = ()
    sources: tuple[SourceHealth, ...] = ()
    podresources: PodResourcesHealth = field(default_factory=PodResourcesHealth)
    cycle_duration_seconds: float = 0.0
    cycles_total: int = 0
    last_success_timestamp: float = 0.0
    self_samples: tuple[Sample, ...] = ()
    """Exporter-scope samples contributed by other parts (e.g. the OTLP sink's export counts)."""
    unseen: tuple[tuple[str, int], ...] = ()
    """(resource, allocatable devices no source sees); see join.JoinResult.unseen."""
    registered: tuple[tuple[str, bool], ...] = ()
    """(resource, whether its device plugin is registered); see join.JoinResult.registered."""
    containers: tuple[ContainerNuma, ...] = ()
    """NUMA placement of every container holding matched devices; see join.container_numa."""
    pods: tuple[PodInfo, ...] = ()
    """Device-holding pods as the Kubernetes API knows them (empty without --kubernetes.api)."""
    kubeapi: KubeApiHealth | None = None
    """None without --kubernetes.api."""
    owners: Mapping[int, Owner] = field(default_factory=dict)
    """Host PID -> its container, for the processes in `processes`."""
    container_usage: tuple[ContainerUsage, ...] = ()
    """Per (device, container) sums of the processes in `processes`."""
    attribution: bool = False
    """Whether process attribution ran this cycle (host /proc and container logs readable)."""
    allocations_left_out: tuple[tuple[str, int], ...] = ()
    """(resource, device-plugin allocations the series budget left out of `allocations`):
    `hw.allocated.devices` still counts them (exporter/derive/budget.py)."""
    placements: tuple[PairPlacement, ...] = ()
    """GPU-NIC pairs of every container holding both; see exporter/derive/placement.py."""
    container_energy: tuple[ContainerEnergy, ...] = ()
    """Each device's energy apportioned to its holders; see exporter/derive/energy.py."""


# --- what a pod's status says of its DRA claims (exporter/dra) ------------------


@dataclass(frozen=True, slots=True, order=True)
class ClaimHealth:
    container: str
    claim: str
    """The ResourceClaim's name (`<claim>` or `<claim>/<request>`): the status entry's name
    less `claim:`, its pod's reference turned into the claim it names."""
    resource_id: str
    health: str
    message: str = ""


@dataclass(frozen=True, slots=True, order=True)
class ExtendedClaim:
    claim: str
    """The ResourceClaim the scheduler made
    (`status.extendedResourceClaimStatus.resourceClaimName`)."""
    container: str
    resource: str
    """The extended resource the container asked for (`example.com/gpu`)."""
    request: str = ""
    """The claim's request serving it (`container-0-request-0`): the allocation results of
    that request are the container's own devices."""
