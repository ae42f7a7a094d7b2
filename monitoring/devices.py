"""Nodes and devices: health, temperature, power, clocks, errors, XIDs, activity, profiling,
MIG layout, links."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash

from monitoring import profiling
from monitoring.dra_panels import panels as dra_panels
from monitoring.grafana import (
    PanelBuilder,
    Q,
    bar_panel,
    state_panel,
    table_panel,
    timeseries_panel,
)
from monitoring.layout import new_dashboard, rows, variables
from monitoring.queries import DEVICE, KEY, NODE, or_zero, sel

UID = "kde-devices"
DEV = f'{DEVICE}, hw.id=~"$device"'
ID = "{{k8s_node_name}} {{hw_id}}"
NVIDIA = f'{DEV}, hw.vendor="nvidia"'
MIG = f'{NODE}, hw.gpu.mig.profile!=""'
RATE = "$__rate_interval"
OK = 'hw.state="ok"'
FAILED = 'hw.state="failed"'
PICKED = 'hw.id=~"$device"'


TITLE = "Devices / Nodes and devices"
"""The dashboard's title: docs/runbooks.md names it (monitoring/runbooks.py)."""


def build() -> dash.Dashboard:
    board = new_dashboard(
        UID,
        TITLE,
        "Per device: health, XIDs and errors, temperature, power, clocks and throttling, "
        "activity, profiling (SM, tensor, DRAM), MIG layout and network links.",
    )
    board = variables(board, ("node", "type", "vendor", "model", "device"))
    return rows(
        board,
        (
            ("Health", _health()),
            ("Errors", _errors()),
            ("Thermals and power", _thermals()),
            ("Clocks and throttling", _clocks()),
            ("Activity", _activity()),
            ("Profiling (NVIDIA GPM)", profiling.device_row(NVIDIA)),
            ("MIG layout", _mig()),
            ("DRA devices", dra_panels()),
            ("Network and RDMA links", _network()),
        ),
    )


def _health() -> list[PanelBuilder]:
    return [
        table_panel(
            "Devices",
            "Every selected device with its identity and current holder (empty when nobody "
            "or several containers hold it).",
            [
                (
                    "Info",
                    f"max by ({KEY}, hw.type, hw.vendor, hw.model, hw.parent, hw.pci.bus_id,"
                    f" hw.driver_version, hw.gpu.mig.profile, k8s.namespace.name,"
                    f" k8s.pod.name) ({sel('hw.info', DEV)})",
                )
            ],
            hide=("Info",),
            height=9,
        ),
        state_panel(
            "Status",
            "Operational state per device over time.",
            [
                Q(
                    f"max by ({KEY}) ({sel('hw.status', DEV, OK)})"
                    f" + 2 * max by ({KEY}) ({sel('hw.status', DEV, FAILED)})"
                    f" or max by ({KEY}) ({sel('hw.status', DEV, OK)})",
                    ID,
                )
            ],
            states={"0": ("degraded", "orange"), "1": ("ok", "green"), "2": ("failed", "red")},
            span=24,
        ),
        table_panel(
            "Not allocatable (device plugin reports unhealthy)",
            "Devices the exporter sees that the kubelet no longer lists as allocatable for "
            "their resource: their device plugin reported them unhealthy. Capacity lost; a "
            "pod holding one keeps running on it. Empty when every device is allocatable.",
            [
                (
                    "Allocatable",
                    f"max by ({KEY}, hw.allocation.resource)"
                    f" ({sel('hw.device.allocatable', NODE, PICKED)}) == 0",
                ),
                (
                    "Holder",
                    f"max by ({KEY}, k8s.namespace.name, k8s.pod.name)"
                    f" ({sel('hw.allocation.info', NODE, PICKED)})"
                    f" and on({KEY}) ({sel('hw.device.allocatable', NODE)} == 0)",
                ),
            ],
            hide=("Allocatable", "Holder"),
            span=12,
        ),
        timeseries_panel(
            "Devices not allocatable by resource",
            "Per node and extended resource: devices seen but not allocatable over time.",
            [
                Q(
                    "sum by (k8s.node.name, hw.allocation.resource)"
                    f" ({sel('hw.not_allocatable.devices', NODE)})",
                    "{{k8s_node_name}} {{hw_allocation_resource}}",
                )
            ],
            unit="short",
        ),
    ]


def _errors() -> list[PanelBuilder]:
    return [
        table_panel(
            "XID errors in the time range",
            "NVIDIA XID events per device and code during the dashboard's range (0: none).",
            [
                (
                    "XIDs",
                    or_zero(
                        f"sum by ({KEY}, hw.gpu.xid)"
                        f" (increase({sel('hw.gpu.xid.errors', DEV)}[$__range])) > 0",
                        f"max by ({KEY}) ({sel('hw.info', NVIDIA)})",
                    ),
                )
            ],
            span=12,
        ),
        timeseries_panel(
            "XID events",
            "XID events per second, by device and code.",
            [
                Q(
                    f"sum by ({KEY}, hw.gpu.xid) (rate({sel('hw.gpu.xid.errors', DEV)}[{RATE}]))",
                    "{{hw_id}} XID {{hw_gpu_xid}}",
                )
            ],
            unit="ops",
        ),
        timeseries_panel(
            "Device errors",
            "Errors per second by kind: ECC corrected/uncorrected, PCIe replays, link errors.",
            [
                Q(
                    f"sum by ({KEY}, error.type) (rate({sel('hw.errors', DEV)}[{RATE}]))",
                    "{{hw_id}} {{error_type}}",
                )
            ],
            unit="ops",
        ),
        timeseries_panel(
            "Remapped memory rows",
            "Device memory rows remapped, by cause.",
            [
                Q(
                    f"max by ({KEY}, hw.gpu.memory.remap_cause)"
                    f" ({sel('hw.gpu.memory.remapped_rows', DEV)})",
                    "{{hw_id}} {{hw_gpu_memory_remap_cause}}",
                )
            ],
        ),
        state_panel(
            "Row remapping",
            "Pending: a remap waits for a GPU reset. Failed: the GPU ran out of spare rows.",
            [
                Q(
                    f"max by ({KEY}) ({sel('hw.gpu.memory.row_remap.pending', DEV)})"
                    f" + 2 * max by ({KEY}) ({sel('hw.gpu.memory.row_remap.failed', DEV)})",
                    ID,
                )
            ],
            states={
                "0": ("ok", "green"),
                "1": ("pending", "orange"),
                "2": ("failed", "red"),
                "3": ("failed", "red"),
            },
        ),
    ]


def _thermals() -> list[PanelBuilder]:
    return [
        timeseries_panel(
            "Temperature",
            "Per device and sensor.",
            [Q(sel("hw.temperature", DEV), "{{hw_id}} {{hw_sensor_location}}")],
            unit="celsius",
            minimum=None,
        ),
        timeseries_panel(
            "Power and limit",
            "Power drawn (solid) and the enforced limit.",
            [
                Q(f"max by ({KEY}) ({sel('hw.power', DEV)})", "{{hw_id}}"),
                Q(f"max by ({KEY}) ({sel('hw.power.limit', DEV)})", "{{hw_id}} limit"),
            ],
            unit="watt",
        ),
        bar_panel(
            "Energy in the time range",
            "Energy each device used during the dashboard's range.",
            [Q(f"sum by ({KEY}) (increase({sel('hw.energy', DEV)}[$__range]))", ID)],
            unit="joule",
            span=12,
        ),
    ]


def _clocks() -> list[PanelBuilder]:
    return [
        timeseries_panel(
            "Clocks",
            "Current clock frequency per domain.",
            [Q(sel("hw.gpu.clock", DEV), "{{hw_id}} {{hw_gpu_clock_type}}")],
            unit="hertz",
        ),
        state_panel(
            "Clock throttle reasons",
            "Which reasons hold each device's clocks down (NVML clock event reasons).",
            [
                Q(
                    f"max by ({KEY}, hw.gpu.clock.throttle_reason)"
                    f" ({sel('hw.gpu.clock.throttled', DEV)})",
                    "{{hw_id}} {{hw_gpu_clock_throttle_reason}}",
                )
            ],
            states={"0": ("no", "transparent"), "1": ("throttled", "orange")},
        ),
    ]


def _activity() -> list[PanelBuilder]:
    return [
        timeseries_panel(
            "Utilization",
            "Fraction of time the device was busy, by task (general, encoder, decoder).",
            [Q(sel("hw.gpu.utilization", DEV), "{{hw_id}} {{hw_gpu_task}}")],
            unit="percentunit",
            maximum=1,
        ),
        timeseries_panel(
            "Busy (idle residency)",
            "1 - idle residency, for GPUs that report idle time instead of utilization (Intel).",
            [Q(f"1 - max by ({KEY}) (rate({sel('hw.gpu.idle.time', DEV)}[{RATE}]))", ID)],
            unit="percentunit",
            maximum=1,
        ),
        timeseries_panel(
            "Device memory used",
            "Device memory in use, and its size.",
            [
                Q(f"max by ({KEY}) ({sel('hw.gpu.memory.usage', DEV)})", "{{hw_id}} used"),
                Q(f"max by ({KEY}) ({sel('hw.gpu.memory.limit', DEV)})", "{{hw_id}} size"),
            ],
            unit="bytes",
        ),
        timeseries_panel(
            "Memory bandwidth utilization",
            "Fraction of time device memory was read or written.",
            [Q(f"max by ({KEY}) ({sel('hw.gpu.memory.bandwidth.utilization', DEV)})", ID)],
            unit="percentunit",
            maximum=1,
        ),
        timeseries_panel(
            "GTT in use",
            "System memory mapped for the GPU (AMD, Intel).",
            [Q(f"max by ({KEY}) ({sel('hw.gpu.memory.gtt.usage', DEV)})", ID)],
            unit="bytes",
        ),
        timeseries_panel(
            "PCIe throughput",
            "Bytes per second over PCIe, by direction.",
            [
                Q(
                    f"sum by ({KEY}, network.io.direction) (rate({sel('hw.gpu.io', DEV)}[{RATE}]))",
                    "{{hw_id}} {{network_io_direction}}",
                )
            ],
            unit="Bps",
        ),
        timeseries_panel(
            "NVLink throughput",
            "Bytes per second over all NVLink links, by direction.",
            [
                Q(
                    f"sum by ({KEY}, network.io.direction)"
                    f" (rate({sel('hw.gpu.nvlink.io', DEV)}[{RATE}]))",
                    "{{hw_id}} {{network_io_direction}}",
                )
            ],
            unit="Bps",
        ),
    ]


def _mig_only(metric: str) -> str:
    """A value series of MIG slices only: the profile is on hw.info, not on every series."""
    return f"{sel(metric, NODE)} and on({KEY}) {sel('hw.info', MIG)}"


def _mig() -> list[PanelBuilder]:
    return [
        table_panel(
            "MIG slices",
            "Each MIG slice with its GPU, profile, instance ids and holder.",
            [
                (
                    "Slice",
                    f"max by ({KEY}, hw.parent, hw.gpu.mig.profile,"
                    f" hw.gpu.mig.gpu_instance_id, hw.gpu.mig.compute_instance_id,"
                    f" k8s.namespace.name, k8s.pod.name) ({sel('hw.info', MIG)})",
                ),
                ("Memory used", f"max by ({KEY}) ({_mig_only('hw.gpu.memory.usage')})"),
                ("Memory size", f"max by ({KEY}) ({_mig_only('hw.gpu.memory.limit')})"),
            ],
            hide=("Slice",),
            units={"Memory used": "bytes", "Memory size": "bytes"},
            span=16,
        ),
        bar_panel(
            "Slices per profile",
            "MIG slices per profile on the selected nodes.",
            [Q(f"count by (hw.gpu.mig.profile) ({sel('hw.info', MIG)})", "{{hw_gpu_mig_profile}}")],
        ),
    ]


def _network() -> list[PanelBuilder]:
    return [
        timeseries_panel(
            "Throughput",
            "Bytes per second per port or interface, by direction.",
            [
                Q(
                    f"sum by ({KEY}, network.io.direction)"
                    f" (rate({sel('hw.network.io', DEV)}[{RATE}]))",
                    "{{hw_id}} {{network_io_direction}}",
                )
            ],
            unit="Bps",
        ),
        timeseries_panel(
            "Dropped packets",
            "Packets dropped or discarded per second, by direction.",
            [
                Q(
                    f"sum by ({KEY}, network.io.direction)"
                    f" (rate({sel('hw.network.dropped', DEV)}[{RATE}]))",
                    "{{hw_id}} {{network_io_direction}}",
                )
            ],
            unit="pps",
        ),
        state_panel(
            "Link state",
            "1 while the link is up (InfiniBand ACTIVE).",
            [Q(f"max by ({KEY}) ({sel('hw.network.up', DEV)})", ID)],
            states={"0": ("down", "red"), "1": ("up", "green")},
        ),
        timeseries_panel(
            "InfiniBand transmit wait",
            "Ticks per second a port had data to send but no flow-control credits: congestion.",
            [
                Q(
                    f"max by ({KEY}) (rate({sel('hw.network.ib.transmit_wait', DEV)}[{RATE}]))",
                    ID,
                )
            ],
            unit="short",
        ),
        table_panel(
            "Link speed",
            "Current link speed per port or interface.",
            [("Speed", f"max by ({KEY}) ({sel('hw.network.bandwidth.limit', DEV)})")],
            units={"Speed": "Bps"},
            span=12,
        ),
    ]
