"""Profiling (NVIDIA GPM) panels: the devices dashboard's row and the per-pod "is the GPU used
well" panel of the workloads dashboard.

GPM gives SM, tensor, FP pipe and DRAM activity per GPU (MIG on or off) and per MIG slice,
Hopper and later, each the mean over `--collector.nvml.gpm-interval`. Per pod, device values
reach a pod through the allocation join (`hw.allocation.info`), on the devices it holds
alone: a shared GPU's activity is the whole device's and is not split per pod.
"""

from __future__ import annotations

from monitoring.grafana import PanelBuilder, Q, timeseries_panel
from monitoring.queries import HOLDER, KEY, NODE, SHARED_KEYS, holders, sel

ID = "{{hw_id}}"
POD = "k8s.namespace.name, k8s.pod.name"
POD_LEGEND = "{{k8s_namespace_name}}/{{k8s_pod_name}}"


def _device(metric: str, filters: str, by: str = "") -> str:
    return f"max by ({KEY}{', ' + by if by else ''}) ({sel(metric, filters)})"


def device_row(devices: str) -> list[PanelBuilder]:
    """The devices dashboard's profiling row, for the devices `devices` selects."""
    return [
        timeseries_panel(
            "SM activity and occupancy (GPM)",
            "Fraction of SMs busy, and warps resident as a fraction of the maximum, averaged "
            "over the GPM interval (Hopper and later; whole GPUs and MIG slices). Low SM "
            "activity on a held GPU: the job waits on data, the host or communication.",
            [
                Q(_device("hw.gpu.sm.activity", devices), f"{ID} SM active"),
                Q(_device("hw.gpu.sm.occupancy", devices), f"{ID} occupancy"),
            ],
            unit="percentunit",
            maximum=1,
        ),
        timeseries_panel(
            "Tensor and FP pipes (GPM)",
            "Fraction of time the tensor pipes, and the non-tensor FP64/FP32/FP16 pipes, were "
            "active. Training on tensor cores shows here, not in plain utilization.",
            [
                Q(_device("hw.gpu.tensor.activity", devices), f"{ID} tensor"),
                Q(
                    _device("hw.gpu.pipe.activity", devices, "hw.gpu.pipe"),
                    f"{ID} {{{{hw_gpu_pipe}}}}",
                ),
            ],
            unit="percentunit",
            maximum=1,
        ),
        timeseries_panel(
            "Graphics engine and DRAM activity (GPM)",
            "Fraction of time any work ran on the GPU or slice, and DRAM bandwidth used as a "
            "fraction of the peak.",
            [
                Q(_device("hw.gpu.graphics.activity", devices), f"{ID} engine"),
                Q(_device("hw.gpu.dram.activity", devices), f"{ID} DRAM"),
            ],
            unit="percentunit",
            maximum=1,
        ),
        timeseries_panel(
            "PCIe and NVLink throughput (GPM)",
            "Bytes per second over PCIe and over all NVLink links, by direction, averaged "
            "over the GPM interval (GPUs; a MIG slice has no link of its own).",
            [
                Q(
                    _device("hw.gpu.pcie.throughput", devices, "network.io.direction"),
                    f"{ID} PCIe {{{{network_io_direction}}}}",
                ),
                Q(
                    _device("hw.gpu.nvlink.throughput", devices, "network.io.direction"),
                    f"{ID} NVLink {{{{network_io_direction}}}}",
                ),
            ],
            unit="Bps",
        ),
    ]


def per_pod(metric: str) -> str:
    """`metric` of each device a pod holds alone, averaged per pod, through the allocation
    join: the device's value times each (device, pod) allocation (1)."""
    alone = f"({holders(HOLDER, POD)} unless on({KEY}) {SHARED_KEYS})"
    return f"avg by ({POD}) ({_device(metric, NODE)} * on({KEY}) group_right() {alone})"


def pod_panel() -> PanelBuilder:
    """Is the GPU used well: SM and tensor activity of the devices each pod holds alone."""
    return timeseries_panel(
        "Is the GPU used well? SM and tensor activity per pod (GPM)",
        "SM activity and tensor-pipe activity of the GPUs and MIG slices each pod holds alone "
        "(the allocation join), averaged over its devices. A held device with low SM "
        "activity is allocated but poorly used; high SM with no tensor activity: the job "
        "does not use tensor cores. Hopper and later; shared devices are left out (their "
        "activity is the whole device's).",
        [
            Q(per_pod("hw.gpu.sm.activity"), f"{POD_LEGEND} SM active"),
            Q(per_pod("hw.gpu.tensor.activity"), f"{POD_LEGEND} tensor"),
        ],
        unit="percentunit",
        maximum=1,
        span=24,
    )
