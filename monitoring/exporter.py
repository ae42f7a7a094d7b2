"""The exporter's own health: targets, sources, the kubelet connection, cycles, output."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash

from monitoring.grafana import (
    BAD_IF_ANY,
    PanelBuilder,
    Q,
    stat_panel,
    state_panel,
    table_panel,
    timeseries_panel,
)
from monitoring.layout import new_dashboard, rows, variables
from monitoring.queries import CLUSTER, NODE, sel

UID = "kde-exporter"
JOB = f'{CLUSTER}, job=~"$job"'
RATE = "$__rate_interval"
NODE_LEGEND = "{{k8s_node_name}}"


TITLE = "Devices / Exporter health"
"""The dashboard's title: docs/runbooks.md names it (monitoring/runbooks.py)."""


def build() -> dash.Dashboard:
    board = new_dashboard(
        UID,
        TITLE,
        "kube-device-exporter itself: scrape targets, sources (collectors), the kubelet "
        "PodResources connection, the optional Kubernetes API watch, collection cycles and "
        "output size.",
    )
    board = variables(board, ("job", "node"))
    return rows(
        board,
        (
            ("Targets", _targets()),
            ("Sources", _sources()),
            ("Kubelet PodResources", _kubelet()),
            ("Kubernetes API (--kubernetes.api)", _kubeapi()),
            ("Cycles and output", _cycles()),
        ),
    )


def _targets() -> list[PanelBuilder]:
    return [
        stat_panel(
            "Targets up", "Exporter targets Prometheus scrapes successfully.", f"sum(up{{{JOB}}})"
        ),
        stat_panel(
            "Targets down",
            "Exporter targets whose last scrape failed.",
            f"count(up{{{JOB}}} == 0) or vector(0)",
            thresholds=BAD_IF_ANY,
        ),
        stat_panel(
            "Failing sources",
            "(node, source) pairs whose last collection failed.",
            f"count({sel('kube_device_exporter.source.success', NODE)} == 0) or vector(0)",
            thresholds=BAD_IF_ANY,
        ),
        stat_panel(
            "Kubelet unreachable",
            "Nodes whose exporter's last PodResources List failed.",
            f"count(max by (k8s.node.name) ({sel('kube_device_exporter.podresources.up', NODE)})"
            " == 0) or vector(0)",
            thresholds=BAD_IF_ANY,
        ),
        table_panel(
            "Versions",
            "Exporters per version.",
            [
                (
                    "Exporters",
                    f"count by (version, python_version)"
                    f" ({sel('kube_device_exporter.build.info', NODE)})",
                )
            ],
            span=8,
            height=4,
        ),
        timeseries_panel(
            "Scrape duration",
            "How long Prometheus takes to scrape each exporter.",
            [Q(f"scrape_duration_seconds{{{JOB}}}", "{{instance}}")],
            unit="s",
        ),
        timeseries_panel(
            "Series per exporter",
            "Series in each exporter's last /metrics output.",
            [
                Q(
                    f"max by (k8s.node.name) ({sel('kube_device_exporter.series', NODE)})",
                    NODE_LEGEND,
                )
            ],
        ),
    ]


def _sources() -> list[PanelBuilder]:
    return [
        state_panel(
            "Source success",
            "1 while the source's last collection succeeded.",
            [
                Q(
                    f"min by (k8s.node.name, source)"
                    f" ({sel('kube_device_exporter.source.success', NODE)})",
                    "{{k8s_node_name}} {{source}}",
                )
            ],
            states={"0": ("failing", "red"), "1": ("ok", "green")},
        ),
        timeseries_panel(
            "Source duration",
            "How long each source's last collection took (slowest node).",
            [
                Q(
                    f"max by (source) ({sel('kube_device_exporter.source.duration', NODE)})",
                    "{{source}}",
                )
            ],
            unit="s",
        ),
        timeseries_panel(
            "Skipped fields",
            "Fields per second a source could not read (unreadable file, driver error).",
            [
                Q(
                    f"sum by (k8s.node.name, source)"
                    f" (rate({sel('kube_device_exporter.source.field_errors', NODE)}[{RATE}]))",
                    "{{k8s_node_name}} {{source}}",
                )
            ],
            unit="ops",
        ),
    ]


def _kubeapi() -> list[PanelBuilder]:
    requests = sel("kube_device_exporter.kubernetes.requests", NODE)
    return [
        state_panel(
            "Pod watch",
            "1 while the exporter's watch of its node's pods is established, per node "
            "(only exporters run with --kubernetes.api).",
            [
                Q(
                    f"max by (k8s.node.name) ({sel('kube_device_exporter.kubernetes.up', NODE)})",
                    NODE_LEGEND,
                )
            ],
            states={"0": ("failing", "red"), "1": ("watching", "green")},
        ),
        timeseries_panel(
            "API requests per hour, all nodes",
            "Requests to the API server by verb, resource and HTTP status, as an hourly rate "
            "(steady state: about 8 watches per node, plus one get per owner an hour).",
            [
                Q(
                    f"sum by (verb, resource, code) (rate({requests}[{RATE}])) * 3600",
                    "{{verb}} {{resource}} {{code}}",
                )
            ],
        ),
        timeseries_panel(
            "Pods in the watch cache",
            "Pods of each node the exporter knows from the API server.",
            [
                Q(
                    f"max by (k8s.node.name) ({sel('kube_device_exporter.kubernetes.pods', NODE)})",
                    NODE_LEGEND,
                )
            ],
        ),
    ]


def _kubelet() -> list[PanelBuilder]:
    return [
        state_panel(
            "PodResources connection",
            "1 while the last List succeeded, per node.",
            [
                Q(
                    f"max by (k8s.node.name) ({sel('kube_device_exporter.podresources.up', NODE)})",
                    NODE_LEGEND,
                )
            ],
            states={"0": ("unreachable", "red"), "1": ("up", "green")},
        ),
        timeseries_panel(
            "Age of the last good List",
            "Seconds since the exporter last read the kubelet successfully.",
            [
                Q(
                    f"time() - max by (k8s.node.name)"
                    f" ({sel('kube_device_exporter.podresources.last_success_timestamp', NODE)})",
                    NODE_LEGEND,
                )
            ],
            unit="s",
        ),
        timeseries_panel(
            "PodResources calls",
            "Calls per second by method and gRPC status code.",
            [
                Q(
                    f"sum by (method, code)"
                    f" (rate({sel('kube_device_exporter.podresources.requests', NODE)}[{RATE}]))",
                    "{{method}} {{code}}",
                )
            ],
            unit="reqps",
        ),
        timeseries_panel(
            "PodResources latency",
            "Latency of the last call, by method (slowest node).",
            [
                Q(
                    f"max by (method)"
                    f" ({sel('kube_device_exporter.podresources.request.duration', NODE)})",
                    "{{method}}",
                )
            ],
            unit="s",
        ),
    ]


def _cycles() -> list[PanelBuilder]:
    return [
        timeseries_panel(
            "Cycle duration",
            "How long each node's last collection cycle took.",
            [
                Q(
                    f"max by (k8s.node.name) ({sel('kube_device_exporter.cycle.duration', NODE)})",
                    NODE_LEGEND,
                )
            ],
            unit="s",
        ),
        timeseries_panel(
            "Cycles per second",
            "Collection cycles per second, per node.",
            [
                Q(
                    f"sum by (k8s.node.name)"
                    f" (rate({sel('kube_device_exporter.cycles', NODE)}[{RATE}]))",
                    NODE_LEGEND,
                )
            ],
            unit="ops",
        ),
        timeseries_panel(
            "Age of the last cycle",
            "Seconds since each node's last finished cycle.",
            [
                Q(
                    f"time() - max by (k8s.node.name)"
                    f" ({sel('kube_device_exporter.cycle.last_success_timestamp', NODE)})",
                    NODE_LEGEND,
                )
            ],
            unit="s",
        ),
        timeseries_panel(
            "OTLP export batches",
            "Export attempts per second by sink and result (only with --otlp.endpoint).",
            [
                Q(
                    f"sum by (k8s.node.name, sink, result)"
                    f" (rate({sel('kube_device_exporter.export.batches', NODE)}[{RATE}]))",
                    "{{k8s_node_name}} {{sink}} {{result}}",
                )
            ],
            unit="ops",
        ),
    ]
