"""A plain PodResources client for tests: the kubelet's answers as they come, no exporter
code in between (the exporter's own client is what the tier tests, not what it uses to
look). Uses the product's generated stubs: they are the kubelet's wire format."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc

from exporter._proto.podresources.v1 import api_pb2 as v1
from exporter._proto.podresources.v1 import api_pb2_grpc as v1_grpc
from exporter._proto.podresources.v1alpha1 import api_pb2 as v1alpha1
from exporter._proto.podresources.v1alpha1 import api_pb2_grpc as v1alpha1_grpc

Holder = tuple[str, str, str]
"""(namespace, pod, container)."""


class Lister:
    def __init__(self, socket: Path, timeout: float = 2.0) -> None:
        # Reconnect within 10-50 ms (gRPC's default back-off waits a second or more after a
        # refused connection), so a restarted kubelet's first answers are seen.
        self.channel = grpc.insecure_channel(
            f"unix://{socket}",
            options=[
                ("grpc.initial_reconnect_backoff_ms", 10),
                ("grpc.min_reconnect_backoff_ms", 10),
                ("grpc.max_reconnect_backoff_ms", 50),
            ],
        )
        self.v1 = v1_grpc.PodResourcesListerStub(self.channel)
        self.v1alpha1 = v1alpha1_grpc.PodResourcesListerStub(self.channel)
        self.timeout = timeout
        self.raw_list = self.channel.unary_unary(
            "/v1.PodResourcesLister/List",
            request_serializer=v1.ListPodResourcesRequest.SerializeToString,
            response_deserializer=None,  # the bytes as the kubelet wrote them
        )
        self.raw_allocatable = self.channel.unary_unary(
            "/v1.PodResourcesLister/GetAllocatableResources",
            request_serializer=v1.AllocatableResourcesRequest.SerializeToString,
            response_deserializer=None,
        )

    def list(self) -> v1.ListPodResourcesResponse:
        return self.v1.List(v1.ListPodResourcesRequest(), timeout=self.timeout)

    def allocatable(self) -> v1.AllocatableResourcesResponse:
        return self.v1.GetAllocatableResources(
            v1.AllocatableResourcesRequest(), timeout=self.timeout
        )

    def get(self, pod: str, namespace: str) -> v1.GetPodResourcesResponse:
        request = v1.GetPodResourcesRequest(pod_name=pod, pod_namespace=namespace)
        return self.v1.Get(request, timeout=self.timeout)

    def list_v1alpha1(self) -> v1alpha1.ListPodResourcesResponse:
        return self.v1alpha1.List(v1alpha1.ListPodResourcesRequest(), timeout=self.timeout)

    def v1alpha1_bytes(self) -> bytes:
        """v1alpha1 List's answer as the kubelet wrote it."""
        call = self.channel.unary_unary(
            "/v1alpha1.PodResourcesLister/List",
            request_serializer=v1alpha1.ListPodResourcesRequest.SerializeToString,
            response_deserializer=None,
        )
        data: bytes = call(v1alpha1.ListPodResourcesRequest(), timeout=self.timeout)
        return data

    def list_bytes(self) -> bytes:
        data: bytes = self.raw_list(v1.ListPodResourcesRequest(), timeout=self.timeout)
        return data

    def allocatable_bytes(self) -> bytes:
        data: bytes = self.raw_allocatable(v1.AllocatableResourcesRequest(), timeout=self.timeout)
        return data

    def close(self) -> None:
        self.channel.close()


def containers(
    answer: v1.ListPodResourcesResponse,
) -> Iterator[tuple[Holder, v1.ContainerResources]]:
    for pod in answer.pod_resources:
        for container in pod.containers:
            yield (pod.namespace, pod.name, container.name), container


def holdings(answer: v1.ListPodResourcesResponse) -> dict[Holder, dict[str, list[str]]]:
    """Every listed container -> resource -> its device IDs, sorted (order-free)."""
    out: dict[Holder, dict[str, list[str]]] = {}
    for holder, container in containers(answer):
        held = out.setdefault(holder, {})
        for devices in container.devices:
            held.setdefault(devices.resource_name, []).extend(devices.device_ids)
        for ids in held.values():
            ids.sort()
    return out


def allocatable_ids(answer: v1.AllocatableResourcesResponse) -> dict[str, list[str]]:
    """resource -> allocatable device IDs, sorted."""
    out: dict[str, list[str]] = {}
    for devices in answer.devices:
        out.setdefault(devices.resource_name, []).extend(devices.device_ids)
    return {k: sorted(v) for k, v in out.items()}


def code(exc: grpc.RpcError) -> grpc.StatusCode:
    got: grpc.StatusCode = exc.code()
    return got
