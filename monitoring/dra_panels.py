"""The DRA row of the devices dashboard: what this node's ResourceSlices offer and taint
(`--kubernetes.dra`, docs/dra.md)."""

from __future__ import annotations

from monitoring.grafana import PanelBuilder, Q, table_panel, timeseries_panel
from monitoring.queries import NODE, sel

DEVICE = "k8s.node.name, hw.allocation.resource, hw.allocation.pool, hw.allocation.device_id"


def panels() -> list[PanelBuilder]:
    return [
        timeseries_panel(
            "Free DRA devices by driver, pool and kind",
            "Devices of the nodes' ResourceSlices a new claim could still get: held by no "
            "container (or shareable), not tainted NoSchedule/NoExecute, and their partition's "
            "shared counters not used up (GetAllocatableResources never lists DRA devices).",
            [
                Q(
                    "sum by (k8s.node.name, hw.allocation.resource, hw.allocation.pool,"
                    f" hw.dra.kind) ({sel('hw.dra.free', NODE)})",
                    "{{k8s_node_name}} {{hw_allocation_resource}} {{hw_allocation_pool}}"
                    " {{hw_dra_kind}}",
                )
            ],
            unit="short",
        ),
        table_panel(
            "Tainted DRA devices",
            "Each taint on a DRA device (the driver's in its ResourceSlice, or a "
            "DeviceTaintRule) with the device it names; empty when none is tainted.",
            [
                (
                    "Taint",
                    f"max by ({DEVICE}, hw.id, hw.dra.taint.key, hw.dra.taint.value,"
                    " hw.dra.taint.effect, hw.dra.taint.source)"
                    f" ({sel('hw.dra.device.taint', NODE)})",
                )
            ],
            hide=("Taint",),
            span=12,
        ),
    ]
