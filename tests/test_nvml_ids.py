"""Every ID form a device plugin (or DRA driver) hands the kubelet for an NVIDIA device
joins to the right device reported by the NVML source."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from exporter.join import join
from exporter.model import (
    ClaimResource,
    Container,
    ContainerDevices,
    DynamicResource,
    Pod,
    PodResourcesState,
)
from simulator.scenario import load_scenario
from tests.nvml_support import NvidiaNode, fakenvml, nvidia_node

__all__ = ["fakenvml", "nvidia_node"]

G0, G1, G2 = (f"GPU-a1b2c3d4-0000-4000-8000-00000000000{i}" for i in range(3))
M101, M102, M103 = (f"MIG-a1b2c3d4-0000-5000-8000-000000000{n}" for n in (101, 102, 103))

# Minor numbers differ from NVML indexes (index 0 is /dev/nvidia2), so an exporter that
# confuses the two joins GKE IDs to the wrong GPU.
SHUFFLED = f"""
nvidia:
  gpus:
    - {{uuid: {G0}, minor: 2, pci_bus_id: "0000:9a:00.0"}}
    - uuid: {G1}
      minor: 0
      mig:
        - {{uuid: {M101}, profile: 3g.40gb, gi: 2}}
        - {{uuid: {M102}, profile: 1g.10gb, gi: 9}}
        - {{uuid: {M103}, profile: 1g.10gb, gi: 10}}
    - {{uuid: {G2}, minor: 1}}
"""

CASES = [
    # (resource, raw ID as the kubelet reports it, the device it means)
    ("nvidia.com/gpu", G0, G0),
    ("nvidia.com/gpu.shared", f"{G2}::3", G2),
    ("nvidia.com/mig-1g.10gb", M102, M102),
    ("nvidia.com/mig-3g.40gb", f"{M101}::1", M101),
    ("nvidia.com/mig-1g.10gb", f"MIG-{G1}/10/0", M103),
    ("nvidia.com/gpu", "nvidia2", G0),
    ("nvidia.com/gpu", "nvidia1/vgpu3", G2),
    ("nvidia.com/mig-1g.10gb", "nvidia0/gi9", M102),
    ("nvidia.com/mig-3g.40gb", "nvidia0/gi2/vgpu1", M101),
    ("nvidia.com/gpu", "0000:9A:00.0", G0),
    ("nvidia.com/gpu", "00000000:9a:00.0", G0),
]


def test_every_device_plugin_id_form_joins_to_its_device(
    nvidia_node: Callable[[str], NvidiaNode],
) -> None:
    node = nvidia_node(SHUFFLED)
    result = node.collect_at(node.source(), 1.0)
    pods = tuple(
        Pod(f"pod-{i}", "ns", (Container("c", (ContainerDevices(resource, (raw,)),)),))
        for i, (resource, raw, _) in enumerate(CASES)
    )
    claim = DynamicResource(
        "gpu-claim", "ns", (ClaimResource("gpu.nvidia.com", "node-1", "gpu-2"),)
    )
    pods += (Pod("dra", "ns", (Container("c", dynamic_resources=(claim,)),)),)
    joined = join([result], PodResourcesState(pods=pods))
    found = {a.raw_id: a.device_id for a in joined.allocations}
    for _, raw, expected in CASES:
        assert found[raw] == expected, raw
    # NVIDIA's DRA driver names a GPU gpu-<minor> (k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/
    # deviceinfo.go CanonicalName): gpu-2 is minor 2, NVML index 0.
    assert found["gpu-2"] == G0


@pytest.mark.parametrize("scenario", ["demo", "dense"])
def test_bundled_scenarios_join_completely(
    nvidia_node: Callable[[str], NvidiaNode], scenario: str
) -> None:
    """Every allocatable and allocated NVIDIA ID in the bundled scenarios names a device."""
    node = nvidia_node(scenario)
    result = node.collect_at(node.source(), 1.0)
    loaded = load_scenario(scenario)
    state = PodResourcesState(
        pods=loaded.pods_at(1.0), allocatable=loaded.allocatable, allocatable_known=True
    )
    joined = join([result], state)
    assert joined.allocations
    assert all(a.device_id for a in joined.allocations)
    allocatable = {d.reading.device.id for d in joined.devices if d.allocatable}
    wanted = {
        node_id
        for devs in loaded.allocatable
        for raw in devs.device_ids
        for node_id in [raw.split("::")[0]]
    }
    assert allocatable == wanted
