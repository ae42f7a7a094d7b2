"""The DRA row of the devices dashboard: what this node's ResourceSlices offer and taint, the
pools' counters (free per profile, stranded capacity) and each claim's share of a shared
device (`--kubernetes.dra`, docs/dra.md)."""

from __future__ import annotations

from monitoring.grafana import PanelBuilder, Q, table_panel, timeseries_panel
from monitoring.queries import NODE, sel

DEVICE = "k8s.node.name, hw.allocation.resource, hw.allocation.pool, hw.allocation.device_id"
MEMORY = 'hw.dra.capacity="memory"'


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
        timeseries_panel(
            "DRA pool counters left and stranded",
            "What is left of each shared counter of a partitionable pool (KEP-4815: a GPU's "
            "memory slices, multiprocessors, memory) once the held partitions took theirs "
            "(solid), and of that what no partition that still fits would use: capacity lost "
            "to fragmentation (dashed). Bytes for memory, counts for the rest.",
            [
                Q(
                    "sum by (k8s.node.name, hw.allocation.pool, hw.dra.counter_set,"
                    f" hw.dra.counter) ({sel('hw.dra.counter.free', NODE)})",
                    "{{k8s_node_name}} {{hw_dra_counter_set}} {{hw_dra_counter}} left",
                ),
                Q(
                    "sum by (k8s.node.name, hw.allocation.pool, hw.dra.counter_set,"
                    f" hw.dra.counter) ({sel('hw.dra.counter.stranded', NODE)}) > 0",
                    "{{k8s_node_name}} {{hw_dra_counter_set}} {{hw_dra_counter}} stranded",
                ),
            ],
            unit="short",
        ),
        timeseries_panel(
            "Shares of shared DRA devices",
            "Each claim's share of a device that claims share by capacity (KEP-5075: its "
            "`consumedCapacity`, read from the ResourceClaim), and what the scheduler can "
            "still give of the device (free); GPU memory in bytes.",
            [
                Q(
                    f"sum by ({DEVICE}, k8s.namespace.name, k8s.pod.name, hw.allocation.claim)"
                    f" ({sel('hw.dra.allocation.capacity', NODE, MEMORY)})",
                    "{{hw_allocation_device_id}} {{k8s_namespace_name}}/{{k8s_pod_name}}",
                ),
                Q(
                    f"sum by ({DEVICE}) ({sel('hw.dra.device.capacity.free', NODE, MEMORY)})",
                    "{{hw_allocation_device_id}} free",
                ),
            ],
            unit="bytes",
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
