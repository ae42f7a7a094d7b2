"""A snapshot as the renderers get it, holding what tests their escaping and number
formats: a pod name with a quote, a backslash and a newline, an infinite power, a NaN
temperature, a negative limit."""

from __future__ import annotations

import math

from exporter.model import (
    Allocation,
    Device,
    DeviceReading,
    Holder,
    JoinedDevice,
    Sample,
    Snapshot,
    SourceHealth,
)


def snapshot(util: float = 0.5, pods: tuple[str, ...] = ('odd "pod"\\x\ny',)) -> Snapshot:
    devices = []
    allocations = []
    for i, pod in enumerate(pods):
        device = Device(
            f"GPU-{i}",
            "gpu",
            "nvidia",
            "H100 80GB",
            "nvml",
            attributes=(("hw.driver_version", "550.1"), ("hw.gpu.index", str(i))),
        )
        holder = Holder("ns", pod, "main")
        reading = DeviceReading(
            device,
            (
                Sample("hw.gpu.utilization", util, (("hw.gpu.task", "general"),)),
                Sample("hw.gpu.memory.usage", 81_559_420_928.0),
                Sample("hw.energy", 12_345_678.5),
                Sample("hw.power", math.inf),
                Sample("hw.temperature", math.nan, (("hw.sensor_location", "gpu"),)),
                Sample("hw.power.limit", -1e-7),
            ),
        )
        devices.append(JoinedDevice(reading, holder, 1, True))
        allocations.append(Allocation(holder, "nvidia.com/gpu", f"GPU-{i}", f"GPU-{i}"))
    return Snapshot(
        timestamp=1.8e9,
        node="node-1",
        devices=tuple(devices),
        allocations=tuple(allocations),
        sources=(SourceHealth("nvml", True, 0.0012),),
        cycle_duration_seconds=0.004,
        cycles_total=7,
        last_success_timestamp=1.8e9,
    )
