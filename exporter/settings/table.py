"""The settings table: every exporter flag's group, name, destination, value type, typed
default and help, declared once.

Each row is a flag and a `KDE_<NAME>` variable. `default` is the default as --help and the
README say it; the typed value (`Flag.value`) is that text parsed by the row's own value
type, or given beside it where the text only describes it (`$NODE_NAME`). `Config`
(config.py) takes its field defaults from here, `exporter.cli` builds the parser from it,
`monitoring/flagdoc.py` the README's table. Source options (`--collector.NAME.OPTION`) are
rows of the same kind declared by each source (`exporter.sources.SourceOption`); the metric
groups (`--metrics.group.NAME`) are `GROUPS` below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exporter.settings.values import (
    boolean,
    choice,
    choices,
    duration,
    file_path,
    listen_address,
    positive_int,
    regex,
    size_bytes,
)

DEFAULT_RESOURCE_PATTERNS = (
    "nvidia.com/*",
    "*.shared",
    "amd.com/*",
    "gpu.intel.com/*",
    "rdma/*",
    "intel.com/*",
    "mellanox.com/*",
    "openshift.io/*",
)
"""nvidia.com/gpu and nvidia.com/mig-* (and renames), AMD, Intel GPUs, the RDMA shared-device
plugin and the SR-IOV network device plugin's default prefixes."""

SCHEMAS = ("native", "dcgm")
"""`--metrics.schema`: the metric table's names, dcgm-exporter's (`exporter/sinks/dcgm.py`),
or both."""

OTLP_PROTOCOLS = ("grpc", "http/protobuf")

_PARSED: Any = object()
"""`Flag.value` not given: the default text parsed by the row's value type."""


@dataclass(frozen=True, slots=True)
class Flag:
    """One exporter flag (`KDE_<NAME>` in the environment too), as source options are
    (`sources.SourceOption`)."""

    group: str
    """Its --help section: a key of GROUP_TITLES."""
    flag: str
    dest: str
    """The Config field it sets."""
    parse: Callable[[str], Any]
    """Its value type (`exporter.settings.values`): text -> value, or a ValueError for the
    user."""
    default: str
    """The default as --help and the README say it."""
    help: str
    metavar: str = ""
    """What --help shows in place of a value; empty: the value type's METAVARS entry."""
    repeatable: bool = False
    """Given several times, the values add up (the variable holds one, or a list)."""
    value: Any = field(default=_PARSED)
    """The typed default: `parse(default)` unless given (where `default` only describes it:
    `$NODE_NAME`, `none`)."""

    def __post_init__(self) -> None:
        if self.value is _PARSED:
            object.__setattr__(self, "value", self.parse(self.default))


FLAGS: tuple[Flag, ...] = (
    Flag(
        "kubelet",
        "--kubelet-socket",
        "kubelet_socket",
        Path,
        "/var/lib/kubelet/pod-resources/kubelet.sock",
        "PodResources socket (mount its directory, not the file, so kubelet restarts are seen)",
        metavar="PATH",
    ),
    Flag(
        "kubelet",
        "--kubernetes.resource-pattern",
        "resource_patterns",
        str,
        "",
        "extended-resource name pattern to attribute (glob; repeatable; replaces the defaults: "
        + ", ".join(DEFAULT_RESOURCE_PATTERNS)
        + ")",
        metavar="GLOB[,GLOB...]",
        repeatable=True,
        value=DEFAULT_RESOURCE_PATTERNS,
    ),
    Flag(
        "kubelet",
        "--kubernetes.timeout",
        "podresources_timeout",
        duration,
        "5s",
        "deadline of each PodResources call",
    ),
    Flag(
        "kubelet",
        "--kubernetes.max-message-size",
        "podresources_max_message_bytes",
        size_bytes,
        "8MiB",
        "largest PodResources answer accepted (gRPC's default 4MiB breaks busy nodes; the "
        "memory limit is sized for this: raise both together, docs/reliability.md)",
    ),
    Flag(
        "kubelet",
        "--kubernetes.poll-interval",
        "podresources_poll_interval",
        duration,
        "30s",
        "ask the kubelet at least this often (every cycle when the collect interval is longer), "
        "and at once when the devices or their processes change, when its socket is a new "
        "one (a restart), and with --kubernetes.api when a pod starts, changes or leaves (at "
        "most every 5s); without a pod feed, a pod running nothing on its devices is labelled, "
        "or unlabelled, up to this late",
    ),
    Flag(
        "kubelet",
        "--kubernetes.stale-after",
        "podresources_stale_after",
        duration,
        "5m",
        "keep the last good PodResources answer this long while the kubelet fails",
    ),
    Flag(
        "kubeapi",
        "--kubernetes.api",
        "kubernetes_api",
        boolean,
        "off",
        "watch this node's pods on the API server for pod UIDs, workloads and allowed labels "
        "(k8s_pod_workload_info); needs the kubernetes-api RBAC (deploy/components/kubernetes-api)",
    ),
    Flag(
        "kubeapi",
        "--kubernetes.dra",
        "kubernetes_dra",
        boolean,
        "off",
        "with --kubernetes.api, also watch this node's ResourceSlices (and DeviceTaintRules) to "
        "identify DRA devices, export their taints and free capacity; needs the dra RBAC "
        "(deploy/components/dra)",
    ),
    Flag(
        "kubeapi",
        "--kubernetes.events",
        "kubernetes_events",
        boolean,
        "off",
        "create a Kubernetes Event on each pod a device event (XID, ECC error, failed device, "
        "link down) hits, deduplicated and rate-limited as the kubelet does; needs create on "
        "events (deploy/components/kubernetes-events)",
    ),
    Flag(
        "kubeapi",
        "--kubernetes.kubeconfig",
        "kubeconfig",
        Path,
        "in-cluster: the pod's ServiceAccount",
        "kubeconfig for --kubernetes.api and --kubernetes.events (development outside a cluster)",
        metavar="FILE",
        value=None,
    ),
    Flag(
        "kubeapi",
        "--kubernetes.pods-api-socket",
        "pods_api_socket",
        file_path,
        "/var/lib/kubelet/pods-api/pods-api.sock",
        "with --kubernetes.api, read this node's pods from the kubelet's Pods API (KEP-4188, "
        "gate PodsAPI) when this socket exists at start, not from an API server pod watch; "
        "empty: always the API server",
        metavar="PATH",
    ),
    Flag(
        "kubeapi",
        "--kubernetes.max-pods",
        "kubernetes_max_pods",
        positive_int,
        "2500",
        "with --kubernetes.api, pods of this node the exporter keeps; a list or watch that "
        "names more is refused (one warning, the last good pods kept). A node runs at most "
        "its kubelet's maxPods (default 110; AKS allows 250, GKE 256, EKS up to 737 on GPU "
        "instances and 1,514 on the largest), plus finished pods not yet deleted",
    ),
    Flag(
        "kubeapi",
        "--kubernetes.max-resource-slices",
        "kubernetes_max_resource_slices",
        positive_int,
        "128",
        "with --kubernetes.dra, ResourceSlices of this node the exporter keeps (each holds at "
        "most 128 devices); a list or watch that names more is refused like --kubernetes.max-pods",
    ),
    Flag(
        "kubeapi",
        "--kubernetes.pod-labels",
        "pod_label_patterns",
        regex,
        "none",
        "pod label keys to export as k8s_pod_label_<key>: a regex matching the whole key "
        "(repeatable; the environment variable holds one regex)",
        metavar="REGEX",
        repeatable=True,
        value=(),
    ),
    Flag(
        "web",
        "--web.listen-address",
        "listen_address",
        listen_address,
        ":9405",
        "HOST:PORT for /metrics, /healthz, /readyz and the landing page; 'none' for no server",
        metavar="HOST:PORT",
    ),
    Flag(
        "web",
        "--web.config.file",
        "web_config_file",
        Path,
        "none",
        "exporter-toolkit web config: TLS (tls_server_config), basic auth (basic_auth_users), "
        "headers; re-read when it changes (docs/security.md)",
        metavar="FILE",
        value=None,
    ),
    Flag(
        "web",
        "--web.max-connections",
        "web_max_connections",
        positive_int,
        "512",
        "open HTTP connections at most; at the cap the longest-idle one is closed",
    ),
    Flag(
        "collection",
        "--collect-interval",
        "collect_interval",
        duration,
        "10s",
        "how often to read devices and the kubelet (scrapes only read the last result)",
    ),
    Flag(
        "collection",
        "--collect-timeout",
        "collect_timeout",
        duration,
        "5s",
        "a source slower than this is reported failed for the cycle",
    ),
    Flag(
        "collection",
        "--node-name",
        "node_name",
        str,
        "$NODE_NAME",
        "node label value (set NODE_NAME from the downward API; the hostname of a pod is its name)",
        metavar="NAME",
        value="",
    ),
    Flag("collection", "--path.sysfs", "sysfs", Path, "/sys", "sysfs mount point", metavar="PATH"),
    Flag(
        "collection", "--path.procfs", "procfs", Path, "/proc", "procfs mount point", metavar="PATH"
    ),
    Flag(
        "collection",
        "--path.container-logs",
        "container_logs",
        Path,
        "/var/log/containers",
        "the kubelet's container-log symlinks: their names map container IDs to pods "
        "(process attribution; only the names are read)",
        metavar="PATH",
    ),
    Flag(
        "collection",
        "--attribution.process-series",
        "process_series",
        boolean,
        "false",
        "also export one series per process (hw_gpu_process_*, bare host PIDs: one series per "
        "process, high cardinality)",
    ),
    Flag(
        "collection",
        "--metrics.schema",
        "metrics_schema",
        choices(*SCHEMAS),
        "native",
        "metric names and labels on /metrics: native (OpenTelemetry-derived), dcgm "
        "(dcgm-exporter's DCGM_FI_* names, units and labels; turns on the metric groups its "
        "default counters need unless --metrics.group.NAME says otherwise), or native,dcgm "
        "while migrating (docs/migrating-from-dcgm-exporter.md); OTLP always sends native",
        metavar="native|dcgm|native,dcgm",
    ),
    Flag(
        "collection",
        "--metrics.max-series",
        "metrics_max_series",
        positive_int,
        "10000",
        "series budget per node: past it, per-holder series are left out, whole containers "
        "at a time, and logged (docs/reliability.md); sized with the memory limit",
    ),
    Flag(
        "otlp",
        "--otlp.endpoint",
        "otlp_endpoint",
        str,
        "$OTEL_EXPORTER_OTLP_ENDPOINT",
        "push metrics to this OTLP collector, a base URL (OTLP/HTTP appends /v1/metrics; "
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is used as given); empty: no push",
        metavar="URL",
        value="",
    ),
    Flag(
        "otlp",
        "--otlp.protocol",
        "otlp_protocol",
        choice(*OTLP_PROTOCOLS),
        "$OTEL_EXPORTER_OTLP_PROTOCOL or grpc",
        "OTLP transport",
        metavar="grpc|http/protobuf",
        value="grpc",
    ),
    Flag(
        "logging",
        "--log.level",
        "log_level",
        choice("debug", "info", "warning", "error"),
        "info",
        "log level",
        metavar="debug|info|warning|error",
    ),
    Flag(
        "logging",
        "--log.format",
        "log_format",
        choice("text", "json"),
        "text",
        "log format",
        metavar="text|json",
    ),
)

GROUP_TITLES = {
    "kubelet": "kubelet (PodResources)",
    "kubeapi": "Kubernetes API (optional)",
    "web": "web",
    "collection": "collection",
    "collectors": "collectors (sources)",
    "metrics": "metric groups (docs/metrics.md)",
    "otlp": "OTLP push (also the standard OTEL_* variables)",
    "logging": "logging",
}


@dataclass(frozen=True, slots=True)
class MetricGroup:
    """A set of series that is on or off as one (`--metrics.group.NAME`), as node_exporter's
    collectors and dcgm-exporter's counter files are: the default answers the first
    questions at about dcgm-exporter's default series per GPU; the rest is one flag away."""

    name: str
    help: str
    default: bool = False


CORE = "core"

GROUPS: tuple[MetricGroup, ...] = (
    MetricGroup(
        CORE,
        "identity, status, utilization, memory used and size, power and energy, GPU "
        "temperature, uncorrected ECC and XID errors, row-remap state, the throttle reasons "
        "the alerts read, who holds what, per-container use, the exporter's own health",
        default=True,
    ),
    MetricGroup(
        "clocks",
        "clock frequencies, the throttle reasons no alert reads (gpu_idle, "
        "applications_clocks_setting, sync_boost, display_clock_setting), the power limit",
    ),
    MetricGroup(
        "interconnect",
        "PCIe and NVLink traffic, PCIe replays and NVLink errors",
    ),
    MetricGroup(
        "memory",
        "memory detail: free and reserved, AMD CPU-visible and GTT, remapped rows by "
        "cause, corrected and deferred ECC errors, memory temperature",
    ),
    MetricGroup("media", "encoder and decoder utilization"),
    MetricGroup(
        "profiling",
        "NVIDIA GPM profiling metrics (SM and tensor activity, Hopper and later)",
    ),
    MetricGroup(
        "energy",
        "energy per container, each device's energy counter apportioned to its holders "
        "(one series per holder of every device: docs/attribution.md)",
    ),
)
"""Every metric group (the metric table tags each series with one); `core` cannot be turned
off."""

GROUP_NAMES = tuple(g.name for g in GROUPS)
DEFAULT_GROUPS = frozenset(g.name for g in GROUPS if g.default)

BY_DEST = {row.dest: row for row in FLAGS}


def default_of(dest: str) -> Any:
    """The typed default of the flag that sets Config field `dest`."""
    return BY_DEST[dest].value
