"""What every dashboard shares: tags, links to its siblings, time settings, variables."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.models.dashboard import DashboardCursorSync, DashboardLinkType

from monitoring.grafana import (
    PanelBuilder,
    VariableBuilder,
    custom_variable,
    datasource_variable,
    query_variable,
)
from monitoring.queries import NODE

TAG = "kube-device-exporter"
NODE_QUERY = 'label_values(kube_device_exporter.build.info{cluster=~"$cluster"}, k8s.node.name)'
"""Every running exporter reports build info, so nodes are listed even before a device is."""

IDLE_THRESHOLDS = ("0.05", "0.01", "0.1", "0.2")
IDLE_WINDOWS = ("1h", "30m", "3h", "6h", "24h")
LOOKBACKS = ("24h", "6h", "3d", "7d")


def new_dashboard(uid: str, title: str, description: str) -> dash.Dashboard:
    return (
        dash.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags([TAG])
        .editable()
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .time("now-6h", "now")
        .refresh("30s")
        .timezone("browser")
        .link(
            dash.DashboardLink("kube-device-exporter")
            .type(DashboardLinkType.DASHBOARDS)
            .tags([TAG])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
    )


def rows(
    board: dash.Dashboard, sections: Sequence[tuple[str, Sequence[PanelBuilder]]]
) -> dash.Dashboard:
    """Add each (row title, panels) section in order."""
    for title, panels in sections:
        board = board.with_row(dash.Row(title))
        for panel in panels:
            board = board.with_panel(panel)
    return board


def variables(board: dash.Dashboard, names: Sequence[str]) -> dash.Dashboard:
    """Add the named variables, in the order given (later ones filter by earlier ones),
    after the data source and `cluster`, which every dashboard has: one Prometheus (Thanos,
    Mimir) often holds several clusters, told apart by an external label `cluster`. Where
    there is none the variable is empty and its All (`.*`) matches every series."""
    board = board.with_variable(datasource_variable()).with_variable(_cluster())
    for name in names:
        board = board.with_variable(_VARIABLES[name]())
    return board


def _cluster() -> VariableBuilder:
    return query_variable(
        "cluster",
        "Cluster",
        "label_values(kube_device_exporter.build.info, cluster)",
        description="The `cluster` label of a Prometheus holding several clusters (Thanos, "
        "Mimir); empty with one cluster",
    )


def _type() -> VariableBuilder:
    return query_variable("type", "Type", f"label_values(hw.info{{{NODE}}}, hw.type)")


def _vendor() -> VariableBuilder:
    return query_variable(
        "vendor", "Vendor", f'label_values(hw.info{{{NODE}, hw.type=~"$type"}}, hw.vendor)'
    )


def _model() -> VariableBuilder:
    return query_variable(
        "model",
        "Model",
        f'label_values(hw.info{{{NODE}, hw.type=~"$type", hw.vendor=~"$vendor"}}, hw.model)',
    )


def _device() -> VariableBuilder:
    return query_variable(
        "device",
        "Device",
        f'label_values(hw.info{{{NODE}, hw.type=~"$type", hw.vendor=~"$vendor",'
        ' hw.model=~"$model"}, hw.id)',
    )


def _namespace() -> VariableBuilder:
    return query_variable(
        "namespace",
        "Namespace",
        f"label_values(hw.allocation.info{{{NODE}}}, k8s.namespace.name)",
    )


def _pod() -> VariableBuilder:
    return query_variable(
        "pod",
        "Pod",
        f'label_values(hw.allocation.info{{{NODE}, k8s.namespace.name=~"$namespace"}},'
        " k8s.pod.name)",
    )


def _job() -> VariableBuilder:
    return query_variable(
        "job",
        "Job",
        'label_values(kube_device_exporter.build.info{cluster=~"$cluster"}, job)',
        multi=False,
        description="Prometheus job that scrapes the exporters",
    )


_VARIABLES: dict[str, Callable[[], VariableBuilder]] = {
    "node": lambda: query_variable("node", "Node", NODE_QUERY),
    "type": _type,
    "vendor": _vendor,
    "model": _model,
    "device": _device,
    "namespace": _namespace,
    "pod": _pod,
    "job": _job,
    "idle_threshold": lambda: custom_variable(
        "idle_threshold",
        "Idle below",
        IDLE_THRESHOLDS,
        "A device counts as idle while its utilization (0-1) is below this",
    ),
    "idle_window": lambda: custom_variable(
        "idle_window",
        "Idle for",
        IDLE_WINDOWS,
        "How long a device must stay below the threshold to count as idle",
    ),
    "lookback": lambda: custom_variable(
        "lookback",
        "Look back",
        LOOKBACKS,
        "How far back to look for the last busy moment (longer is slower)",
    ),
}
