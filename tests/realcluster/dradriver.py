"""A DRA driver of the tests' own, registered with a real 1.36 kubelet and publishing its
devices through the real API server (control-plane.md, "DRA on it").

The three gRPC services the kubelet calls, from the vendored protos (proto/, kubernetes/kubelet
v0.36.2):
- `pluginregistration.Registration` on a socket in the kubelet's
  `ROOT_DIR/plugins_registry/`: `GetInfo` answers type `DRAPlugin`, the driver's name, the
  endpoint of its DRA socket and `supported_versions: ["v1.DRAPlugin"]`; the kubelet then
  calls `NotifyRegistrationStatus` (recorded in `registered`);
- `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin` on that endpoint: `NodePrepareResources` reads
  each claim's `status.allocation` from the API server and answers the devices of this
  driver (pool, device, request, share ID), with no CDI IDs (containerd 1.6 has no CDI);
  `NodeUnprepareResources` answers every claim done;
- `v1alpha1.DRAResourceHealth/NodeWatchResources` on the same endpoint: the whole health list
  now, after each `set_health`, and every RESEND seconds (the kubelet expires an entry after
  the device's `health_check_timeout_seconds`, 30 s by default).

`publish()` writes one `resource.k8s.io/v1` ResourceSlice (node, pool, devices) by server-side
apply, and a second one of `sharedCounters` for a partitionable pool (the API server refuses
both in one slice; both say `resourceSliceCount: 2`, control-plane.md fact 13); the kubelet
deletes every slice of its node when it starts, so a driver publishes again.

What a real driver does on top, a test hands in: `on_prepare(claim, devices)` after a claim's
devices are known (NVIDIA's makes the MIG device of a partition then, dra-driver-nvidia-gpu
nvlib.go `createMigDevice`; DRANET writes the claim's device status, pkg/driver/
nri_hooks.go) and `on_unprepare(uid)`; `write_status()` is that status write, a server-side
apply of `status.devices` on the claim's status subresource with the driver's field manager.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from tests._proto.dra.v1 import api_pb2 as dra
from tests._proto.dra.v1 import api_pb2_grpc as dra_grpc
from tests._proto.drahealth.v1alpha1 import api_pb2 as health
from tests._proto.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from tests._proto.pluginregistration.v1 import api_pb2 as reg
from tests._proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from tests.realcluster.api import Api, ApiStatus

PLUGIN_TYPE = "DRAPlugin"
VERSIONS = ["v1.DRAPlugin"]
RESEND = 10.0
HEALTH = {"Healthy": health.HEALTHY, "Unhealthy": health.UNHEALTHY, "Unknown": health.UNKNOWN}


class _Registration(reg_grpc.RegistrationServicer):
    def __init__(self, driver: DraDriver) -> None:
        self.driver = driver

    def GetInfo(self, request: reg.InfoRequest, context: object) -> reg.PluginInfo:
        return reg.PluginInfo(type=PLUGIN_TYPE, name=self.driver.name,
                              endpoint=str(self.driver.dra_socket),
                              supported_versions=VERSIONS)  # fmt: skip

    def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: object
    ) -> reg.RegistrationStatusResponse:
        self.driver.registered.append((request.plugin_registered, request.error))
        return reg.RegistrationStatusResponse()


class _Health(health_grpc.DRAResourceHealthServicer):
    def __init__(self, driver: DraDriver) -> None:
        self.driver = driver

    def NodeWatchResources(
        self, request: health.NodeWatchResourcesRequest, context: grpc.ServicerContext
    ) -> Iterator[health.NodeWatchResourcesResponse]:
        driver = self.driver
        driver.health_watchers += 1
        sent, last = -1, 0.0
        while context.is_active() and driver.serving:
            with driver.changed:
                if driver.version == sent and time.monotonic() - last < RESEND:
                    driver.changed.wait(1.0)  # bounded: a hung-up kubelet is noticed
                    continue
                sent, last = driver.version, time.monotonic()
                now = int(time.time())
                answer = health.NodeWatchResourcesResponse(devices=[
                    health.DeviceHealth(
                        device=health.DeviceIdentifier(pool_name=driver.pool, device_name=name),
                        health=HEALTH[state], last_updated_time=now, message=message)
                    for name, (state, message) in driver.health.items()
                ])  # fmt: skip
            yield answer


class DraDriver(dra_grpc.DRAPluginServicer):
    """Driver `name` on `node` (its kubelet's root `kubelet_root`), one pool named after the
    node, `devices` as the slice lists them (name, attributes, capacity, ...)."""

    def __init__(self, name: str, node: str, kubelet_root: Path, api: Api,
                 devices: list[dict[str, Any]], *,
                 counters: list[dict[str, Any]] | None = None) -> None:  # fmt: skip
        self.name = name
        self.node = node
        self.pool = node
        self.api = api
        self.devices = devices
        self.counters = counters or []
        """`sharedCounters` of the pool (KEP-4815), published in a slice of their own."""
        self.on_prepare: Callable[[dict[str, Any], list[dra.Device]], None] | None = None
        self.on_unprepare: Callable[[str], None] | None = None
        self.registry_socket = kubelet_root / "plugins_registry" / f"{name}-reg.sock"
        self.dra_socket = kubelet_root / "plugins" / name / "dra.sock"
        self.registered: list[tuple[bool, str]] = []
        self.prepared: list[dict[str, Any]] = []
        """Every claim prepared: namespace, name, uid and the devices answered."""
        self.unprepared: list[str] = []
        self.health: dict[str, tuple[str, str]] = {d["name"]: ("Healthy", "") for d in devices}
        self.health_watchers = 0
        self.fail = ""
        """When set, every prepare fails with this error (the kubelet retries)."""
        self.changed = threading.Condition()
        self.version = 0
        self.serving = False
        self._servers: list[grpc.Server] = []

    @property
    def slice_name(self) -> str:
        return f"{self.node}-{self.name}".replace(".", "-")

    # --- the DRA service
    def NodePrepareResources(
        self, request: dra.NodePrepareResourcesRequest, context: object
    ) -> dra.NodePrepareResourcesResponse:
        out = {}
        for claim in request.claims:
            out[claim.uid] = self._prepare(claim)
        return dra.NodePrepareResourcesResponse(claims=out)

    def _prepare(self, claim: dra.Claim) -> dra.NodePrepareResourceResponse:
        if self.fail:
            return dra.NodePrepareResourceResponse(error=self.fail)
        path = f"/apis/resource.k8s.io/v1/namespaces/{claim.namespace}/resourceclaims/{claim.name}"
        try:
            obj = self.api.get(path)
        except ApiStatus as exc:
            return dra.NodePrepareResourceResponse(error=f"reading the claim: {exc}")
        if obj["metadata"]["uid"] != claim.uid:
            return dra.NodePrepareResourceResponse(error="the claim's UID changed")
        results = obj.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
        devices = []
        for result in results:
            if result["driver"] != self.name:
                continue
            device = dra.Device(request_names=[result["request"]], pool_name=result["pool"],
                                device_name=result["device"])  # fmt: skip
            if result.get("shareID"):
                device.share_id = result["shareID"]
            devices.append(device)
        if self.on_prepare is not None:
            try:
                self.on_prepare(obj, devices)
            except Exception as exc:  # noqa: BLE001 - the kubelet retries a failed prepare
                return dra.NodePrepareResourceResponse(error=f"preparing: {exc!r}")
        self.prepared.append({"namespace": claim.namespace, "name": claim.name,
                              "uid": claim.uid, "devices": [
                                  (d.pool_name, d.device_name, d.share_id) for d in devices]})  # fmt: skip
        return dra.NodePrepareResourceResponse(devices=devices)

    def NodeUnprepareResources(
        self, request: dra.NodeUnprepareResourcesRequest, context: object
    ) -> dra.NodeUnprepareResourcesResponse:
        self.unprepared += [c.uid for c in request.claims]
        for c in request.claims:
            if self.on_unprepare is not None:
                self.on_unprepare(c.uid)
        return dra.NodeUnprepareResourcesResponse(
            claims={c.uid: dra.NodeUnprepareResourceResponse() for c in request.claims}
        )

    # --- what tests do
    def slice(self) -> dict[str, Any]:
        return self._slice(self.slice_name, {"devices": self.devices})

    def counter_slice(self) -> dict[str, Any] | None:
        if not self.counters:
            return None
        return self._slice(f"{self.slice_name}-counters", {"sharedCounters": self.counters})

    def _slice(self, name: str, content: dict[str, Any]) -> dict[str, Any]:
        pool = {"name": self.pool, "generation": 1, "resourceSliceCount": 2 if self.counters else 1}
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": name},
                "spec": {"driver": self.name, "nodeName": self.node, "pool": pool, **content}}  # fmt: skip

    def slices(self) -> list[dict[str, Any]]:
        return [s for s in (self.counter_slice(), self.slice()) if s is not None]

    def publish(self) -> dict[str, Any]:
        counters = self.counter_slice()
        if counters is not None:
            self.api.apply(counters, manager=self.name)
        return self.api.apply(self.slice(), manager=self.name)

    def write_status(self, claim: dict[str, Any], devices: list[dict[str, Any]]) -> None:
        """`status.devices` of a claim by server-side apply on its status subresource, as
        DRANET does (`ApplyStatus`, field manager the driver's name; control-plane.md fact 15:
        an entry must name an allocated device of the claim)."""
        meta = claim["metadata"]
        path = (f"/apis/resource.k8s.io/v1/namespaces/{meta['namespace']}/resourceclaims/"
                f"{meta['name']}/status")  # fmt: skip
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                "status": {"devices": devices}}  # fmt: skip
        self.api.request("PATCH", path, body, params={"fieldManager": self.name, "force": "true"},
                         content_type="application/apply-patch+yaml")  # fmt: skip

    def start(self) -> DraDriver:
        """Serve the DRA endpoint, then the registration socket the kubelet watches."""
        self.dra_socket.parent.mkdir(parents=True, exist_ok=True)
        self.registry_socket.parent.mkdir(parents=True, exist_ok=True)
        for sock in (self.dra_socket, self.registry_socket):
            with contextlib.suppress(FileNotFoundError):
                sock.unlink()
        self.serving = True
        plugin = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        dra_grpc.add_DRAPluginServicer_to_server(self, plugin)
        health_grpc.add_DRAResourceHealthServicer_to_server(_Health(self), plugin)
        plugin.add_insecure_port(f"unix://{self.dra_socket}")
        plugin.start()
        registration = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        reg_grpc.add_RegistrationServicer_to_server(_Registration(self), registration)
        registration.add_insecure_port(f"unix://{self.registry_socket}")
        registration.start()
        self._servers = [plugin, registration]
        return self

    def set_health(self, device: str, state: str, message: str = "") -> None:
        with self.changed:
            self.health[device] = (state, message)
            self.version += 1
            self.changed.notify_all()

    def stop(self) -> None:
        """Both sockets gone, open health streams ended (the driver killed)."""
        with self.changed:
            self.serving = False
            self.changed.notify_all()
        for server in self._servers:
            server.stop(grace=None).wait(5)
        self._servers = []
        for sock in (self.dra_socket, self.registry_socket):
            with contextlib.suppress(FileNotFoundError):
                sock.unlink()
