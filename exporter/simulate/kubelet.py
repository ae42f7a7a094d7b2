"""A simulated kubelet: the PodResources gRPC API on a unix socket, served from a scenario.

Faithful to the real kubelet where a client can tell: v1 and v1alpha1 on one socket
(or v1alpha1 alone, like a pre-1.20 kubelet), the exact error texts of disabled
`Get`/`GetAllocatableResources` and unknown pods, the token-bucket rate limit
(100 qps, burst 10, `ResourceExhausted "rejected by rate limit"`) applied across all
clients, optional latency, and stop/restart on the same path (the socket file is
removed on stop, as the kubelet's is). Devices the scenario marks `unhealthy` leave
GetAllocatableResources and stay in List, as in the kubelet (scenario.Unhealthy).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from exporter._proto.podresources.v1 import api_pb2 as v1_pb2
from exporter._proto.podresources.v1 import api_pb2_grpc as v1_grpc
from exporter._proto.podresources.v1alpha1 import api_pb2 as v1alpha1_pb2
from exporter._proto.podresources.v1alpha1 import api_pb2_grpc as v1alpha1_grpc
from exporter.model import ContainerDevices, Pod
from exporter.simulate.scenario import KubeletBehaviour, Scenario

GET_DISABLED = "PodResources API Get method disabled"
ALLOCATABLE_DISABLED = "Pod Resources API GetAllocatableResources disabled"
RATE_LIMITED = "rejected by rate limit"


class TokenBucket:
    """golang.org/x/time/rate semantics: `qps` tokens a second, at most `burst` saved."""

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.qps, self.burst, self._clock = qps, burst, clock
        self._tokens = float(burst)
        self._at = clock()

    def allow(self) -> bool:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.qps)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


def _topology(pb: Any, numa: tuple[int, ...]) -> Any:
    return pb.TopologyInfo(nodes=[pb.NUMANode(ID=n) for n in numa]) if numa else None


def devices_to_v1(devices: ContainerDevices) -> v1_pb2.ContainerDevices:
    return v1_pb2.ContainerDevices(
        resource_name=devices.resource_name,
        device_ids=list(devices.device_ids),
        topology=_topology(v1_pb2, devices.numa_nodes),
    )


def pod_to_v1(pod: Pod) -> v1_pb2.PodResources:
    containers = []
    for c in pod.containers:
        containers.append(
            v1_pb2.ContainerResources(
                name=c.name,
                devices=[devices_to_v1(d) for d in c.devices],
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
        )
    return v1_pb2.PodResources(name=pod.name, namespace=pod.namespace, containers=containers)


def pod_to_v1alpha1(pod: Pod) -> v1alpha1_pb2.PodResources:
    return v1alpha1_pb2.PodResources(
        name=pod.name,
        namespace=pod.namespace,
        containers=[
            v1alpha1_pb2.ContainerResources(
                name=c.name,
                devices=[
                    v1alpha1_pb2.ContainerDevices(
                        resource_name=d.resource_name, device_ids=list(d.device_ids)
                    )
                    for d in c.devices
                ],
            )
            for c in pod.containers
        ],
    )


class SimulatedKubelet:
    """Serve `scenario` on `socket_path`. Time is `clock()` seconds since the scenario began."""

    def __init__(
        self,
        scenario: Scenario,
        socket_path: str | Path,
        *,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.scenario = scenario
        self.socket_path = Path(socket_path)
        self.behaviour = scenario.kubelet
        started = time.monotonic()
        self.clock = clock or (lambda: time.monotonic() - started)
        self.requests: dict[str, int] = {}
        self._bucket = TokenBucket(self.behaviour.qps, self.behaviour.burst)
        self._server: grpc.aio.Server | None = None

    # --- control ------------------------------------------------------------------

    def set_behaviour(self, **changes: Any) -> None:
        """Change behaviour live (latency, get, rate limit...). API changes need restart()."""
        self.behaviour = replace(self.behaviour, **changes)
        self._bucket = TokenBucket(self.behaviour.qps, self.behaviour.burst)

    async def start(self) -> None:
        if self._server is not None:
            return
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = grpc.aio.server(options=[("grpc.max_send_message_length", 512 * 1024 * 1024)])
        if self.behaviour.api == "v1":
            v1_grpc.add_PodResourcesListerServicer_to_server(_V1(self), server)
        v1alpha1_grpc.add_PodResourcesListerServicer_to_server(_V1alpha1(self), server)
        server.add_insecure_port(f"unix://{self.socket_path.absolute()}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace=None)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    async def restart(self, **changes: Any) -> None:
        await self.stop()
        if changes:
            self.set_behaviour(**changes)
        await self.start()

    @property
    def running(self) -> bool:
        return self._server is not None

    # --- shared request path --------------------------------------------------------

    async def admit(self, method: str, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        self.requests[method] = self.requests.get(method, 0) + 1
        if self.behaviour.rate_limit and not self._bucket.allow():
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, RATE_LIMITED)
        if self.behaviour.latency > 0:
            await asyncio.sleep(self.behaviour.latency)

    def pods(self) -> tuple[Pod, ...]:
        return self.scenario.pods_at(self.clock())


class _V1(v1_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: SimulatedKubelet) -> None:
        self.k = kubelet

    async def List(self, request: Any, context: Any) -> v1_pb2.ListPodResourcesResponse:
        await self.k.admit("v1/List", context)
        return v1_pb2.ListPodResourcesResponse(pod_resources=[pod_to_v1(p) for p in self.k.pods()])

    async def GetAllocatableResources(
        self, request: Any, context: Any
    ) -> v1_pb2.AllocatableResourcesResponse:
        await self.k.admit("v1/GetAllocatableResources", context)
        if not self.k.behaviour.allocatable:
            await context.abort(grpc.StatusCode.UNKNOWN, ALLOCATABLE_DISABLED)
        return v1_pb2.AllocatableResourcesResponse(
            devices=[devices_to_v1(d) for d in self.k.scenario.allocatable_at(self.k.clock())]
        )

    async def Get(self, request: Any, context: Any) -> v1_pb2.GetPodResourcesResponse:
        await self.k.admit("v1/Get", context)
        if not self.k.behaviour.get:
            await context.abort(grpc.StatusCode.UNKNOWN, GET_DISABLED)
        for pod in self.k.pods():
            if pod.name == request.pod_name and pod.namespace == request.pod_namespace:
                return v1_pb2.GetPodResourcesResponse(pod_resources=pod_to_v1(pod))
        await context.abort(
            grpc.StatusCode.UNKNOWN,
            f"pod {request.pod_name} in namespace {request.pod_namespace} not found",
        )
        raise AssertionError("abort returned")  # pragma: no cover


class _V1alpha1(v1alpha1_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: SimulatedKubelet) -> None:
        self.k = kubelet

    async def List(self, request: Any, context: Any) -> v1alpha1_pb2.ListPodResourcesResponse:
        await self.k.admit("v1alpha1/List", context)
        return v1alpha1_pb2.ListPodResourcesResponse(
            pod_resources=[pod_to_v1alpha1(p) for p in self.k.pods()]
        )


__all__ = ["KubeletBehaviour", "SimulatedKubelet", "TokenBucket"]
