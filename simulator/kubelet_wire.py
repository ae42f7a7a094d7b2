"""The simulated kubelet's answers on the wire, shaped as the real kubelet shapes them.

Each shape cites what it copies in docs/podresources.md, "The real kubelet, observed"
(K1-K14: v1.32.10; C-items: v1.36.2); where they differ the newer kubelet wins.
"""

from __future__ import annotations

import random
from typing import Any

from exporter._proto.podresources.v1 import api_pb2 as v1_pb2
from exporter._proto.podresources.v1alpha1 import api_pb2 as v1alpha1_pb2
from exporter.model import Container, ContainerDevices, Pod


def _topology(pb: Any, numa: tuple[int, ...]) -> Any:
    # NUMA node 0 goes out as `topology { nodes { } }`: ID 0 is proto3's default and is not
    # written (real kubelet K11); protobuf does exactly that for NUMANode(ID=0).
    return pb.TopologyInfo(nodes=[pb.NUMANode(ID=n) for n in numa]) if numa else None


def devices_to_v1(devices: ContainerDevices) -> list[v1_pb2.ContainerDevices]:
    """One `ContainerDevices` per device ID, each with its own topology: a container holding
    two GPUs gets two entries (real kubelet K1, for List and GetAllocatableResources)."""
    topology = _topology(v1_pb2, devices.numa_nodes)
    return [
        v1_pb2.ContainerDevices(
            resource_name=devices.resource_name, device_ids=[device_id], topology=topology
        )
        for device_id in devices.device_ids
    ]


def _container_to_v1(c: Container, rng: random.Random | None) -> v1_pb2.ContainerResources:
    devices = [entry for d in c.devices for entry in devices_to_v1(d)]
    if rng is not None:
        rng.shuffle(devices)  # K2: devices in a different order on each call
    return v1_pb2.ContainerResources(
        name=c.name,
        devices=devices,
        cpu_ids=list(c.cpu_ids),
        memory=[
            v1_pb2.ContainerMemory(
                memory_type=m.memory_type,
                size=m.size_bytes,
                topology=_topology(v1_pb2, m.numa_nodes),
            )
            for m in c.memory
        ],
        dynamic_resources=[
            v1_pb2.DynamicResource(
                claim_name=d.claim_name,
                claim_namespace=d.claim_namespace,
                claim_resources=[
                    v1_pb2.ClaimResource(
                        cdi_devices=[v1_pb2.CDIDevice(name=n) for n in r.cdi_devices],
                        driver_name=r.driver_name,
                        pool_name=r.pool_name,
                        device_name=r.device_name,
                        share_id=r.share_id or None,
                    )
                    for r in d.claim_resources
                ],
            )
            for d in c.dynamic_resources
        ],
    )


def ordered_containers(
    containers: tuple[Container, ...], sidecars: int, rng: random.Random | None
) -> list[Container]:
    """The pod's containers in the order of one answer: its `sidecars` sidecar init
    containers (listed first by the scenario) before the app containers (real kubelet
    K8), each group in a different order on each call (K2)."""
    head, tail = list(containers[:sidecars]), list(containers[sidecars:])
    if rng is not None:
        rng.shuffle(head)
        rng.shuffle(tail)
    return head + tail


def pod_to_v1(pod: Pod, sidecars: int = 0, rng: random.Random | None = None) -> v1_pb2.PodResources:
    return v1_pb2.PodResources(
        name=pod.name,
        namespace=pod.namespace,
        containers=[
            _container_to_v1(c, rng) for c in ordered_containers(pod.containers, sidecars, rng)
        ],
    )


def pod_to_v1alpha1(
    pod: Pod, sidecars: int = 0, rng: random.Random | None = None
) -> v1alpha1_pb2.PodResources:
    """v1alpha1 has no topology (real kubelet K13), otherwise v1's shapes."""
    containers = []
    for c in ordered_containers(pod.containers, sidecars, rng):
        devices = [
            v1alpha1_pb2.ContainerDevices(resource_name=d.resource_name, device_ids=[i])
            for d in c.devices
            for i in d.device_ids
        ]
        if rng is not None:
            rng.shuffle(devices)
        containers.append(v1alpha1_pb2.ContainerResources(name=c.name, devices=devices))
    return v1alpha1_pb2.PodResources(name=pod.name, namespace=pod.namespace, containers=containers)


def allocatable_to_v1(
    allocatable: tuple[ContainerDevices, ...], rng: random.Random | None = None
) -> v1_pb2.AllocatableResourcesResponse:
    devices = [entry for d in allocatable for entry in devices_to_v1(d)]
    if rng is not None:
        rng.shuffle(devices)  # a map in the device manager, like List's (K2)
    return v1_pb2.AllocatableResourcesResponse(devices=devices)
