"""What the OTLP tests feed the sink: hand-built snapshots, and a tiny GPU source that
names the demo scenario's devices (so the join against the simulated kubelet is real)."""

from __future__ import annotations

from exporter.model import (
    Device,
    DeviceReading,
    Holder,
    JoinedDevice,
    Sample,
    Snapshot,
    SourceResult,
)
from exporter.settings.config import Config, OtlpConfig
from exporter.sinks.otlp import OtlpSink

# From simulator/scenarios/demo.yaml.
GPU0 = "GPU-6a3f1c2e-1b7d-4c1e-9a55-000000000000"
"""Held by ml-team/trainer-0/pytorch."""
GPU1 = "GPU-6a3f1c2e-1b7d-4c1e-9a55-000000000001"
"""The MIG parent."""
MIG102 = "MIG-0b6f4a21-7d3c-5e2a-8f10-000000000102"
"""Held by batch/short-job/job until t=40."""
A100 = "NVIDIA A100-SXM4-80GB"


def gpu(device_id: str = GPU0) -> Device:
    return Device(device_id, "gpu", "nvidia", A100, "fake")


def joined(
    device: Device, samples: tuple[Sample, ...], holder: Holder | None = None
) -> JoinedDevice:
    return JoinedDevice(DeviceReading(device, samples), holder, holders=1 if holder else 0)


def snapshot(*devices: JoinedDevice, cycle: int = 1, node: str = "node-a") -> Snapshot:
    return Snapshot(timestamp=1.7e9 + cycle, node=node, devices=devices, cycles_total=cycle)


def energy_snapshot(energy: float, memory: float, cycle: int, pod: str = "trainer-0") -> Snapshot:
    """One GPU held by `pod`: a counter (energy), an up-down counter (memory), a gauge."""
    return snapshot(
        joined(
            gpu(),
            (
                Sample("hw.energy", energy),
                Sample("hw.gpu.memory.usage", memory),
                Sample("hw.power", 300.0),
            ),
            Holder("ml-team", pod, "pytorch"),
        ),
        cycle=cycle,
    )


def sink_for(
    endpoint: str, protocol: str = "grpc", *, forget_after: float = 300.0, node: str = "node-a"
) -> OtlpSink:
    """A started-later sink whose periodic export never fires by itself (tests flush)."""
    config = Config(
        node_name=node,
        collect_interval=3600.0,
        otlp=OtlpConfig(endpoint=endpoint, protocol=protocol),
    )
    return OtlpSink(config, forget_after=forget_after)


class FakeGpus:
    """A source with two demo-scenario devices; energy grows 10 J per collection."""

    def __init__(self) -> None:
        self.energy = 1000.0

    def collect(self) -> SourceResult:
        self.energy += 10.0
        mig = Device(
            MIG102,
            "gpu",
            "nvidia",
            "NVIDIA A100 MIG 1g.10gb",
            "fake",
            parent=GPU1,
            attributes=(("hw.gpu.mig.profile", "1g.10gb"),),
        )
        return SourceResult(
            "fake",
            readings=(
                DeviceReading(
                    gpu(),
                    (
                        Sample("hw.gpu.utilization", 0.75, (("hw.gpu.task", "general"),)),
                        Sample("hw.gpu.memory.usage", 40e9),
                        Sample("hw.energy", self.energy),
                        Sample("hw.status", 1.0, (("hw.state", "ok"),)),
                    ),
                ),
                DeviceReading(mig, (Sample("hw.gpu.memory.usage", 2e9),)),
            ),
        )

    def close(self) -> None:
        return None
