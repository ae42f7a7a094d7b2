"""A device plugin (deviceplugin v1beta1) of our own, registered with a real kubelet.

One `DevicePlugin` serves one extended resource on its own socket in the kubelet's
device-plugin folder and registers over that folder's `kubelet.sock`
(k8s.io/kubelet pkg/apis/deviceplugin/v1beta1: `Registration.Register`,
`DevicePlugin.ListAndWatch` / `Allocate`; constants.go: version "v1beta1", health
"Healthy"/"Unhealthy"). Tests drive it: `set_health` marks devices unhealthy (a new
ListAndWatch answer), `stop` takes the plugin away (its socket closes: the kubelet drops
the resource), `start` serves and registers again.

The kubelet deletes every socket in the folder when it starts (docs/podresources.md,
real-kubelet behaviour 14), so a plugin must notice and register again, as real plugins do
(NVIDIA's watches `kubelet.sock` with fsnotify): `watch=True` polls for its socket going
and re-registers with the new kubelet.

Device IDs are what NVML calls the devices (`GPU-<uuid>`, `MIG-<uuid>`), as NVIDIA's
plugin advertises them with `DEVICE_ID_STRATEGY=uuid`, so the exporter joins them to the
simulated NVML's devices.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent import futures
from pathlib import Path

import grpc

from tests._proto.deviceplugin.v1beta1 import api_pb2 as dp
from tests._proto.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc

VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
KUBELET_SOCKET = "kubelet.sock"
ENV = "KDE_TEST_DEVICES"
"""Allocate answers this environment variable: the IDs a container got, comma-separated."""


class DevicePlugin(dp_grpc.DevicePluginServicer):
    """`resource` (e.g. nvidia.com/gpu) with `device_ids`, on NUMA node `numa`."""

    def __init__(
        self, resource: str, device_ids: Sequence[str], folder: Path, *, numa: int = 0
    ) -> None:
        self.resource = resource
        self.folder = folder
        self.numa = numa
        self.endpoint = "kde-" + resource.replace("/", "_").replace(".", "-") + ".sock"
        self.health = dict.fromkeys(device_ids, HEALTHY)
        self.allocations: list[list[str]] = []
        """Every Allocate's device IDs, per container request, in call order."""
        self.registrations = 0
        self.errors: list[str] = []
        """Failed re-registrations of the watcher (it retries when the socket goes again)."""
        self._changed = threading.Condition()
        self._version = 0
        self._server: grpc.Server | None = None
        self._stop_watch = threading.Event()
        self._watcher: threading.Thread | None = None

    @property
    def socket(self) -> Path:
        return self.folder / self.endpoint

    # --- the service the kubelet calls
    def GetDevicePluginOptions(self, request: dp.Empty, context: object) -> dp.DevicePluginOptions:
        return dp.DevicePluginOptions()

    def ListAndWatch(
        self, request: dp.Empty, context: grpc.ServicerContext
    ) -> Iterator[dp.ListAndWatchResponse]:
        """The whole list now, then again after each change, until the plugin stops or
        the kubelet hangs up."""
        sent = -1
        while context.is_active() and self._server is not None:
            with self._changed:
                if self._version == sent:
                    # Bounded: a kubelet that hung up is noticed within a second.
                    self._changed.wait(1.0)
                    continue
                sent = self._version
                answer = self._devices()
            yield answer

    def Allocate(self, request: dp.AllocateRequest, context: object) -> dp.AllocateResponse:
        responses = []
        for container in request.container_requests:
            ids = list(container.devices_ids)
            self.allocations.append(ids)
            responses.append(dp.ContainerAllocateResponse(envs={ENV: ",".join(ids)}))
        return dp.AllocateResponse(container_responses=responses)

    def GetPreferredAllocation(
        self, request: object, context: object
    ) -> dp.PreferredAllocationResponse:
        return dp.PreferredAllocationResponse()

    def PreStartContainer(self, request: object, context: object) -> dp.PreStartContainerResponse:
        return dp.PreStartContainerResponse()

    def _devices(self) -> dp.ListAndWatchResponse:
        topology = dp.TopologyInfo(nodes=[dp.NUMANode(ID=self.numa)])
        return dp.ListAndWatchResponse(
            devices=[dp.Device(ID=i, health=h, topology=topology) for i, h in self.health.items()]
        )

    # --- what tests do
    def start(self, *, watch: bool = True, timeout: float = 10.0) -> None:
        """Serve on the socket and register with the kubelet of `folder`."""
        self._serve()
        self.register(timeout)
        if watch and self._watcher is None:
            self._stop_watch.clear()
            self._watcher = threading.Thread(
                target=self._watch, name=f"plugin {self.resource}", daemon=True
            )
            self._watcher.start()

    def _serve(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        dp_grpc.add_DevicePluginServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        with self._changed:
            self._server = server
            self._version += 1
            self._changed.notify_all()

    def register(self, timeout: float = 10.0) -> None:
        """Register, retrying until the kubelet's registration socket answers."""
        deadline = time.monotonic() + timeout
        request = dp.RegisterRequest(
            version=VERSION, endpoint=self.endpoint, resource_name=self.resource,
            options=dp.DevicePluginOptions(),
        )  # fmt: skip
        while True:
            try:
                with grpc.insecure_channel(f"unix://{self.folder / KUBELET_SOCKET}") as channel:
                    dp_grpc.RegistrationStub(channel).Register(request, timeout=2)
                self.registrations += 1
                return
            except grpc.RpcError as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.resource}: Register failed: {exc}") from exc
                time.sleep(0.05)

    def set_health(self, device_id: str, healthy: bool) -> None:
        with self._changed:
            self.health[device_id] = HEALTHY if healthy else UNHEALTHY
            self._version += 1
            self._changed.notify_all()

    def stop(self) -> None:
        """Stop serving (open streams end, the socket goes) and stop watching."""
        self._stop_watch.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
            self._watcher = None
        self._shutdown()

    def _shutdown(self) -> None:
        with self._changed:
            server, self._server = self._server, None
            self._changed.notify_all()
        if server is not None:
            server.stop(grace=None).wait(5)
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()

    def _watch(self) -> None:
        """Re-register when a (re)started kubelet deleted our socket."""
        while not self._stop_watch.wait(0.05):
            if self.socket.exists() or not (self.folder / KUBELET_SOCKET).exists():
                continue
            self._shutdown()
            self._serve()
            try:
                self.register(timeout=5)
            except RuntimeError as exc:  # the kubelet went again: the next round retries
                self.errors.append(str(exc))
