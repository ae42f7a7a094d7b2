"""The standalone-kubelet tier's node: a RealNode, two device plugins (whole GPUs and MIG
slices) and the static pods every test of the tier may read.

The pods cover what the issue asks for: one and several devices per container, several
containers, a container without devices, an ordinary init container holding a device, a
sidecar init container (`restartPolicy: Always`) holding one, and a pod that fails.
Tests that change a pod place their own (`extra`), so the shared ones stay as they are.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import pytest

from tests.realnode.binaries import KUBELET_ENV, Missing, binary_from, node_tools
from tests.realnode.deviceplugin import DevicePlugin
from tests.realnode.node import RealNode
from tests.realnode.pods import Container, Pod

GPU = "nvidia.com/gpu"
MIG = "nvidia.com/mig-1g.10gb"
GPUS = tuple(f"GPU-5d0a7c2e-6b1f-4e8a-9c3d-{i:012x}" for i in range(8))
MIG_PARENT = "GPU-5d0a7c2e-6b1f-4e8a-9c3d-0000000000ff"
MIGS = tuple(f"MIG-8e4b1d6f-2a7c-5b9e-8d0f-{i:012x}" for i in range(1, 4))
NAMESPACE = "kde-e2e"

SOLO = Pod("solo", [Container("main", {GPU: 1})])
PAIR = Pod("pair", [Container("main", {GPU: 2}), Container("plain")])
DUO = Pod("duo", [Container("left", {MIG: 1}), Container("right", {MIG: 1})])
INIT = Pod("initgpu", [Container("app", {GPU: 1})], [Container("prepare", {GPU: 1}, ("true",))])
SIDECAR = Pod(
    "sidecar",
    [Container("app", {GPU: 1})],
    [Container("helper", {GPU: 1}, restart_policy="Always")],
)
FAILING = Pod("failing", [Container("crash", {MIG: 1}, ("false",))], restart_policy="Never")
BASE_PODS = (SOLO, PAIR, DUO, INIT, SIDECAR, FAILING)
PHASES = {FAILING.name: "Failed"}
"""What each base pod settles in (Running when not named)."""


def kubelet_or_skip() -> Path:
    """The kubelet binary, or skip the module with one line saying why."""
    try:
        binary = binary_from(KUBELET_ENV)
        node_tools()
    except Missing as exc:
        pytest.skip(f"real-kubelet tier: {exc}", allow_module_level=True)
    return binary


class StandaloneNode:
    def __init__(self, binary: Path) -> None:
        self.node = RealNode(binary)
        self.kubelet = self.node.kubelet
        folder = self.node.plugin_folder
        self.gpu = DevicePlugin(GPU, GPUS, folder, numa=0)
        self.mig = DevicePlugin(MIG, MIGS, folder, numa=1)
        self.plugins = (self.gpu, self.mig)

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def socket(self) -> Path:
        return self.kubelet.pod_resources_socket

    def start(self, pods: Sequence[Pod] = BASE_PODS) -> None:
        self.node.start_runtime()
        self.node.start_kubelet()
        # Plugins first: a pod admitted before its plugin registered gets no devices
        # (docs/real-node.md, "The kubelet").
        for plugin in self.plugins:
            plugin.start()
        self.wait_allocatable()
        self.place(pods)

    def wait_allocatable(self, timeout: float = 20.0) -> None:
        """Until the kubelet offers every plugin's devices (GetAllocatableResources)."""
        from tests.realnode.podresources import Lister, allocatable_ids

        lister = Lister(self.socket)
        want = {p.resource: sorted(p.health) for p in self.plugins}
        deadline = time.monotonic() + timeout
        got: dict[str, list[str]] = {}
        try:
            while time.monotonic() < deadline:
                got = allocatable_ids(lister.allocatable())
                if got == want:
                    return
                time.sleep(0.1)
        finally:
            lister.close()
        raise AssertionError(f"allocatable never became {want}: {got}\n{self.kubelet.log_tail()}")

    def place(self, pods: Iterable[Pod], wait: bool = True) -> None:
        pods = list(pods)
        for pod in pods:
            pod.place(self.kubelet.manifests)
        if wait:
            for pod in pods:
                self.kubelet.wait_pod(pod.name, PHASES.get(pod.name, "Running"))

    def close(self) -> list[str]:
        for plugin in self.plugins:
            plugin.stop()
        return self.node.close()


def standalone_node(binary: Path, pods: Sequence[Pod] = BASE_PODS) -> Iterator[StandaloneNode]:
    """A started node for a fixture; on teardown everything stops and the fixture fails
    when anything was left behind."""
    node = StandaloneNode(binary)
    try:
        node.start(pods)
        yield node
    finally:
        left = node.close()
        assert not left, f"left behind: {left}"
