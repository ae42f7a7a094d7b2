"""Allocation efficiency: devices that are allocated but idle, and for how long.

A shared device counts for each holder by that holder's own processes' utilization where
process attribution gives it (`hw.gpu.container.utilization`), else by the whole device's.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash

from monitoring.grafana import (
    BAD_IF_ANY,
    PanelBuilder,
    Q,
    bar_panel,
    stat_panel,
    table_panel,
    timeseries_panel,
)
from monitoring.layout import new_dashboard, rows, variables
from monitoring.queries import (
    ALLOCATED,
    GENERAL,
    HELD,
    HOLDER,
    KEY,
    NODE,
    attributed,
    holders,
    idle_allocated,
    idle_now_allocated,
    sel,
    utilization,
)

UID = "kde-efficiency"
HOLDER_LABELS = "k8s.namespace.name, k8s.pod.name, k8s.container.name, hw.model"
THRESHOLD = "$idle_threshold"
IDLE = idle_allocated(NODE, "$idle_window", THRESHOLD)
IDLE_NOW = idle_now_allocated(NODE, THRESHOLD)
UTIL = sel("hw.gpu.utilization", GENERAL, NODE)
RANGE_MEAN = f"max by ({KEY}) (avg_over_time({UTIL}[$__range]))"
NAMESPACE = "k8s.namespace.name"

LAST_BUSY = (
    f"max by ({KEY}) (max_over_time(timestamp({utilization(NODE)} >= {THRESHOLD})[$lookback:]))"
)
FIRST_SEEN = f"max by ({KEY}) (min_over_time(timestamp({utilization(NODE)})[$lookback:]))"
IDLE_FOR = f"(time() - {LAST_BUSY}) or (time() - {FIRST_SEEN})"
"""Seconds since the device was last at or above the threshold; for a device never busy in
the lookback, seconds since it was first seen in it (so at most the lookback). The subqueries
step at Prometheus's evaluation interval (`[$lookback:]`)."""


def _join(device_expr: str, by: str = HOLDER_LABELS) -> str:
    """A per-device value, copied to each holder of the device (holders filtered)."""
    return f"({device_expr}) * on({KEY}) group_right() {holders(HOLDER, by)}"


def _holders_share(by: str) -> str:
    """Each holder's utilization of its devices: on a shared device, its own processes'
    (process attribution); otherwise, and where attribution is off, the device's."""
    return (
        f"({attributed('hw.gpu.container.utilization', HOLDER, by)})"
        f" or ({_join(utilization(NODE), by)})"
    )


TITLE = "Devices / Allocation efficiency"
"""The dashboard's title: docs/runbooks.md names it (monitoring/runbooks.py)."""


def build() -> dash.Dashboard:
    board = new_dashboard(
        UID,
        TITLE,
        "Devices that are allocated but idle, who holds them, and for how long.",
    )
    board = variables(
        board, ("node", "namespace", "pod", "idle_threshold", "idle_window", "lookback")
    )
    return rows(board, (("Idle while allocated", _idle()), ("Use of allocations", _use())))


def _idle() -> list[PanelBuilder]:
    return [
        stat_panel(
            "Idle while allocated",
            "Allocated devices below $idle_threshold utilization for all of $idle_window.",
            f"count({_join(IDLE, 'k8s.namespace.name')}) or vector(0)",
            thresholds=BAD_IF_ANY,
        ),
        stat_panel(
            "Idle now",
            "Allocated devices below $idle_threshold right now.",
            f"count({_join(IDLE_NOW, 'k8s.namespace.name')}) or vector(0)",
        ),
        stat_panel(
            "Mean utilization of allocated devices",
            "General utilization averaged over every allocated device, now.",
            f"avg({utilization(NODE)} and on({KEY}) {holders(HOLDER, 'k8s.namespace.name')})",
            unit="percentunit",
        ),
        stat_panel(
            "Free devices",
            "Devices no container holds (MIG parents excluded).",
            f"count(max by ({KEY}) ({sel('hw.info', NODE)}) unless on({KEY}) {ALLOCATED}"
            f" unless on({KEY}) label_replace(max by (cluster, k8s.node.name, hw.parent)"
            f' (hw.info{{hw.parent!=""}}), "hw.id", "$1", "hw.parent", "(.+)")) or vector(0)',
        ),
        table_panel(
            "Allocated but idle",
            "Each holder of an allocated device that is below $idle_threshold now: how long "
            "since the device was last busy (within $lookback), its peak in $idle_window and "
            "its utilization now.",
            [
                ("Idle for", _join(f"({IDLE_FOR}) and on({KEY}) {IDLE_NOW}")),
                (
                    "Peak in window",
                    _join(
                        f"max by ({KEY}) (max_over_time({UTIL}[$idle_window]))"
                        f" and on({KEY}) {IDLE_NOW}"
                    ),
                ),
                ("Utilization now", _join(IDLE_NOW)),
            ],
            units={
                "Idle for": "s",
                "Peak in window": "percentunit",
                "Utilization now": "percentunit",
            },
            height=10,
        ),
        timeseries_panel(
            "Allocated devices idle now, by namespace",
            "Allocated devices below $idle_threshold at each moment, per holding namespace.",
            [
                Q(
                    f"count by (k8s.namespace.name) ({_join(IDLE_NOW, 'k8s.namespace.name')})",
                    "{{k8s_namespace_name}}",
                )
            ],
            stacked=True,
        ),
        bar_panel(
            "Idle while allocated, by namespace",
            "Allocated devices idle for all of $idle_window, per holding namespace.",
            [
                Q(
                    f"sort_desc(count by (k8s.namespace.name)"
                    f" ({_join(IDLE, 'k8s.namespace.name')}))",
                    "{{k8s_namespace_name}}",
                )
            ],
            span=12,
        ),
    ]


def _use() -> list[PanelBuilder]:
    return [
        timeseries_panel(
            "Utilization of allocated devices, by namespace",
            "Mean general utilization of the devices each namespace holds; on a shared "
            "device, the namespace's own processes' share (process attribution), else the "
            "whole device's.",
            [
                Q(
                    f"avg by (k8s.namespace.name) ({_holders_share(NAMESPACE)})",
                    "{{k8s_namespace_name}}",
                )
            ],
            unit="percentunit",
            maximum=1,
        ),
        bar_panel(
            "Mean utilization over the time range, by namespace",
            "General utilization of the devices each namespace holds now, averaged over the "
            "dashboard's range.",
            [
                Q(
                    f"sort(avg by (k8s.namespace.name) ({_join(RANGE_MEAN, NAMESPACE)}))",
                    "{{k8s_namespace_name}}",
                )
            ],
            unit="percentunit",
            maximum=1,
            span=12,
        ),
        bar_panel(
            "Energy over the time range, by namespace",
            "Joules the devices each namespace held used over the dashboard's range: a whole "
            "device's energy for an exclusive holder, a shared device's by each holder's "
            "measured share (hw_container_energy, docs/attribution.md).",
            [Q(f"sort_desc(sum by (k8s.namespace.name) ({ENERGY}))", "{{k8s_namespace_name}}")],
            unit="joule",
            span=12,
        ),
        bar_panel(
            "Energy over the time range, by workload",
            "The same by the workload at the top of each pod's owner chain (Deployment, Job, "
            "CronJob...; k8s_pod_workload_info, needs --kubernetes.api).",
            [
                Q(
                    "sort_desc(sum by (k8s.namespace.name, k8s.workload.kind, k8s.workload.name)"
                    f" ({ENERGY} * on(k8s.node.name, k8s.namespace.name, k8s.pod.name)"
                    " group_left(k8s.workload.kind, k8s.workload.name) k8s.pod.workload.info))",
                    "{{k8s_namespace_name}}/{{k8s_workload_name}} ({{k8s_workload_kind}})",
                )
            ],
            unit="joule",
            span=12,
        ),
        table_panel(
            "Shared devices: each holder's share",
            "Per holder of a shared device: its processes' utilization and device memory "
            "(process attribution; NVIDIA memory needs hostPID, docs/attribution.md).",
            [
                ("Utilization", attributed("hw.gpu.container.utilization", HOLDER, SHARE_BY)),
                ("Memory", attributed("hw.gpu.container.memory.usage", HOLDER, SHARE_BY)),
            ],
            units={"Utilization": "percentunit", "Memory": "bytes"},
            span=12,
        ),
    ]


SHARE_BY = "k8s.namespace.name, k8s.pod.name, k8s.container.name"
ENERGY = f"increase({sel('hw.container.energy', HELD)}[$__range])"
"""Each container's joules over the dashboard's range (counters that survive pod churn)."""
