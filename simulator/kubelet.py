"""A simulated kubelet: the PodResources gRPC API on a unix socket, served from a scenario.

Faithful to the real kubelet where a client can tell; each behaviour cites what it copies
in docs/podresources.md, "The real kubelet, observed" (K1-K14: v1.32.10; C-items: v1.36.2),
the newer kubelet winning where they differ:
- v1 and v1alpha1 on one socket, v1alpha1 without topology (K13), or v1alpha1 alone
  like a pre-1.20 kubelet; the exact error texts of disabled `Get`/`GetAllocatableResources`
  and of an unknown pod (K13);
- one token bucket, 100/s with a burst of 10, shared by every client, every method and
  v1alpha1, spent before anything else so failed calls spend tokens too (K12);
- pods, containers and devices in a different order on each call (K2; C10),
  one `ContainerDevices` per device (K1), NUMA node 0 as `nodes { }` (K11)
  (simulator/kubelet_wire.py);
- a stopped kubelet leaves its socket file behind: connecting gives UNAVAILABLE until a new
  kubelet replaces the file (K3);
- after a restart, List and GetAllocatableResources answer successfully with nothing for a
  while (K4; C11; `KubeletBehaviour.restart_*`);
- devices the scenario marks `unhealthy` leave GetAllocatableResources and stay in List
  (K9, scenario.Unhealthy); a plugin that is down takes all its devices out at once
  (K10, scenario.PluginDown); failed pods stay in List without devices (K6);
  ordinary init containers are never listed, sidecars before app containers (K8).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
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
from exporter.model import ContainerDevices
from simulator.kubelet_wire import allocatable_to_v1, pod_to_v1, pod_to_v1alpha1
from simulator.scenario import KubeletBehaviour, Scenario, TimedPod

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


class SimulatedKubelet:
    """Serve `scenario` on `socket_path`. Time is `clock()` seconds since the scenario began.

    `monotonic` is the kubelet's own time (its rate limiter and restart window run on the
    wall, not on scenario time; tests pass a fake); `seed` fixes the shuffled orders."""

    def __init__(
        self,
        scenario: Scenario,
        socket_path: str | Path,
        *,
        clock: Callable[[], float] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        seed: int | None = None,
    ) -> None:
        self.scenario = scenario
        self.socket_path = Path(socket_path)
        self.behaviour = scenario.kubelet
        started = time.monotonic()
        self.clock = clock or (lambda: time.monotonic() - started)
        self.monotonic = monotonic
        self.requests: dict[str, int] = {}
        self._bucket = TokenBucket(self.behaviour.qps, self.behaviour.burst, monotonic)
        self._server: grpc.aio.Server | None = None
        self._rng = random.Random(seed)
        self._restarted_at: float | None = None
        """When this kubelet last started after a stop (None: never stopped)."""
        self._stopped = False

    # --- control ------------------------------------------------------------------

    def set_behaviour(self, **changes: Any) -> None:
        """Change behaviour live (latency, get, rate limit...). API changes need restart()."""
        self.behaviour = replace(self.behaviour, **changes)
        self._bucket = TokenBucket(self.behaviour.qps, self.behaviour.burst, self.monotonic)

    async def start(self) -> None:
        if self._server is not None:
            return
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()  # a stale one from the last run: replaced by a new file
        server = grpc.aio.server(options=[("grpc.max_send_message_length", 512 * 1024 * 1024)])
        if self.behaviour.api == "v1":
            v1_grpc.add_PodResourcesListerServicer_to_server(_V1(self), server)
        v1alpha1_grpc.add_PodResourcesListerServicer_to_server(_V1alpha1(self), server)
        server.add_insecure_port(f"unix://{self.socket_path.absolute()}")
        await server.start()
        self._server = server
        if self._stopped:
            self._restarted_at = self.monotonic()

    async def stop(self) -> None:
        """Stop serving and leave the socket file behind, as a stopped kubelet does: a
        client that connects gets UNAVAILABLE (connection refused) until the next start()
        replaces the file (real kubelet K3)."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace=None)
            self._stopped = True
            _leave_socket_behind(self.socket_path)

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
        """Every call of every client, method and version takes a token first, so calls
        that then fail spend one too (real kubelet K12)."""
        self.requests[method] = self.requests.get(method, 0) + 1
        if self.behaviour.rate_limit and not self._bucket.allow():
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, RATE_LIMITED)
        if self.behaviour.latency > 0:
            await asyncio.sleep(self.behaviour.latency)

    def _in_restart_window(self, seconds: float) -> bool:
        """Within `seconds` of a restart: the kubelet answers successfully with nothing
        while its pod sources and the device manager's checkpoint load (List) and until
        its device plugins register again (GetAllocatableResources): real kubelet K4, C11."""
        at = self._restarted_at
        return at is not None and self.monotonic() - at < seconds

    def listed(self) -> tuple[TimedPod, ...]:
        if self._in_restart_window(self.behaviour.restart_list_empty):
            return ()
        pods = list(self.scenario.listed_at(self.clock()))
        if self.behaviour.shuffle:
            self._rng.shuffle(pods)  # K2: pods from a map, in a new order each call
        return tuple(pods)

    def allocatable(self) -> tuple[ContainerDevices, ...]:
        if self._in_restart_window(self.behaviour.restart_allocatable_empty):
            return ()
        return self.scenario.allocatable_at(self.clock())

    @property
    def rng(self) -> random.Random | None:
        """The shuffling source, or None when the scenario asks for a fixed order."""
        return self._rng if self.behaviour.shuffle else None


def _leave_socket_behind(path: Path) -> None:
    """gRPC unlinks its socket on a clean shutdown; a kubelet that is stopped (killed) does
    not. A socket bound and closed without unlink is the file it leaves: connect() on it
    is refused."""
    if path.exists():
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stale:
        stale.bind(str(path))


class _V1(v1_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: SimulatedKubelet) -> None:
        self.k = kubelet

    async def List(self, request: Any, context: Any) -> v1_pb2.ListPodResourcesResponse:
        await self.k.admit("v1/List", context)
        rng = self.k.rng
        return v1_pb2.ListPodResourcesResponse(
            pod_resources=[pod_to_v1(p.pod, p.sidecars, rng) for p in self.k.listed()]
        )

    async def GetAllocatableResources(
        self, request: Any, context: Any
    ) -> v1_pb2.AllocatableResourcesResponse:
        await self.k.admit("v1/GetAllocatableResources", context)
        if not self.k.behaviour.allocatable:
            await context.abort(grpc.StatusCode.UNKNOWN, ALLOCATABLE_DISABLED)
        return allocatable_to_v1(self.k.allocatable(), self.k.rng)

    async def Get(self, request: Any, context: Any) -> v1_pb2.GetPodResourcesResponse:
        await self.k.admit("v1/Get", context)
        if not self.k.behaviour.get:
            await context.abort(grpc.StatusCode.UNKNOWN, GET_DISABLED)
        for p in self.k.listed():
            if p.pod.name == request.pod_name and p.pod.namespace == request.pod_namespace:
                return v1_pb2.GetPodResourcesResponse(
                    pod_resources=pod_to_v1(p.pod, p.sidecars, self.k.rng)
                )
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
        rng = self.k.rng
        return v1alpha1_pb2.ListPodResourcesResponse(
            pod_resources=[pod_to_v1alpha1(p.pod, p.sidecars, rng) for p in self.k.listed()]
        )


__all__ = ["KubeletBehaviour", "SimulatedKubelet", "TokenBucket"]
