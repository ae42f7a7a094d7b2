"""Cluster overview: what devices there are, and which are allocated, free or idle."""

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
    DEVICE,
    GENERAL,
    KEY,
    NODE,
    allocated_units,
    free_units,
    idle_allocated,
    idle_now_allocated,
    or_zero,
    sel,
    units,
)

UID = "kde-overview"
MODEL = "hw.type, hw.vendor, hw.model"
NOT_OK = 'hw.state!="ok"'
IDLE = idle_allocated(DEVICE, "$idle_window", "$idle_threshold")
IDLE_NOW = idle_now_allocated(DEVICE, "$idle_threshold")


TITLE = "Devices / Cluster overview"
"""The dashboard's title: docs/runbooks.md names it (monitoring/runbooks.py)."""


def build() -> dash.Dashboard:
    board = new_dashboard(
        UID,
        TITLE,
        "Accelerators and NICs in the cluster: by vendor and model, allocated vs free vs "
        "idle while allocated.",
    )
    board = variables(board, ("node", "type", "vendor", "model", "idle_threshold", "idle_window"))
    return rows(
        board,
        (("Fleet", _fleet()), ("By vendor and model", _models()), ("Allocation", _allocation())),
    )


def _fleet() -> list[PanelBuilder]:
    return [
        stat_panel(
            "Devices",
            "Allocatable units: every device that is not the parent of others (a GPU split "
            "into MIG slices counts as its slices).",
            f"count({units(DEVICE)}) or vector(0)",
        ),
        stat_panel(
            "Allocated",
            "Units that a container holds, from the kubelet's PodResources API.",
            f"count({allocated_units(DEVICE)}) or vector(0)",
        ),
        stat_panel(
            "Free",
            "Units no container holds.",
            f"count({free_units(DEVICE)}) or vector(0)",
        ),
        stat_panel(
            "Idle while allocated",
            "Allocated devices whose utilization stayed below $idle_threshold for $idle_window.",
            f"count({IDLE}) or vector(0)",
            thresholds=BAD_IF_ANY,
        ),
        stat_panel(
            "Not OK",
            "Devices whose status is not ok (degraded or failed).",
            f"count({sel('hw.status', DEVICE, NOT_OK)} == 1) or vector(0)",
            thresholds=BAD_IF_ANY,
        ),
        stat_panel(
            "Power",
            "Power drawn by all selected devices now.",
            f"sum({sel('hw.power', DEVICE)}) or vector(0)",
            unit="watt",
        ),
    ]


def _models() -> list[PanelBuilder]:
    return [
        table_panel(
            "Devices by vendor and model",
            "Units per model: total, allocated, free, and allocated but idle for $idle_window.",
            [
                ("Devices", f"count by ({MODEL}) ({units(DEVICE)})"),
                (
                    "Allocated",
                    or_zero(
                        f"count by ({MODEL}) ({allocated_units(DEVICE)})",
                        f"count by ({MODEL}) ({units(DEVICE)})",
                    ),
                ),
                (
                    "Free",
                    or_zero(
                        f"count by ({MODEL}) ({free_units(DEVICE)})",
                        f"count by ({MODEL}) ({units(DEVICE)})",
                    ),
                ),
                (
                    "Idle while allocated",
                    or_zero(
                        f"count by ({MODEL}) ({IDLE} * on({KEY}) group_left({MODEL})"
                        f" {units(DEVICE)})",
                        f"count by ({MODEL}) ({units(DEVICE)})",
                    ),
                ),
            ],
            span=12,
        ),
        bar_panel(
            "Devices per node",
            "Units per node and model.",
            [
                Q(
                    f"count by (k8s.node.name, hw.model) ({units(DEVICE)})",
                    "{{k8s_node_name}} {{hw_model}}",
                )
            ],
            span=12,
        ),
        timeseries_panel(
            "Utilization by model",
            "Mean general utilization of the selected devices, per model.",
            [
                Q(
                    f"avg by (hw.vendor, hw.model) ({sel('hw.gpu.utilization', GENERAL, DEVICE)})",
                    "{{hw_vendor}} {{hw_model}}",
                )
            ],
            unit="percentunit",
            maximum=1,
        ),
        timeseries_panel(
            "Device memory used by model",
            "Device memory in use over device memory size, per model (MIG parents left out, "
            "their slices count).",
            [
                Q(
                    f"sum by (hw.model) ({sel('hw.gpu.memory.usage', DEVICE)} and on({KEY})"
                    f" {units(DEVICE)}) / sum by (hw.model) ({sel('hw.gpu.memory.limit', DEVICE)}"
                    f" and on({KEY}) {units(DEVICE)})",
                    "{{hw_model}}",
                )
            ],
            unit="percentunit",
            maximum=1,
        ),
        timeseries_panel(
            "Power by node",
            "Power drawn by the selected devices, per node.",
            [Q(f"sum by (k8s.node.name) ({sel('hw.power', DEVICE)})", "{{k8s_node_name}}")],
            unit="watt",
            stacked=True,
        ),
        timeseries_panel(
            "Device temperature (hottest sensor) by model",
            "Highest temperature any sensor of a device of the model reports.",
            [Q(f"max by (hw.model) ({sel('hw.temperature', DEVICE)})", "{{hw_model}}")],
            unit="celsius",
            minimum=None,
        ),
    ]


def _allocation() -> list[PanelBuilder]:
    return [
        timeseries_panel(
            "Allocated, free and idle",
            "Units over time. 'Idle now' is allocated and below $idle_threshold at that moment "
            "(the stat above needs the whole $idle_window).",
            [
                Q(f"count({allocated_units(DEVICE)}) or vector(0)", "allocated"),
                Q(f"count({free_units(DEVICE)}) or vector(0)", "free"),
                Q(f"count({IDLE_NOW}) or vector(0)", "idle now (allocated)"),
            ],
        ),
        bar_panel(
            "Allocated vs allocatable by resource",
            "Device IDs the kubelet hands out per extended resource: held by containers over "
            "what the node can allocate (GetAllocatableResources).",
            [
                Q(
                    f"sum by (hw.allocation.resource) ({sel('hw.allocated.devices', NODE)})"
                    f" / sum by (hw.allocation.resource) ({sel('hw.allocatable.devices', NODE)})",
                    "{{hw_allocation_resource}}",
                )
            ],
            unit="percentunit",
            maximum=1,
            span=12,
        ),
        table_panel(
            "Resources",
            "Per extended resource and node: device IDs allocatable and held, and whether "
            "its device plugin is registered (0: the kubelet lists none of its devices any "
            "more, KubeDevicePluginNotRegistered; the row then has no Allocatable).",
            [
                (
                    "Allocatable",
                    f"sum by (k8s.node.name, hw.allocation.resource)"
                    f" ({sel('hw.allocatable.devices', NODE)})",
                ),
                (
                    "Held",
                    f"sum by (k8s.node.name, hw.allocation.resource)"
                    f" ({sel('hw.allocated.devices', NODE)})",
                ),
                (
                    "Plugin registered",
                    f"max by (k8s.node.name, hw.allocation.resource)"
                    f" ({sel('hw.allocation.resource.registered', NODE)})",
                ),
            ],
            span=12,
        ),
    ]
