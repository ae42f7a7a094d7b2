"""The one metric-spec table.

Every metric the exporter can emit is a row here: its OpenTelemetry name, instrument
kind, UCUM unit, help text and the metric-specific attributes it may carry. Both sinks
and `docs/metrics.md` (`monitoring/metricdoc.py`) are derived from this table; nothing
else knows metric names.

Names follow the OpenTelemetry hardware semantic conventions (`hw.*`, `hw.gpu.*`) and
are extended in the same pattern where no convention exists. Prometheus names and
label names are derived with the OpenTelemetry Collector's Prometheus translation
(`.` -> `_`, unit suffix, `_total` on monotonic counters, `_ratio` for unit "1"
gauges), so a dashboard works whether the data arrived by scrape or by OTLP through a
collector.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from enum import StrEnum

from exporter.settings.table import CORE

Attributes = tuple[tuple[str, str], ...]


class Kind(StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"
    """Monotonic sum: Prometheus counter with `_total`."""
    UPDOWN = "updowncounter"
    """Non-monotonic sum (OpenTelemetry UpDownCounter): Prometheus gauge."""


class Scope(StrEnum):
    DEVICE = "device"
    """One series per device (never copied per pod), device and holder labels."""
    ALLOCATION = "allocation"
    """Built by the join from PodResources: one series per (device, holder) or resource."""
    POD = "pod"
    """From the Kubernetes API (`--kubernetes.api`): one info series per device-holding pod."""
    EXPORTER = "exporter"
    """The exporter's own health."""
    WORKLOAD = "workload"
    """From process attribution: one series per (device, container), or per process."""


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str
    kind: Kind
    unit: str
    help: str
    scope: Scope = Scope.DEVICE
    attributes: tuple[str, ...] = ()
    """Metric-specific attribute keys (device and holder attributes come on top)."""
    group: str = CORE
    """The metric group its series belong to (`GROUPS`)."""
    value_groups: tuple[tuple[str, str, str], ...] = ()
    """(attribute, value, group): series carrying that attribute value belong to that group
    instead (`hw.errors` with `error.type="nvlink_crc"` is `interconnect`)."""

    def group_of(self, attributes: Attributes) -> str:
        """The group of this metric's series with `attributes`."""
        for key, value, group in self.value_groups:
            if (key, value) in attributes:
                return group
        return self.group

    @property
    def prom_name(self) -> str:
        return prometheus_name(self.name, self.unit, self.kind)

    @property
    def prom_family(self) -> str:
        """The name of the Prometheus metric family (a counter family has no `_total`)."""
        name = self.prom_name
        return name.removesuffix("_total") if self.kind is Kind.COUNTER else name

    def prom_type(self, *, openmetrics: bool) -> str:
        """The `# TYPE` word in the classic text format or in OpenMetrics."""
        return "counter" if self.kind is Kind.COUNTER else "gauge"


# UCUM units -> Prometheus unit words (the Collector's translator table, the part we use).
_UNIT_WORDS = {
    "By": "bytes",
    "By/s": "bytes_per_second",
    "s": "seconds",
    "ms": "milliseconds",
    "W": "watts",
    "J": "joules",
    "Cel": "celsius",
    "Hz": "hertz",
    "V": "volts",
    "%": "percent",
}


@functools.cache
def prometheus_name(name: str, unit: str, kind: Kind) -> str:
    """OpenTelemetry metric name -> Prometheus name, as the Collector translates it."""
    base = re.sub(r"[^a-zA-Z0-9_]", "_", name)
    words = base.split("_")
    suffix = ""
    if unit and not unit.startswith("{"):
        if unit == "1":
            suffix = "ratio" if kind is Kind.GAUGE else ""
        else:
            suffix = _UNIT_WORDS[unit]
    if suffix and not base.endswith(suffix) and suffix not in words:
        base = f"{base}_{suffix}"
    if kind is Kind.COUNTER and not base.endswith("_total"):
        base = f"{base}_total"
    return base


@functools.cache
def prometheus_label(attribute: str) -> str:
    """OpenTelemetry attribute key -> Prometheus label name (`hw.id` -> `hw_id`)."""
    label = re.sub(r"[^a-zA-Z0-9_]", "_", attribute)
    return f"key_{label}" if label[:1].isdigit() else label


# --- attributes -----------------------------------------------------------------------

NODE_ATTRIBUTE = "k8s.node.name"
HOLDER_ATTRIBUTES = ("k8s.namespace.name", "k8s.pod.name", "k8s.container.name")

ATTRIBUTES: dict[str, str] = {
    # identity of the device: hw.id, type, vendor, model, parent on every device series;
    # the vendor identity below them only on hw.info
    "hw.id": "Stable device id: NVIDIA GPU/MIG UUID, AMD unique_id or PCI address, "
    "Intel PCI address, `<ibdev>/<port>` for InfiniBand ports, PCI address for NIC VFs.",
    "hw.type": "OpenTelemetry hardware type: `gpu` or `network`.",
    "hw.vendor": "Vendor: `nvidia`, `amd`, `intel`, `mellanox`...",
    "hw.model": "Model name as the driver reports it.",
    "hw.parent": "`hw.id` of the parent device (the GPU of a MIG slice, the HCA of a port, "
    "the PF of a VF).",
    "hw.driver_version": "Kernel driver version.",
    "hw.serial_number": "Board serial number where the driver exposes it.",
    "hw.pci.bus_id": "PCI address `dddd:bb:dd.f` (lower-case, 4-digit domain).",
    "hw.gpu.index": "NVML device index.",
    "hw.gpu.minor": "Device minor number (`/dev/nvidia<minor>`, GKE `nvidia<minor>` IDs).",
    "hw.gpu.mig.profile": "MIG profile of a MIG slice, e.g. `1g.10gb`.",
    "hw.gpu.mig.gpu_instance_id": "MIG GPU instance id.",
    "hw.gpu.mig.compute_instance_id": "MIG compute instance id.",
    "hw.gpu.partition": "AMD compute partition (`amdgpu_xcp_<N>`) or Intel card name.",
    "hw.network.port": "InfiniBand port number.",
    "hw.network.name": "Network interface or RDMA device name.",
    "hw.network.stats_source": "Where SR-IOV VF statistics came from: `host_sysfs`, "
    "`pf_netlink` or `pod_netns`.",
    # holder (on device series held by exactly one container, and on allocations)
    "k8s.namespace.name": "Namespace of the pod holding the device (empty when nobody or "
    "several containers hold it).",
    "k8s.pod.name": "Pod holding the device.",
    "k8s.container.name": "Container holding the device.",
    "k8s.node.name": "The node (`--node-name`); a resource attribute in OTLP.",
    # pod metadata from the Kubernetes API (k8s.pod.workload.info, --kubernetes.api)
    "k8s.replicaset.name": "ReplicaSet controlling the pod.",
    "k8s.deployment.name": "Deployment controlling the pod's ReplicaSet.",
    "k8s.statefulset.name": "StatefulSet controlling the pod.",
    "k8s.daemonset.name": "DaemonSet controlling the pod.",
    "k8s.job.name": "Job controlling the pod.",
    "k8s.cronjob.name": "CronJob controlling the pod's Job.",
    "k8s.workload.kind": "Kind at the top of the pod's owner chain: `Deployment`, `CronJob`, "
    "`Job`, `StatefulSet`, `DaemonSet`, `ReplicaSet`, a custom controller's kind, or `Pod` for "
    "a pod nobody controls.",
    "k8s.workload.name": "Name at the top of the pod's owner chain (the pod's own for `Pod`).",
    "k8s.pod.label.<key>": "A pod label whose key matches `--kubernetes.pod-labels` (the key "
    "as given in OTLP; `.`, `/` and `-` become `_` in Prometheus, as the Collector does).",
    # metric-specific
    "hw.gpu.task": "What the utilization is of: `general`, `encoder`, `decoder`.",
    "hw.gpu.pipe": "Which SM math pipe: `fp64`, `fp32`, `fp16` (non-tensor).",
    "hw.sensor_location": "Temperature sensor: `gpu`, `memory`, `edge`, `junction`, `package`.",
    "hw.gpu.clock.type": "Clock domain: `sm`, `graphics`, `memory`.",
    "hw.gpu.clock.throttle_reason": "Why clocks are held down (NVML clock event reason).",
    "hw.state": "Operational state: `ok`, `degraded`, `failed`.",
    "error.type": "Kind of error: `ecc_corrected`, `ecc_uncorrected`, `ecc_deferred`, "
    "`pcie_replay`, `nvlink_crc`, `receive`, `transmit`; InfiniBand: `symbol`, `link_downed`, "
    "`link_error_recovery`, `local_link_integrity`, `excessive_buffer_overrun`, `constraint`, "
    "`remote_physical`, `switch_relay`, `vl15_dropped`.",
    "hw.error.block": "Hardware block an error was counted in (AMD RAS: `umc`, `gfx`, ...).",
    "hw.gpu.xid": "NVIDIA XID error code.",
    "hw.gpu.memory.remap_cause": "Why rows were remapped: `correctable`, `uncorrectable`.",
    "network.io.direction": "`transmit` or `receive`.",
    "hw.network.rdma.counter": "Name of an RDMA `hw_counters` file.",
    "process.pid": "Host PID of a process using the device.",
    "k8s.pod.uid": "The pod's UID: from the Kubernetes API on `k8s_pod_workload_info`; from the "
    "process's cgroup on the per-container series.",
    "hw.allocation.requested": "`true` when the container holds the device (or its parent or "
    "one of its slices) per PodResources, `false` when it uses a device it did not request; "
    "absent on the series of processes of no pod.",
    # allocation series
    "hw.allocation.kind": "`device_plugin` or `dra`.",
    "hw.allocation.resource": "Extended resource name (`nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`"
    ", `rdma/hca_shared_devices_a`...); the DRA driver for claims, the extended resource for "
    "a claim the scheduler made for one (KEP-5004).",
    "hw.allocation.device_id": "The device ID exactly as the kubelet reported it.",
    "hw.allocation.replica": "Replica of a shared device (`::N` time-slicing/MPS, GKE `vgpuN`).",
    "hw.allocation.shared": "`true` when the device is shared between containers.",
    "hw.allocation.claim": "DRA ResourceClaim name.",
    "hw.allocation.pool": "DRA pool name.",
    "hw.dra.kind": "What a DRA device is, from its ResourceSlice: the driver's `type` attribute "
    "(`gpu`, `mig`, `vfio`...) and its profile (`mig/1g.10gb`), or `device`.",
    "hw.dra.health": "Device health the kubelet reports for a claim "
    "(`allocatedResourcesStatus`): `Healthy`, `Unhealthy` or `Unknown`.",
    "hw.dra.counter_set": "A DRA pool's shared counter set (KEP-4815; NVIDIA: "
    "`gpu-<minor>-counter-set`).",
    "hw.dra.counter": "A counter of a shared counter set (`memory-slice-0`, "
    "`multiprocessors`, `memory`).",
    "hw.dra.capacity": "A DRA device capacity (`memory`), as the driver names it.",
    "hw.dra.condition": "A condition type a DRA driver wrote for a device (`Ready`).",
    "hw.dra.condition.status": "`True`, `False` or `Unknown`.",
    "hw.dra.condition.reason": "The condition's reason (`NetworkDeviceReady`).",
    "hw.network.mac": "A network device's hardware address (DRA `networkData`).",
    "hw.network.ips": "A network device's addresses in CIDR form, comma-separated (DRA "
    "`networkData`).",
    "hw.dra.taint.key": "Device taint key (ResourceSlice or DeviceTaintRule).",
    "hw.dra.taint.value": "Device taint value (may be empty).",
    "hw.dra.taint.effect": "Device taint effect: `NoSchedule`, `NoExecute` or `None`.",
    "hw.dra.taint.source": "`slice` for a taint the driver put in its ResourceSlice, else the "
    "DeviceTaintRule's name.",
    "hw.numa_node": "NUMA node(s) from PodResources topology, comma-separated; one node on "
    "`hw_container_numa_node`.",
    "hw.gpu.id": "`hw.id` of the GPU (or MIG slice) of a GPU-NIC pair.",
    "hw.network.id": "`hw.id` of the NIC (InfiniBand port, VF, PF) of a GPU-NIC pair.",
    "hw.pcie.placement": "nvidia-smi's word for a GPU-NIC pair's PCIe path: `PIX` (one PCIe "
    "switch), `PXB` (several switches below one root port), `PHB` (one host bridge), `NODE` "
    "(host bridges of one NUMA node), `SYS` (across the CPU interconnect); docs/placement.md.",
    "hw.numa.resource": "What sits on the NUMA node: an extended resource (`nvidia.com/gpu`), "
    "`cpu` (exclusive CPUs) or a memory type (`memory`, `hugepages-1Gi`).",
    # exporter self-metrics
    "source": "Exporter source (collector) name.",
    "method": "PodResources RPC (`List`, `GetAllocatableResources`, `Get`).",
    "code": "gRPC status code name (PodResources); HTTP status or error class (Kubernetes API).",
    "verb": "Kubernetes API verb: `list`, `watch`, `get`.",
    "resource": "Kubernetes API resource: `pods`, `replicasets`, `jobs`.",
    "result": "`success` or `failure`; Kubernetes Events: `created`, `deduplicated`, "
    "`rate_limited`, `dropped`, `failed`.",
    "hw.event.class": "Class of a device event: `hardware`, `driver`, `application` (XIDs by "
    "NVIDIA's catalog), `network`, `unknown` (docs/events.md).",
    "version": "Exporter version.",
    "python_version": "Python version.",
    "api_version": "PodResources API version in use (`v1`, `v1alpha1`).",
    "sink": "Sink name (`otlp`: the metrics; `otlp-logs`: the device events' log records).",
    "peer": "Who answered: `kubernetes-api`, `kubelet-pods-api`, `kubelet-podresources`, `otlp`.",
    "request": "What the peer was asked: `pods`, `owners`, `resourceslices`, "
    "`devicetaintrules` (Kubernetes API, Pods API), `List`, `GetAllocatableResources` "
    "(PodResources), `metrics`, `logs` (OTLP).",
    "step": "A step of the exporter's cycle (docs/architecture.md).",
    "group": "Metric group (`--metrics.group.NAME`; docs/metrics.md).",
    "reason": "Why the exporter's HTTP server closed a connection or refused a request: "
    "`header_timeout`, `write_timeout`, `evicted`, `connection_limit`, `tls_handshake`; "
    "`malformed`, `unauthorized`, `rate_limited` (a password check refused without bcrypt: "
    "the client's failures over budget, or too many checks waiting). Why a peer's answer "
    "was dropped: `decode`, `bytes`, `pages`, `objects`, `time` (docs/reliability.md).",
}

DEVICE_ATTRIBUTES = (
    "hw.id",
    "hw.type",
    "hw.vendor",
    "hw.model",
    "hw.parent",
)
"""Attributes every device series carries (the vendor ones sources add are on hw.info)."""


THROTTLE_REASONS: tuple[tuple[str, int], ...] = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
)
"""`hw.gpu.clock.throttle_reason` values and their NVML clock event reason bits
(`nvmlClocksEventReason*`): the NVML source splits the driver's mask into one series per
reason, and the dcgm schema joins those series back into dcgm-exporter's mask. Both read
this table, so neither needs the other."""

QUIET_THROTTLE_REASONS = (
    "gpu_idle",
    "applications_clocks_setting",
    "sync_boost",
    "display_clock_setting",
)
"""The reasons no alert reads: in the `clocks` group; the other five are in `core`."""


# --- the table ------------------------------------------------------------------------

_D = Scope.DEVICE
_A = Scope.ALLOCATION
_E = Scope.EXPORTER
_P = Scope.POD
G, C, U = Kind.GAUGE, Kind.COUNTER, Kind.UPDOWN

SPECS_LIST: tuple[MetricSpec, ...] = (
    # identity and health
    MetricSpec("hw.info", G, "", "Device identity; always 1. Carries every device attribute."),
    MetricSpec(
        "hw.status",
        U,
        "1",
        "Operational status: 1 for the current state, 0 for the others.",
        attributes=("hw.state",),
    ),
    # GPU activity
    MetricSpec(
        "hw.gpu.utilization",
        G,
        "1",
        "Fraction of time the GPU (or MIG slice) spent on a task over the last sample period.",
        attributes=("hw.gpu.task",),
        value_groups=(("hw.gpu.task", "encoder", "media"), ("hw.gpu.task", "decoder", "media")),
    ),
    MetricSpec(
        "hw.gpu.memory.bandwidth.utilization",
        G,
        "1",
        "Fraction of time device memory was being read or written (NVML memory utilization, "
        "AMD mem_busy_percent).",
    ),
    MetricSpec(
        "hw.gpu.graphics.activity",
        G,
        "1",
        "Fraction of time any compute or graphics work was active, averaged over the GPM "
        "interval (NVIDIA GPM GRAPHICS_UTIL; GPM: Hopper and later, whole GPUs and MIG slices).",
        group="profiling",
    ),
    MetricSpec(
        "hw.gpu.sm.activity",
        G,
        "1",
        "Fraction of streaming multiprocessors busy, averaged over the GPM interval (NVIDIA "
        "GPM SM_UTIL).",
        group="profiling",
    ),
    MetricSpec(
        "hw.gpu.sm.occupancy",
        G,
        "1",
        "Warps resident on the SMs as a fraction of the theoretical maximum, averaged over "
        "the GPM interval (NVIDIA GPM SM_OCCUPANCY).",
        group="profiling",
    ),
    MetricSpec(
        "hw.gpu.tensor.activity",
        G,
        "1",
        "Fraction of time any tensor pipe was active, averaged over the GPM interval (NVIDIA "
        "GPM ANY_TENSOR_UTIL).",
        group="profiling",
    ),
    MetricSpec(
        "hw.gpu.pipe.activity",
        G,
        "1",
        "Fraction of time the SMs did non-tensor math of a precision, averaged over the GPM "
        "interval (NVIDIA GPM FP64_UTIL, FP32_UTIL, FP16_UTIL).",
        attributes=("hw.gpu.pipe",),
        group="profiling",
    ),
    MetricSpec(
        "hw.gpu.dram.activity",
        G,
        "1",
        "DRAM bandwidth used as a fraction of the theoretical maximum, averaged over the GPM "
        "interval (NVIDIA GPM DRAM_BW_UTIL).",
        group="profiling",
    ),
    MetricSpec(
        "hw.gpu.pcie.throughput",
        G,
        "By/s",
        "PCIe traffic, averaged over the GPM interval (NVIDIA GPM PCIE_TX/RX_PER_SEC).",
        attributes=("network.io.direction",),
        group="profiling",
    ),
    MetricSpec(
        "hw.gpu.nvlink.throughput",
        G,
        "By/s",
        "NVLink traffic over all links, averaged over the GPM interval (NVIDIA GPM "
        "NVLINK_TOTAL_TX/RX_PER_SEC: transmit is its write, receive its read bandwidth).",
        attributes=("network.io.direction",),
        group="profiling",
    ),
    MetricSpec("hw.gpu.memory.usage", U, "By", "Device memory in use (NVIDIA FB, AMD VRAM)."),
    MetricSpec("hw.gpu.memory.limit", U, "By", "Device memory size."),
    MetricSpec("hw.gpu.memory.free", U, "By", "Device memory free.", group="memory"),
    MetricSpec(
        "hw.gpu.memory.reserved", U, "By", "Device memory reserved by the driver.", group="memory"
    ),
    MetricSpec(
        "hw.gpu.memory.visible.usage", U, "By", "CPU-visible VRAM in use (AMD).", group="memory"
    ),
    MetricSpec(
        "hw.gpu.memory.visible.limit", U, "By", "CPU-visible VRAM size (AMD).", group="memory"
    ),
    MetricSpec(
        "hw.gpu.memory.gtt.usage",
        U,
        "By",
        "GTT (system memory mapped for the GPU) in use.",
        group="memory",
    ),
    MetricSpec("hw.gpu.memory.gtt.limit", U, "By", "GTT size.", group="memory"),
    MetricSpec(
        "hw.gpu.clock",
        G,
        "Hz",
        "Current clock frequency.",
        attributes=("hw.gpu.clock.type",),
        group="clocks",
    ),
    MetricSpec(
        "hw.gpu.clock.throttled",
        G,
        "",
        "1 while the reason holds clocks down, else 0 (NVML clock event reasons).",
        attributes=("hw.gpu.clock.throttle_reason",),
        value_groups=tuple(
            ("hw.gpu.clock.throttle_reason", reason, "clocks") for reason in QUIET_THROTTLE_REASONS
        ),
    ),
    MetricSpec(
        "hw.gpu.idle.time",
        C,
        "s",
        "Time the GPU spent idle (Intel RC6 / GT idle residency); busy = 1 - rate.",
    ),
    MetricSpec(
        "hw.gpu.io",
        C,
        "By",
        "Bytes the GPU received and transmitted over PCIe.",
        attributes=("network.io.direction",),
        group="interconnect",
    ),
    MetricSpec(
        "hw.gpu.nvlink.io",
        C,
        "By",
        "Bytes over NVLink, all links.",
        attributes=("network.io.direction",),
        group="interconnect",
    ),
    # power and thermals
    MetricSpec("hw.power", G, "W", "Power drawn by the device."),
    MetricSpec("hw.power.limit", G, "W", "Enforced power limit.", group="clocks"),
    MetricSpec("hw.energy", C, "J", "Energy consumed by the device since the driver loaded."),
    MetricSpec(
        "hw.temperature",
        G,
        "Cel",
        "Temperature.",
        attributes=("hw.sensor_location",),
        value_groups=(("hw.sensor_location", "memory", "memory"),),
    ),
    # errors
    MetricSpec(
        "hw.errors",
        C,
        "{error}",
        "Errors counted by the device or driver.",
        attributes=("error.type", "hw.error.block", "network.io.direction"),
        value_groups=(
            ("error.type", "ecc_corrected", "memory"),
            ("error.type", "ecc_deferred", "memory"),
            ("error.type", "pcie_replay", "interconnect"),
            *(
                ("error.type", f"nvlink_{kind}", "interconnect")
                for kind in ("crc", "crc_flit", "replay", "recovery")
            ),
        ),
    ),
    MetricSpec(
        "hw.gpu.xid.errors",
        C,
        "{error}",
        "NVIDIA XID errors, counted once per event, by XID code.",
        attributes=("hw.gpu.xid",),
    ),
    MetricSpec(
        "hw.gpu.xid.last",
        G,
        "",
        "NVIDIA: the code of the latest XID error of the GPU or any of its MIG slices since "
        "the exporter started, 0 before any (on the GPU and on each slice); what "
        "dcgm-exporter's DCGM_FI_DEV_XID_ERRORS shows. Count with hw.gpu.xid.errors.",
    ),
    MetricSpec(
        "hw.gpu.memory.remapped_rows",
        U,
        "{row}",
        "Device memory rows remapped.",
        attributes=("hw.gpu.memory.remap_cause",),
        group="memory",
    ),
    MetricSpec(
        "hw.gpu.memory.row_remap.pending",
        G,
        "",
        "1 when a row remap is pending (needs a GPU reset).",
    ),
    MetricSpec("hw.gpu.memory.row_remap.failed", G, "", "1 when a row remap has failed."),
    # per container and per process (process attribution)
    MetricSpec(
        "hw.gpu.container.memory.usage",
        U,
        "By",
        "Device memory used by a container's processes on this device, summed; the series "
        "without pod labels holds the processes of no pod (host processes, or not resolvable "
        "yet). NVIDIA: needs hostPID (docs/attribution.md).",
        scope=Scope.WORKLOAD,
        attributes=("k8s.pod.uid", "hw.allocation.requested"),
    ),
    MetricSpec(
        "hw.gpu.container.utilization",
        G,
        "1",
        "Sum over a container's processes of the fraction of time each kept the device busy "
        "(NVIDIA: SM utilization samples, not under MIG; AMD/Intel: each process's busiest "
        "DRM engine class).",
        scope=Scope.WORKLOAD,
        attributes=("k8s.pod.uid", "hw.allocation.requested"),
    ),
    MetricSpec(
        "hw.gpu.container.processes",
        U,
        "{process}",
        "Processes of a container using the device (of no pod: the series without pod labels).",
        scope=Scope.WORKLOAD,
        attributes=("k8s.pod.uid", "hw.allocation.requested"),
    ),
    MetricSpec(
        "hw.gpu.process.memory.usage",
        U,
        "By",
        "Device memory used by a host process (opt-in: --attribution.process-series).",
        scope=Scope.WORKLOAD,
        attributes=("process.pid",),
    ),
    MetricSpec(
        "hw.gpu.process.utilization",
        G,
        "1",
        "Fraction of time a host process kept the GPU busy (opt-in: --attribution.process-series).",
        scope=Scope.WORKLOAD,
        attributes=("process.pid",),
    ),
    # network
    MetricSpec(
        "hw.network.io",
        C,
        "By",
        "Bytes received and transmitted (InfiniBand data counters are already multiplied by 4).",
        attributes=("network.io.direction",),
    ),
    MetricSpec(
        "hw.network.packets",
        C,
        "{packet}",
        "Packets received and transmitted.",
        attributes=("network.io.direction",),
    ),
    MetricSpec(
        "hw.network.dropped",
        C,
        "{packet}",
        "Packets dropped or discarded.",
        attributes=("network.io.direction",),
    ),
    MetricSpec("hw.network.up", U, "1", "1 when the link is up (InfiniBand state ACTIVE)."),
    MetricSpec("hw.network.bandwidth.limit", U, "By/s", "Link speed."),
    MetricSpec(
        "hw.network.ib.transmit_wait",
        C,
        "{tick}",
        "Ticks the port had data to send but no flow-control credits (port_xmit_wait).",
    ),
    MetricSpec(
        "hw.network.rdma.statistic",
        C,
        "",
        "RDMA driver hardware counters (`hw_counters/`, what `rdma statistic` shows), by name.",
        attributes=("hw.network.rdma.counter",),
    ),
    # allocations (from PodResources, built by the join)
    MetricSpec(
        "hw.allocation.info",
        G,
        "",
        "One series per (device, holder) from PodResources; always 1. `hw_id` is empty when no "
        "source knows the device. Join any device series to pods with "
        "`on(k8s_node_name, hw_id)` (PCI addresses and `mlx5_0/1` repeat across nodes).",
        scope=_A,
        attributes=(
            "hw.id",
            "hw.type",
            "hw.vendor",
            "hw.model",
            "k8s.namespace.name",
            "k8s.pod.name",
            "k8s.container.name",
            "hw.allocation.kind",
            "hw.allocation.resource",
            "hw.allocation.device_id",
            "hw.allocation.replica",
            "hw.allocation.shared",
            "hw.allocation.claim",
            "hw.allocation.pool",
            "hw.numa_node",
        ),
    ),
    MetricSpec(
        "hw.dra.device.info",
        G,
        "",
        "One series per device of this node's ResourceSlices (`--kubernetes.dra`); always 1. "
        "`hw_id` is the source device its published attributes (uuid, PCI bus ID) name, empty "
        "when none does. Labelled as `hw_allocation_info` names DRA devices.",
        scope=_A,
        attributes=(
            "hw.id",
            "hw.allocation.resource",
            "hw.allocation.pool",
            "hw.allocation.device_id",
            "hw.dra.kind",
        ),
    ),
    MetricSpec(
        "hw.dra.device.taint",
        G,
        "",
        "One series per taint on a DRA device (the slice's own, and DeviceTaintRules where the "
        "cluster serves them); always 1 (`--kubernetes.dra`).",
        scope=_A,
        attributes=(
            "hw.id",
            "hw.allocation.resource",
            "hw.allocation.pool",
            "hw.allocation.device_id",
            "hw.dra.taint.key",
            "hw.dra.taint.value",
            "hw.dra.taint.effect",
            "hw.dra.taint.source",
        ),
    ),
    MetricSpec(
        "hw.dra.allocation.health",
        G,
        "",
        "One series per claimed DRA device of a container, with the health the kubelet "
        "reports for it in the pod's `allocatedResourcesStatus` (KEP-4680); always 1 "
        "(`--kubernetes.dra`: from the pod watch, which then reads whole pods).",
        scope=_A,
        attributes=(
            "k8s.namespace.name",
            "k8s.pod.name",
            "k8s.container.name",
            "hw.allocation.claim",
            "hw.allocation.resource",
            "hw.allocation.pool",
            "hw.allocation.device_id",
            "hw.id",
            "hw.dra.health",
        ),
    ),
    MetricSpec(
        "hw.dra.free",
        U,
        "{device}",
        "DRA devices of this node's ResourceSlices a new claim could still get: held by no "
        "container (or shareable), not tainted NoSchedule/NoExecute, and their partition's "
        "shared counters not used up by held devices (`--kubernetes.dra`).",
        scope=_A,
        attributes=("hw.allocation.resource", "hw.allocation.pool", "hw.dra.kind"),
    ),
    MetricSpec(
        "hw.dra.counter.free",
        U,
        "{amount}",
        "What is left of a shared counter of a partitionable DRA pool (KEP-4815: a GPU's "
        "memory slices, multiprocessors, memory) once the devices held on this node took "
        "theirs, in the counter's base unit (bytes for memory) (`--kubernetes.dra`).",
        scope=_A,
        attributes=(
            "hw.allocation.resource",
            "hw.allocation.pool",
            "hw.dra.counter_set",
            "hw.dra.counter",
        ),
    ),
    MetricSpec(
        "hw.dra.counter.stranded",
        U,
        "{amount}",
        "Of what is left of a shared counter, what no device that could still be allocated "
        "would use: free capacity lost to fragmentation (a memory slice no free MIG "
        "placement covers) (`--kubernetes.dra`).",
        scope=_A,
        attributes=(
            "hw.allocation.resource",
            "hw.allocation.pool",
            "hw.dra.counter_set",
            "hw.dra.counter",
        ),
    ),
    MetricSpec(
        "hw.dra.device.capacity",
        U,
        "{amount}",
        "A capacity of a DRA device that claims share (`allowMultipleAllocations`, "
        "KEP-5075), in its base unit: bytes for memory (`--kubernetes.dra`).",
        scope=_A,
        attributes=(
            "hw.id",
            "hw.allocation.resource",
            "hw.allocation.pool",
            "hw.allocation.device_id",
            "hw.dra.capacity",
        ),
    ),
    MetricSpec(
        "hw.dra.device.capacity.free",
        U,
        "{amount}",
        "What the scheduler can still give new shares of a shared DRA device: its capacity "
        "less the `consumedCapacity` of every claim held on this node (admin-access claims "
        "are not counted, as the scheduler does not count them) (`--kubernetes.dra`).",
        scope=_A,
        attributes=(
            "hw.id",
            "hw.allocation.resource",
            "hw.allocation.pool",
            "hw.allocation.device_id",
            "hw.dra.capacity",
        ),
    ),
    MetricSpec(
        "hw.dra.allocation.capacity",
        U,
        "{amount}",
        "A pod's share of a shared DRA device: its claim's `consumedCapacity` (the request "
        "rounded up to the device's policy), in the capacity's base unit: bytes for memory "
        "(`--kubernetes.dra`, read from the ResourceClaim). `hw_allocation_replica` is the "
        "share ID.",
        scope=_A,
        attributes=(
            "k8s.namespace.name",
            "k8s.pod.name",
            "hw.allocation.claim",
            "hw.allocation.resource",
            "hw.allocation.pool",
            "hw.allocation.device_id",
            "hw.allocation.replica",
            "hw.id",
            "hw.dra.capacity",
        ),
    ),
    MetricSpec(
        "hw.dra.allocation.condition",
        G,
        "",
        "One series per condition a DRA driver wrote for an allocated device in the claim's "
        "`status.devices` (KEP-4817: DRANET's `Ready`, `NetworkReady`...); always 1, the "
        "status in `hw_dra_condition_status` (`--kubernetes.dra`).",
        scope=_A,
        attributes=(
            "k8s.namespace.name",
            "k8s.pod.name",
            "hw.allocation.claim",
            "hw.allocation.resource",
            "hw.allocation.pool",
            "hw.allocation.device_id",
            "hw.id",
            "hw.dra.condition",
            "hw.dra.condition.status",
            "hw.dra.condition.reason",
        ),
    ),
    MetricSpec(
        "hw.dra.allocation.network.info",
        G,
        "",
        "The network data a DRA driver wrote for an allocated network device (KEP-4817 "
        "`networkData`): its interface name inside the pod, MAC and addresses; always 1 "
        "(`--kubernetes.dra`).",
        scope=_A,
        attributes=(
            "k8s.namespace.name",
            "k8s.pod.name",
            "hw.allocation.claim",
            "hw.allocation.resource",
            "hw.allocation.pool",
            "hw.allocation.device_id",
            "hw.id",
            "hw.network.name",
            "hw.network.mac",
            "hw.network.ips",
        ),
    ),
    MetricSpec(
        "hw.dra.admin_access.info",
        G,
        "",
        "A container holding a DRA device through an admin-access claim (a monitoring "
        "agent's: `adminAccess: true`): not a holder of the device, so absent from "
        "`hw_allocation_info`; always 1 (`--kubernetes.dra`).",
        scope=_A,
        attributes=(
            "k8s.namespace.name",
            "k8s.pod.name",
            "k8s.container.name",
            "hw.allocation.claim",
            "hw.allocation.resource",
            "hw.allocation.pool",
            "hw.allocation.device_id",
            "hw.id",
        ),
    ),
    MetricSpec(
        "hw.allocatable.devices",
        U,
        "{device}",
        "Device IDs the node can allocate (GetAllocatableResources), by resource.",
        scope=_A,
        attributes=("hw.allocation.resource",),
    ),
    MetricSpec(
        "hw.allocation.resource.registered",
        G,
        "",
        "1 while the kubelet lists at least one device of the resource as allocatable "
        "(GetAllocatableResources); 0 while it lists none although it listed some to this "
        "exporter process before, or a container holds devices of it: its device plugin is "
        "not registered (stopped, crashed, not back after an upgrade or a kubelet restart), "
        "so no new pod can get its devices. A resource of one device that its plugin marks "
        "unhealthy reads 0 too: the kubelet's answer is the same. Answers held across a "
        "kubelet restart count as listed. No series while the allocatable list is unknown.",
        scope=_A,
        attributes=("hw.allocation.resource",),
    ),
    MetricSpec(
        "hw.allocated.devices",
        U,
        "{device}",
        "Device IDs held by containers (List), by resource.",
        scope=_A,
        attributes=("hw.allocation.resource",),
    ),
    MetricSpec(
        "hw.device.allocatable",
        G,
        "",
        "1 when the kubelet lists the device as allocatable for `hw_allocation_resource` "
        "(GetAllocatableResources: its device plugin reports it healthy); 0 when it listed "
        "it before, or a container holds it, and does not list it now while it lists other "
        "devices of the resource: the plugin reported it unhealthy. No series for devices "
        "of no known resource (a MIG-mode parent) nor while the kubelet lists no device of "
        "the resource at all (its plugin is not registered: "
        "`hw_allocation_resource_registered` is 0).",
        scope=_A,
        attributes=("hw.id", "hw.allocation.resource"),
    ),
    MetricSpec(
        "hw.not_allocatable.devices",
        U,
        "{device}",
        "Devices a source sees that the kubelet does not list as allocatable for their "
        "resource (`hw_device_allocatable == 0`), by resource: capacity lost to unhealthy "
        "devices.",
        scope=_A,
        attributes=("hw.allocation.resource",),
    ),
    MetricSpec(
        "hw.container.numa.node",
        G,
        "",
        "One series per NUMA node a container's devices (by resource), exclusive CPUs "
        "(`cpu`) or pinned memory (by type) sit on; always 1. Containers holding devices only.",
        scope=_A,
        attributes=(*HOLDER_ATTRIBUTES, "hw.numa.resource", "hw.numa_node"),
    ),
    MetricSpec(
        "hw.container.cpus.exclusive",
        U,
        "{cpu}",
        "CPUs the static CPU manager gave the container alone; 0: it runs on the shared pool. "
        "Containers holding devices only.",
        scope=_A,
        attributes=HOLDER_ATTRIBUTES,
    ),
    MetricSpec(
        "hw.container.numa.aligned",
        G,
        "",
        "1 when the NUMA nodes of the container's exclusive CPUs and of its pinned memory "
        "are each exactly those of its devices, 0 when not. No series when there is nothing "
        "to compare (devices without topology, shared-pool CPUs and no pinned memory).",
        scope=_A,
        attributes=HOLDER_ATTRIBUTES,
    ),
    MetricSpec(
        "hw.container.energy",
        C,
        "J",
        "Energy of the device apportioned to a container holding it: whole for an exclusive "
        "holder, by measured share on a shared device (process utilization, else the size of "
        "its slice, else equally); the series without pod labels has the device's energy "
        "while nobody held it. A device's series sum to its `hw_energy_joules_total` since "
        "the exporter started; a departed container's series stays 10 minutes "
        "(docs/attribution.md).",
        scope=_A,
        attributes=(*DEVICE_ATTRIBUTES[:4], *HOLDER_ATTRIBUTES),
        group="energy",
    ),
    MetricSpec(
        "hw.container.pcie.placement",
        G,
        "",
        "One series per GPU-NIC pair a container holds: how far apart they sit in the PCIe "
        "tree, 1 (PIX: one PCIe switch, GPUDirect RDMA at full speed) to 5 (SYS: across the "
        "CPU interconnect); `hw_pcie_placement` names the level. From sysfs "
        "(docs/placement.md). Containers holding both GPUs and NICs only.",
        scope=_A,
        attributes=(*HOLDER_ATTRIBUTES, "hw.gpu.id", "hw.network.id", "hw.pcie.placement"),
    ),
    MetricSpec(
        "hw.container.pcie.placement.best",
        G,
        "",
        "The container's closest GPU-NIC pair (the lowest `hw_container_pcie_placement`).",
        scope=_A,
        attributes=HOLDER_ATTRIBUTES,
    ),
    MetricSpec(
        "hw.container.pcie.placement.worst",
        G,
        "",
        "The container's worst-placed GPU, by its nearest NIC: the highest over its GPUs of "
        "the lowest `hw_container_pcie_placement` of that GPU; 5 (SYS): some GPU has no NIC "
        "on its side of the CPU interconnect.",
        scope=_A,
        attributes=HOLDER_ATTRIBUTES,
    ),
    # pod metadata (from the Kubernetes API, --kubernetes.api)
    MetricSpec(
        "k8s.pod.workload.info",
        G,
        "",
        "One series per pod holding a device, from the Kubernetes API (`--kubernetes.api`); "
        "always 1. Join device or allocation series to it on `k8s_node_name, "
        "k8s_namespace_name, k8s_pod_name` for the UID, workload and allowed labels.",
        scope=_P,
        attributes=(
            "k8s.namespace.name",
            "k8s.pod.name",
            "k8s.pod.uid",
            "k8s.replicaset.name",
            "k8s.deployment.name",
            "k8s.statefulset.name",
            "k8s.daemonset.name",
            "k8s.job.name",
            "k8s.cronjob.name",
            "k8s.workload.kind",
            "k8s.workload.name",
            "k8s.pod.label.<key>",
        ),
    ),
    # the exporter itself
    MetricSpec(
        "kube_device_exporter.build.info",
        G,
        "",
        "Build information; always 1.",
        scope=_E,
        attributes=("version", "python_version"),
    ),
    MetricSpec(
        "kube_device_exporter.source.success",
        G,
        "",
        "1 when the source's last collection succeeded.",
        scope=_E,
        attributes=("source",),
    ),
    MetricSpec(
        "kube_device_exporter.source.duration",
        G,
        "s",
        "How long the source's last collection took.",
        scope=_E,
        attributes=("source",),
    ),
    MetricSpec(
        "kube_device_exporter.source.field_errors",
        C,
        "{error}",
        "Fields a source skipped (unreadable, garbage, driver error).",
        scope=_E,
        attributes=("source",),
    ),
    MetricSpec(
        "kube_device_exporter.podresources.requests",
        C,
        "{request}",
        "PodResources calls by method and gRPC status code.",
        scope=_E,
        attributes=("method", "code"),
    ),
    MetricSpec(
        "kube_device_exporter.podresources.request.duration",
        G,
        "s",
        "Latency of the last PodResources call by method.",
        scope=_E,
        attributes=("method",),
    ),
    MetricSpec(
        "kube_device_exporter.podresources.up",
        G,
        "",
        "1 when the last List succeeded and the kubelet answered within the cycle's budget "
        "(0 while a slow kubelet's pod state is carried over).",
        scope=_E,
        attributes=("api_version",),
    ),
    MetricSpec(
        "kube_device_exporter.podresources.held",
        G,
        "",
        "1 while the exporter shows the last good answer of `method` instead of the kubelet's: "
        "a kubelet that restarted less than 5 s ago answered it empty (its restart window; "
        "docs/podresources.md). 0 otherwise.",
        scope=_E,
        attributes=("method",),
    ),
    MetricSpec(
        "kube_device_exporter.podresources.last_success_timestamp",
        G,
        "s",
        "Unix time of the last successful List.",
        scope=_E,
    ),
    MetricSpec(
        "kube_device_exporter.kubernetes.requests",
        C,
        "{request}",
        "Kubernetes API requests by verb, resource and HTTP status (`--kubernetes.api`).",
        scope=_E,
        attributes=("verb", "resource", "code"),
    ),
    MetricSpec(
        "kube_device_exporter.kubernetes.up",
        G,
        "",
        "1 while the pod cache is in sync with its feed (`--kubernetes.api`): the last list "
        "or watch was answered and its answer usable; 0 while the cache is stale (the feed "
        "failing, or its answers refused: `kube_device_exporter_peer_answers_refused_total`).",
        scope=_E,
    ),
    MetricSpec(
        "kube_device_exporter.kubernetes.pods",
        G,
        "{pod}",
        "Pods of this node in the Kubernetes API cache (`--kubernetes.api`).",
        scope=_E,
    ),
    MetricSpec(
        "kube_device_exporter.kubernetes.pods.source",
        G,
        "",
        "1 for where the pod cache comes from (`--kubernetes.api`): `kubernetes-api` (the API "
        "server's pod watch) or `kubelet-pods-api` (the kubelet's Pods API, KEP-4188).",
        scope=_E,
        attributes=("source",),
    ),
    MetricSpec(
        "kube_device_exporter.peer.answers.refused",
        C,
        "{answer}",
        "Answers of a peer dropped at the exporter's decode boundary, the last good state "
        "kept: `reason` `decode` (not the shape or encoding the API has), or the bound it "
        "passed: `bytes`, `pages`, `objects`, `time` (docs/reliability.md). A series appears "
        "at its first refusal.",
        scope=_E,
        attributes=("peer", "request", "reason"),
    ),
    MetricSpec(
        "kube_device_exporter.dra.unidentified",
        G,
        "{device}",
        "DRA devices containers hold that no source device could be joined to (their "
        "`hw_allocation_info` has an empty `hw_id`); each set is named once in the log.",
        scope=_E,
    ),
    MetricSpec(
        "kube_device_exporter.dra.slices.up",
        G,
        "",
        "1 while the ResourceSlice cache of this node is in sync with the API server "
        "(`--kubernetes.dra`); 0 while it is stale.",
        scope=_E,
    ),
    MetricSpec(
        "kube_device_exporter.dra.claims.up",
        G,
        "",
        "1 while the last read of a ResourceClaim PodResources lists worked "
        "(`--kubernetes.dra`; a `get` per claim, docs/dra.md).",
        scope=_E,
    ),
    MetricSpec(
        "kube_device_exporter.cycle.duration",
        G,
        "s",
        "How long the last completed cycle took, from its start to the sinks holding the new "
        "snapshot (the first cycle reports itself up to the join). The /metrics body is built "
        "after it is taken (at the cycle's end, for the scrapes due before the next), so "
        "building it is not in it.",
        scope=_E,
    ),
    MetricSpec("kube_device_exporter.cycles", C, "{cycle}", "Collection cycles run.", scope=_E),
    MetricSpec(
        "kube_device_exporter.cycle.step.failures",
        C,
        "{failure}",
        "Times a step of the cycle raised (`step`: `collect`, `join`, `snapshot`, "
        "`attribution`, `placement`, `energy`, a sink such as `prometheus`...): the cycle goes "
        "on without it, and when `collect` or a build step fails /metrics keeps the last good "
        "snapshot (docs/architecture.md). A step's series appears at its first failure.",
        scope=_E,
        attributes=("step",),
    ),
    MetricSpec(
        "kube_device_exporter.attribution.enabled",
        G,
        "",
        "1 when processes were attributed to containers this cycle (the host's /proc and the "
        "container-log directory readable); 0 when attribution is off (the log says why).",
        scope=_E,
    ),
    MetricSpec(
        "kube_device_exporter.cycle.last_success_timestamp",
        G,
        "s",
        "Unix time the last cycle finished.",
        scope=_E,
    ),
    MetricSpec(
        "kube_device_exporter.devices.unseen",
        G,
        "{device}",
        "Devices the kubelet lists as allocatable for a resource that no source can see "
        "(the pod lacks the vendor library, driver mounts or runtime class).",
        scope=_E,
        attributes=("hw.allocation.resource",),
    ),
    MetricSpec(
        "kube_device_exporter.series",
        G,
        "{series}",
        "Series in the last rendered /metrics output.",
        scope=_E,
    ),
    MetricSpec(
        "kube_device_exporter.series.limit",
        G,
        "{series}",
        "The series budget per node (`--metrics.max-series`): past it, per-holder series "
        "are left out, whole containers at a time (docs/reliability.md).",
        scope=_E,
    ),
    MetricSpec(
        "kube_device_exporter.series.dropped",
        G,
        "{series}",
        "Series the budget left out of the last snapshot (0 while under it).",
        scope=_E,
    ),
    MetricSpec(
        "kube_device_exporter.metric_group.enabled",
        G,
        "",
        "1 for each metric group exported, 0 for each one off (`--metrics.group.NAME`).",
        scope=_E,
        attributes=("group",),
    ),
    MetricSpec(
        "kube_device_exporter.podresources.invalid_device_ids",
        C,
        "{id}",
        "Device IDs from PodResources that were empty or malformed (control characters, over "
        "1024 bytes) and were skipped.",
        scope=_E,
    ),
    MetricSpec(
        "kube_device_exporter.http.connections",
        G,
        "{connection}",
        "Open HTTP connections.",
        scope=_E,
    ),
    MetricSpec(
        "kube_device_exporter.http.connections.closed",
        C,
        "{connection}",
        "HTTP connections the exporter closed or refused to protect itself, by reason.",
        scope=_E,
        attributes=("reason",),
    ),
    MetricSpec(
        "kube_device_exporter.http.requests.rejected",
        C,
        "{request}",
        "HTTP requests rejected: malformed, or without valid credentials.",
        scope=_E,
        attributes=("reason",),
    ),
    MetricSpec(
        "kube_device_exporter.http.accept_errors",
        C,
        "{error}",
        "Failed accept() calls (file descriptors or memory exhausted).",
        scope=_E,
    ),
    MetricSpec(
        "kube_device_exporter.web_config.reloads",
        C,
        "{reload}",
        "Re-reads of --web.config.file after it (or a certificate it names) changed, by result; "
        "a failed one keeps the previous config.",
        scope=_E,
        attributes=("result",),
    ),
    MetricSpec(
        "kube_device_exporter.web_config.last_reload_successful",
        G,
        "",
        "1 when the last read of --web.config.file was used; 0 while it is empty, missing, "
        "invalid or would turn TLS or basic auth off, and the last good config is kept.",
        scope=_E,
    ),
    MetricSpec(
        "kube_device_exporter.export.batches",
        C,
        "{batch}",
        "Export attempts by sink and result.",
        scope=_E,
        attributes=("sink", "result"),
    ),
    MetricSpec(
        "kube_device_exporter.device.events",
        C,
        "{event}",
        "Device events (XIDs, uncorrectable ECC errors, failed devices, failed row remaps, "
        "links down) published as OTLP log records or Kubernetes Events, by class "
        "(docs/events.md).",
        scope=_E,
        attributes=("hw.event.class",),
    ),
    MetricSpec(
        "kube_device_exporter.kubernetes.events",
        C,
        "{event}",
        "Kubernetes Events about pods hit by device events (`--kubernetes.events`), by "
        "result: `created`; held back as the kubelet's recorder does, `deduplicated` (same "
        "pod, device and code within 10 minutes) or `rate_limited` (over 25 per pod, one more "
        "every 5 minutes); `dropped` (over 1000 waiting), `failed` (the API server refused).",
        scope=_E,
        attributes=("result",),
    ),
    MetricSpec(
        "kube_device_exporter.export.rejected",
        C,
        "{data_point}",
        "Data points a receiver rejected in exports it otherwise accepted (OTLP partial success).",
        scope=_E,
        attributes=("sink",),
    ),
)

SPECS: dict[str, MetricSpec] = {spec.name: spec for spec in SPECS_LIST}


def spec(name: str) -> MetricSpec:
    """The spec for `name`; a KeyError names the unknown metric."""
    return SPECS[name]
