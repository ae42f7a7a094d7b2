"""The simulated kubelet behaves as the real one does (docs/podresources.md, "The real
kubelet, observed"): each test names the behaviour it checks, through real gRPC over a unix
socket with the generated stubs, as any client would see it."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from google.protobuf import text_format

from exporter._proto.podresources.v1 import api_pb2 as v1_pb2
from exporter._proto.podresources.v1 import api_pb2_grpc as v1_grpc
from exporter._proto.podresources.v1alpha1 import api_pb2 as v1alpha1_pb2
from exporter._proto.podresources.v1alpha1 import api_pb2_grpc as v1alpha1_grpc
from simulator.kubelet import RATE_LIMITED, SimulatedKubelet
from simulator.scenario import ScenarioError, parse_scenario
from tests.support import Clock

SCENARIO = """
node: n1
kubelet: {restart_list_empty: 0.97, restart_allocatable_empty: 0.5}
allocatable:
  - {resource: nvidia.com/gpu, ids: [GPU-0, GPU-1, GPU-2, GPU-3], numa: [0]}
  - {resource: rdma/hca, ids: [mlx5_0, mlx5_1], numa: [1]}
plugin_down:
  - {resources: [rdma/hca], start: 20, end: 40}
pods:
  - name: trainer
    namespace: ml
    containers:
      - name: setup
        init: true
        devices: [{resource: nvidia.com/gpu, ids: [GPU-0]}]
      - name: proxy
        sidecar: true
      - name: logger
        sidecar: true
      - name: pytorch
        devices: [{resource: nvidia.com/gpu, ids: [GPU-0, GPU-1], numa: [0]}]
      - name: metrics
  - name: crashed
    namespace: ml
    failed: 50
    containers:
      - name: main
        devices: [{resource: nvidia.com/gpu, ids: [GPU-2], numa: [0]}]
        cpu_ids: [3]
"""
"""Enough pods for an order to show: trainer, crashed and twenty without devices."""
SCENARIO += "pod_sets:\n  - {prefix: web, count: 20, containers: [app, side]}\n"


class Kubelet:
    def __init__(self, kubelet: SimulatedKubelet, sock: Path, t: Clock, wall: Clock) -> None:
        self.sim, self.sock, self.t, self.wall = kubelet, sock, t, wall
        self.channel = grpc.aio.insecure_channel(
            f"unix://{sock}", options=[("grpc.use_local_subchannel_pool", 1)]
        )
        self.v1 = v1_grpc.PodResourcesListerStub(self.channel)
        self.v1alpha1 = v1alpha1_grpc.PodResourcesListerStub(self.channel)

    async def list(self) -> v1_pb2.ListPodResourcesResponse:
        answer: v1_pb2.ListPodResourcesResponse = await self.v1.List(
            v1_pb2.ListPodResourcesRequest()
        )
        return answer

    async def allocatable(self) -> v1_pb2.AllocatableResourcesResponse:
        answer: v1_pb2.AllocatableResourcesResponse = await self.v1.GetAllocatableResources(
            v1_pb2.AllocatableResourcesRequest()
        )
        return answer

    def reconnect(self) -> None:
        self.channel = grpc.aio.insecure_channel(
            f"unix://{self.sock}", options=[("grpc.use_local_subchannel_pool", 1)]
        )
        self.v1 = v1_grpc.PodResourcesListerStub(self.channel)


@pytest.fixture
async def kubelet(tmp_path: Path) -> AsyncIterator[Kubelet]:
    t, wall = Clock(0.0), Clock(500.0)
    sock = tmp_path / "kubelet.sock"
    sim = SimulatedKubelet(parse_scenario(SCENARIO), sock, clock=t, monotonic=wall, seed=7)
    await sim.start()
    k = Kubelet(sim, sock, t, wall)
    try:
        yield k
    finally:
        await k.channel.close(None)
        await sim.stop()


def _pods(answer: Any) -> dict[str, Any]:
    return {p.name: p for p in answer.pod_resources}


def _canonical(answer: v1_pb2.ListPodResourcesResponse) -> set[tuple[str, str, str, str]]:
    """(pod, container, resource, device) of every entry, order left out."""
    return {
        (p.name, c.name, d.resource_name, i)
        for p in answer.pod_resources
        for c in p.containers
        for d in c.devices
        for i in d.device_ids
    } | {(p.name, c.name, "", "") for p in answer.pod_resources for c in p.containers}


async def test_order_changes_from_call_to_call_not_the_content(kubelet: Kubelet) -> None:
    """K2 (C10): pods, containers and devices in a different order on each call."""
    answers = [await kubelet.list() for _ in range(8)]
    assert len({a.SerializeToString() for a in answers}) == 8
    assert len({tuple(p.name for p in a.pod_resources) for a in answers}) == 8
    assert len({frozenset(_canonical(a)) for a in answers}) == 1
    trainers = [_pods(a)["trainer"] for a in answers]
    pytorch = [next(c for c in t.containers if c.name == "pytorch") for t in trainers]
    device_orders = {tuple(d.device_ids[0] for d in c.devices) for c in pytorch}
    assert device_orders == {("GPU-0", "GPU-1"), ("GPU-1", "GPU-0")}
    app_orders = {tuple(c.name for c in t.containers[2:]) for t in trainers}
    assert app_orders == {("pytorch", "metrics"), ("metrics", "pytorch")}


async def test_a_fixed_order_when_the_scenario_turns_shuffling_off(kubelet: Kubelet) -> None:
    kubelet.sim.set_behaviour(shuffle=False)
    raw = {(await kubelet.list()).SerializeToString() for _ in range(5)}
    assert len(raw) == 1


async def test_one_entry_per_device_each_with_its_topology(kubelet: Kubelet) -> None:
    """K1: a container holding two GPUs gets two entries, in List and in allocatable; K11:
    NUMA node 0 arrives as `nodes { }`."""
    pytorch = next(
        c for c in _pods(await kubelet.list())["trainer"].containers if c.name == "pytorch"
    )
    assert sorted(list(d.device_ids) for d in pytorch.devices) == [["GPU-0"], ["GPU-1"]]
    for entry in pytorch.devices:
        assert text_format.MessageToString(entry.topology, as_one_line=True) == "nodes { }"
    allocatable = await kubelet.allocatable()
    assert sorted((d.resource_name, tuple(d.device_ids)) for d in allocatable.devices) == [
        ("nvidia.com/gpu", ("GPU-0",)),
        ("nvidia.com/gpu", ("GPU-1",)),
        ("nvidia.com/gpu", ("GPU-2",)),
        ("nvidia.com/gpu", ("GPU-3",)),
        ("rdma/hca", ("mlx5_0",)),
        ("rdma/hca", ("mlx5_1",)),
    ]
    assert {
        d.topology.nodes[0].ID for d in allocatable.devices if d.resource_name == "rdma/hca"
    } == {1}


async def test_init_containers_are_never_listed_sidecars_come_first(kubelet: Kubelet) -> None:
    """K8: the ordinary init container `setup` never appears (its GPU is the app
    container's); sidecar init containers are listed before the app containers."""
    for _ in range(6):
        names = [c.name for c in _pods(await kubelet.list())["trainer"].containers]
        assert "setup" not in names
        assert set(names[:2]) == {"proxy", "logger"} and set(names[2:]) == {"pytorch", "metrics"}


async def test_a_failed_pod_stays_with_its_containers_and_no_devices(kubelet: Kubelet) -> None:
    """K6: List reports all pods; a failed one keeps its containers, not its devices."""
    before = _pods(await kubelet.list())["crashed"]
    assert [list(d.device_ids) for d in before.containers[0].devices] == [["GPU-2"]]
    kubelet.t.now = 60.0
    after = _pods(await kubelet.list())["crashed"]
    assert [c.name for c in after.containers] == ["main"]
    assert list(after.containers[0].devices) == []
    assert list(after.containers[0].cpu_ids) == [3]


async def test_a_stopped_plugin_takes_all_its_devices_out_list_unchanged(kubelet: Kubelet) -> None:
    """K10: all of a plugin's devices leave allocatable at once, List is unchanged, they
    come back when it registers again."""

    def resources(a: v1_pb2.AllocatableResourcesResponse) -> list[str]:
        return sorted({d.resource_name for d in a.devices})

    listed = _canonical(await kubelet.list())
    assert resources(await kubelet.allocatable()) == ["nvidia.com/gpu", "rdma/hca"]
    kubelet.t.now = 30.0
    assert resources(await kubelet.allocatable()) == ["nvidia.com/gpu"]
    assert _canonical(await kubelet.list()) == listed
    kubelet.t.now = 40.0
    assert resources(await kubelet.allocatable()) == ["nvidia.com/gpu", "rdma/hca"]


async def test_a_stopped_kubelet_leaves_its_socket_and_refuses(kubelet: Kubelet) -> None:
    """K3: the file stays; connecting gives UNAVAILABLE until a new kubelet replaces it."""
    before = os.stat(kubelet.sock)
    await kubelet.sim.stop()
    assert kubelet.sock.exists()
    kubelet.reconnect()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kubelet.list()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "Connection refused" in (err.value.details() or "")
    await kubelet.sim.start()
    after = os.stat(kubelet.sock)
    assert (after.st_ino, after.st_ctime_ns) != (before.st_ino, before.st_ctime_ns)


async def test_after_a_restart_answers_are_empty_for_a_while(kubelet: Kubelet) -> None:
    """K4, C11: after a restart List (0.97 s, 1.36) and allocatable (0.5 s) answer
    successfully with nothing; the first start has no such window."""
    assert len((await kubelet.list()).pod_resources) == 22
    await kubelet.sim.restart()
    kubelet.reconnect()
    assert list((await kubelet.list()).pod_resources) == []
    assert list((await kubelet.allocatable()).devices) == []
    kubelet.wall.now += 0.5
    assert list((await kubelet.list()).pod_resources) == []
    assert len((await kubelet.allocatable()).devices) == 6
    kubelet.wall.now += 0.47
    assert len((await kubelet.list()).pod_resources) == 22


def test_the_window_defaults_are_the_newer_kubelets() -> None:
    behaviour = parse_scenario("node: n\n").kubelet
    assert (
        behaviour.shuffle,
        behaviour.restart_list_empty,
        behaviour.restart_allocatable_empty,
    ) == (
        True,
        0.97,
        0.5,
    )


async def test_one_token_bucket_for_every_client_method_and_version(kubelet: Kubelet) -> None:
    """K12: 100/s with a burst of 10, shared by v1, v1alpha1 and every method; failed calls
    (K13: Get for an unknown pod) spend tokens too."""
    for _ in range(4):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await kubelet.v1.Get(v1_pb2.GetPodResourcesRequest(pod_name="nope", pod_namespace="ml"))
        assert err.value.code() == grpc.StatusCode.UNKNOWN
        assert err.value.details() == "pod nope in namespace ml not found"
    for _ in range(3):
        answer = await kubelet.v1alpha1.List(v1alpha1_pb2.ListPodResourcesRequest())
        assert not any(
            "topology" in str(d)
            for p in answer.pod_resources
            for c in p.containers
            for d in c.devices
        )  # K13: v1alpha1 has no topology
    for _ in range(3):
        await kubelet.allocatable()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kubelet.list()  # the eleventh call within the same instant
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.value.details() == RATE_LIMITED
    kubelet.wall.now += 0.011  # one token back (a token every 10 ms)
    assert len((await kubelet.list()).pod_resources) == 22


@pytest.mark.parametrize(
    ("snippet", "problem"),
    [
        ("pods: [{name: p, containers: [{name: c, init: true, sidecar: true}]}]", "not both"),
        ("plugin_down: [{start: 3}]", "plugin_down[0].resources"),
        ("kubelet: {restart_list_empty: soon}", "kubelet.restart_list_empty"),
    ],
)
def test_scenario_errors_name_the_key(snippet: str, problem: str) -> None:
    with pytest.raises(ScenarioError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        parse_scenario(f"node: n\n{snippet}\n")


def test_the_documented_kubelet_part_is_a_scenario_that_says_what_the_comments_say() -> None:
    text = (Path(__file__).parent.parent / "docs" / "simulation.md").read_text()
    block = text.split("## The kubelet part", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    scenario = parse_scenario(block)
    trainer = scenario.pods[0]
    assert [c.name for c in trainer.pod.containers] == ["proxy", "pytorch", "log-shipper"]
    assert (trainer.sidecars, trainer.failed) == (1, 30.0)
    assert scenario.plugin_down[0].covers("rdma/hca_shared_devices_a", 60.0)
    assert scenario.kubelet.shuffle and scenario.kubelet.restart_list_empty == 0.97
