"""The flag table: every exporter flag's group, name, destination, value type, default and help.

Data only, with the --help texts of the other commands. `flags.py` builds the parser and
the Config from it, `flagdoc.py` writes the README's flag table from it; each flag is also
`KDE_<NAME>` in the environment. Source flags (`--collector.*`) are not here: the source
registry makes them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from exporter.config import DEFAULT_SOCKET
from exporter.join import DEFAULT_RESOURCE_PATTERNS
from exporter.metrics import SCHEMAS
from exporter.values import (
    boolean,
    choice,
    choices,
    duration,
    listen_address,
    positive_int,
    regex,
    size_bytes,
)

OTLP_PROTOCOLS = ("grpc", "http/protobuf")

FLAGS: list[tuple[str, str, str, Callable[[str], Any], str, str]] = [
    # (group, flag, dest, type, default text, help)
    (
        "kubelet",
        "--kubelet-socket",
        "kubelet_socket",
        Path,
        str(DEFAULT_SOCKET),
        "PodResources socket (mount its directory, not the file, so kubelet restarts are seen)",
    ),
    (
        "kubelet",
        "--kubernetes.resource-pattern",
        "resource_patterns",
        str,
        "",
        "extended-resource name pattern to attribute (glob; repeatable; replaces the defaults: "
        + ", ".join(DEFAULT_RESOURCE_PATTERNS)
        + ")",
    ),
    (
        "kubelet",
        "--kubernetes.timeout",
        "podresources_timeout",
        duration,
        "5s",
        "deadline of each PodResources call",
    ),
    (
        "kubelet",
        "--kubernetes.max-message-size",
        "podresources_max_message_bytes",
        size_bytes,
        "256MiB",
        "largest PodResources answer accepted (gRPC's default 4MiB breaks busy nodes)",
    ),
    (
        "kubelet",
        "--kubernetes.stale-after",
        "podresources_stale_after",
        duration,
        "5m",
        "keep the last good PodResources answer this long while the kubelet fails",
    ),
    (
        "kubeapi",
        "--kubernetes.api",
        "kubernetes_api",
        boolean,
        "off",
        "watch this node's pods on the API server for pod UIDs, workloads and allowed labels "
        "(k8s_pod_workload_info); needs the kubernetes-api RBAC (deploy/components/kubernetes-api)",
    ),
    (
        "kubeapi",
        "--kubernetes.events",
        "kubernetes_events",
        boolean,
        "off",
        "create a Kubernetes Event on each pod a device event (XID, ECC error, failed device, "
        "link down) hits, deduplicated and rate-limited as the kubelet does; needs create on "
        "events (deploy/components/kubernetes-events)",
    ),
    (
        "kubeapi",
        "--kubernetes.kubeconfig",
        "kubeconfig",
        Path,
        "in-cluster: the pod's ServiceAccount",
        "kubeconfig for --kubernetes.api and --kubernetes.events (development outside a cluster)",
    ),
    (
        "kubeapi",
        "--kubernetes.pod-labels",
        "pod_label_patterns",
        regex,
        "none",
        "pod label keys to export as k8s_pod_label_<key>: a regex matching the whole key "
        "(repeatable; the environment variable holds one regex)",
    ),
    (
        "web",
        "--web.listen-address",
        "listen_address",
        listen_address,
        ":9405",
        "HOST:PORT for /metrics, /healthz, /readyz and the landing page; 'none' for no server",
    ),
    (
        "web",
        "--web.config.file",
        "web_config_file",
        Path,
        "none",
        "exporter-toolkit web config: TLS (tls_server_config), basic auth (basic_auth_users), "
        "headers; re-read when it changes (docs/security.md)",
    ),
    (
        "web",
        "--web.max-connections",
        "web_max_connections",
        positive_int,
        "512",
        "open HTTP connections at most; at the cap the longest-idle one is closed",
    ),
    (
        "collection",
        "--collect-interval",
        "collect_interval",
        duration,
        "10s",
        "how often to read devices and the kubelet (scrapes only read the last result)",
    ),
    (
        "collection",
        "--collect-timeout",
        "collect_timeout",
        duration,
        "5s",
        "a source slower than this is reported failed for the cycle",
    ),
    (
        "collection",
        "--node-name",
        "node_name",
        str,
        "$NODE_NAME",
        "node label value (set NODE_NAME from the downward API; the hostname of a pod is its name)",
    ),
    ("collection", "--path.sysfs", "sysfs", Path, "/sys", "sysfs mount point"),
    ("collection", "--path.procfs", "procfs", Path, "/proc", "procfs mount point"),
    (
        "collection",
        "--path.container-logs",
        "container_logs",
        Path,
        "/var/log/containers",
        "the kubelet's container-log symlinks: their names map container IDs to pods "
        "(process attribution; only the names are read)",
    ),
    (
        "collection",
        "--attribution.process-series",
        "process_series",
        boolean,
        "false",
        "also export one series per process (hw_gpu_process_*, bare host PIDs: one series per "
        "process, high cardinality)",
    ),
    (
        "collection",
        "--metrics.schema",
        "metrics_schema",
        choices(*SCHEMAS),
        "native",
        "metric names and labels on /metrics: native (OpenTelemetry-derived), dcgm "
        "(dcgm-exporter's DCGM_FI_* names, units and labels), or native,dcgm while migrating "
        "(docs/migrating-from-dcgm-exporter.md); OTLP always sends native",
    ),
    (
        "otlp",
        "--otlp.endpoint",
        "otlp_endpoint",
        str,
        "$OTEL_EXPORTER_OTLP_ENDPOINT",
        "push metrics to this OTLP collector, a base URL (OTLP/HTTP appends /v1/metrics; "
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is used as given); empty: no push",
    ),
    (
        "otlp",
        "--otlp.protocol",
        "otlp_protocol",
        choice(*OTLP_PROTOCOLS),
        "$OTEL_EXPORTER_OTLP_PROTOCOL or grpc",
        "OTLP transport",
    ),
    (
        "logging",
        "--log.level",
        "log_level",
        choice("debug", "info", "warning", "error"),
        "info",
        "log level",
    ),
    ("logging", "--log.format", "log_format", choice("text", "json"), "text", "log format"),
]

GROUP_TITLES = {
    "kubelet": "kubelet (PodResources)",
    "kubeapi": "Kubernetes API (optional)",
    "web": "web",
    "collection": "collection",
    "collectors": "collectors (sources)",
    "otlp": "OTLP push (also the standard OTEL_* variables)",
    "logging": "logging",
}


FLAG_METAVARS = {
    "kubelet_socket": "PATH",
    "resource_patterns": "GLOB[,GLOB...]",
    "listen_address": "HOST:PORT",
    "node_name": "NAME",
    "sysfs": "PATH",
    "procfs": "PATH",
    "container_logs": "PATH",
    "web_config_file": "FILE",
    "kubeconfig": "FILE",
    "pod_label_patterns": "REGEX",
    "otlp_endpoint": "URL",
    "otlp_protocol": "grpc|http/protobuf",
    "log_level": "debug|info|warning|error",
    "log_format": "text|json",
    "metrics_schema": "native|dcgm|native,dcgm",
}
"""What --help shows in place of a value; otherwise the value type's METAVARS entry."""

COMMANDS = (
    ("simulate SCENARIO [FLAGS]", "run a simulated node and the exporter on it (the demo)"),
    ("podresources [--pod NS/NAME]", "print what the kubelet reports: device IDs, resources"),
    ("doctor [FLAGS]", "why are my metrics missing? checks the kubelet, each source, /proc"),
)


DOCTOR = (
    "Why are my metrics missing? Asks the kubelet once, runs each enabled source once, looks "
    "at the host /sys and /proc, and compares what the node advertises with what the sources "
    "see: one line per check, the likely cause and the fix for each problem; exit 1 when "
    "there is one. Run it in the exporter's pod with the exporter's flags."
)
