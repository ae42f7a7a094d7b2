"""One GPU that no driver backs: its UUID, a node whose one pod holds it (names that test
label escaping), and a source's reading of it, for tests of an exporter in this process."""

from __future__ import annotations

from exporter.model import Device, DeviceReading, Sample, SourceResult

GPU = "GPU-6a3f1c2e-1b7d-4c1e-9a55-000000000000"


SCENARIO = f"""
node: test-node
allocatable: [{{resource: nvidia.com/gpu, ids: [{GPU}]}}]
pods:
  - name: 'weird "pod"\\name'
    namespace: ns
    end: 5
    containers: [{{name: "c\\nnewline", devices: [{{resource: nvidia.com/gpu, ids: [{GPU}]}}]}}]
"""


def gpu_result(util: float = 0.5) -> SourceResult:
    device = Device(GPU, "gpu", "nvidia", "NVIDIA H100 80GB HBM3", "fake")
    return SourceResult(
        "fake",
        (
            DeviceReading(
                device,
                (
                    Sample("hw.gpu.utilization", util, (("hw.gpu.task", "general"),)),
                    Sample("hw.gpu.memory.usage", 2.0**30),
                ),
            ),
        ),
    )
