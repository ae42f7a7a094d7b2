"""The frozen configuration: parsed once by `flags.py`, read everywhere else."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from exporter.ids import DEFAULT_RESOURCE_PATTERNS
from exporter.metrics import DEFAULT_GROUPS, DEFAULT_MAX_SERIES

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
DEFAULT_LISTEN = ("", 9405)


@dataclass(frozen=True, slots=True)
class OtlpConfig:
    endpoint: str = ""
    """Empty: no OTLP push."""
    protocol: str = "grpc"
    signal_endpoint: bool = False
    """The endpoint came from OTEL_EXPORTER_OTLP_METRICS_ENDPOINT: a full URL, used as given.
    Otherwise it is a base URL and OTLP/HTTP appends `/v1/metrics` (as the SDK does)."""


@dataclass(frozen=True, slots=True)
class Config:
    kubelet_socket: Path = DEFAULT_SOCKET
    listen_address: tuple[str, int] | None = DEFAULT_LISTEN
    """None: no HTTP server (OTLP-only)."""
    collect_interval: float = 10.0
    collect_timeout: float = 5.0
    node_name: str = ""
    sysfs: Path = Path("/sys")
    procfs: Path = Path("/proc")
    container_logs: Path = Path("/var/log/containers")
    process_series: bool = False
    metrics_schema: tuple[str, ...] = ("native",)
    """Names on /metrics: `native`, `dcgm` (dcgm-exporter's), or both during a migration."""
    metric_groups: frozenset[str] = DEFAULT_GROUPS
    """Metric groups exported (`--metrics.group.NAME`; `core` always)."""
    metrics_max_series: int = DEFAULT_MAX_SERIES
    """The series budget per node (exporter/budget.py)."""
    log_level: str = "info"
    log_format: str = "text"
    collectors: frozenset[str] = frozenset()
    source_options: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    resource_patterns: tuple[str, ...] = DEFAULT_RESOURCE_PATTERNS
    podresources_timeout: float = 5.0
    podresources_max_message_bytes: int = 8 * 1024 * 1024
    """1.7x the largest List seen on a real node; the memory limit is sized for it."""
    podresources_poll_interval: float = 30.0
    """The kubelet is asked at most this often (exporter/podresources/schedule.py)."""
    podresources_stale_after: float = 300.0
    otlp: OtlpConfig = field(default_factory=OtlpConfig)
    web_config_file: Path | None = None
    """exporter-toolkit web config (TLS, basic auth, headers); None: plain HTTP, no auth."""
    web_max_connections: int = 512
    kubernetes_api: bool = False
    """Watch this node's pods on the API server for UIDs, workloads and labels."""
    kubernetes_dra: bool = False
    """Also watch this node's ResourceSlices (DRA identity, taints, free capacity)."""
    kubernetes_events: bool = False
    """Create a Kubernetes Event on each pod a device event hits (exporter/k8sevents.py)."""
    kubeconfig: Path | None = None
    """None: in-cluster configuration (the pod's ServiceAccount)."""
    pods_api_socket: str = "/var/lib/kubelet/pods-api/pods-api.sock"
    """The kubelet Pods API socket, used for the pod cache when it exists at start; empty: never."""
    pod_label_patterns: tuple[str, ...] = ()
    """Regexes; pod label keys matching one in full go onto k8s.pod.workload.info."""
    notices: tuple[str, ...] = ()
    """Warnings found while parsing (an unknown `KDE_*` variable), logged once logging is set."""
