"""The frozen configuration: parsed once by `exporter.cli`, read everywhere else.

Every field a flag sets takes its default from that flag's row (`table.default_of`), so a
default is written once; `DEFAULTS` is the configuration of a run given no flag, which
components read for the defaults of their own parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from exporter.settings.table import DEFAULT_GROUPS, default_of


@dataclass(frozen=True, slots=True)
class OtlpConfig:
    endpoint: str = default_of("otlp_endpoint")
    """Empty: no OTLP push."""
    protocol: str = default_of("otlp_protocol")
    signal_endpoint: bool = False
    """The endpoint came from OTEL_EXPORTER_OTLP_METRICS_ENDPOINT: a full URL, used as given.
    Otherwise it is a base URL and OTLP/HTTP appends `/v1/metrics` (as the SDK does)."""


@dataclass(frozen=True, slots=True)
class Config:
    kubelet_socket: Path = default_of("kubelet_socket")
    listen_address: tuple[str, int] | None = default_of("listen_address")
    """None: no HTTP server (OTLP-only)."""
    collect_interval: float = default_of("collect_interval")
    collect_timeout: float = default_of("collect_timeout")
    node_name: str = default_of("node_name")
    sysfs: Path = default_of("sysfs")
    procfs: Path = default_of("procfs")
    container_logs: Path = default_of("container_logs")
    process_series: bool = default_of("process_series")
    metrics_schema: tuple[str, ...] = default_of("metrics_schema")
    """Names on /metrics: `native`, `dcgm` (dcgm-exporter's), or both during a migration."""
    metric_groups: frozenset[str] = DEFAULT_GROUPS
    """Metric groups exported (`--metrics.group.NAME`; `core` always)."""
    metrics_max_series: int = default_of("metrics_max_series")
    """The series budget per node (exporter/derive/budget.py)."""
    log_level: str = default_of("log_level")
    log_format: str = default_of("log_format")
    collectors: frozenset[str] = frozenset()
    source_options: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """Source -> the options given for it, as text (each source parses them with its own
    declared options, `exporter.sources.option_values`)."""
    resource_patterns: tuple[str, ...] = default_of("resource_patterns")
    podresources_timeout: float = default_of("podresources_timeout")
    podresources_max_message_bytes: int = default_of("podresources_max_message_bytes")
    """The memory limit is sized for it (docs/reliability.md)."""
    podresources_poll_interval: float = default_of("podresources_poll_interval")
    """The kubelet is asked at least this often (exporter/podresources/schedule.py)."""
    podresources_stale_after: float = default_of("podresources_stale_after")
    otlp: OtlpConfig = field(default_factory=OtlpConfig)
    web_config_file: Path | None = default_of("web_config_file")
    """exporter-toolkit web config (TLS, basic auth, headers); None: plain HTTP, no auth."""
    web_max_connections: int = default_of("web_max_connections")
    kubernetes_api: bool = default_of("kubernetes_api")
    """Watch this node's pods on the API server for UIDs, workloads and labels."""
    kubernetes_dra: bool = default_of("kubernetes_dra")
    """Also watch this node's ResourceSlices (DRA identity, taints, free capacity)."""
    kubernetes_events: bool = default_of("kubernetes_events")
    """Create a Kubernetes Event on each pod a device event hits (exporter/sinks/k8sevents.py)."""
    kubeconfig: Path | None = default_of("kubeconfig")
    """None: in-cluster configuration (the pod's ServiceAccount)."""
    pods_api_socket: str = default_of("pods_api_socket")
    """The kubelet Pods API socket, used for the pod cache when it exists at start; empty: never."""
    pod_label_patterns: tuple[str, ...] = default_of("pod_label_patterns")
    """Regexes; pod label keys matching one in full go onto k8s.pod.workload.info."""
    kubernetes_max_pods: int = default_of("kubernetes_max_pods")
    """Pods the pod cache may hold: a bigger answer is refused (kubeapi/answers.py)."""
    kubernetes_max_resource_slices: int = default_of("kubernetes_max_resource_slices")
    """ResourceSlices the slice cache may hold, likewise."""
    notices: tuple[str, ...] = ()
    """Warnings found while parsing (an unknown `KDE_*` variable), logged once logging is set."""


DEFAULTS = Config()
"""A run given no flag and no variable (the node name aside)."""
