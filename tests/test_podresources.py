"""The real PodResources client against the simulated kubelet over a real unix socket."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from exporter._proto.podresources.v1 import api_pb2 as v1_pb2
from exporter.model import Pod
from exporter.podresources import answers as podresources_answers
from exporter.podresources.client import PodResourcesClient, PodResourcesError
from exporter.podresources.parse import parse_list
from simulator.kubelet import GET_DISABLED, SimulatedKubelet
from simulator.scenario import parse_scenario
from tests.support import Clock

SCENARIO = """
node: n1
allocatable:
  - {resource: nvidia.com/gpu, ids: [GPU-a, GPU-b], numa: [0]}
pods:
  - name: p1
    namespace: ns1
    containers:
      - name: c1
        devices: [{resource: nvidia.com/gpu, ids: [GPU-a], numa: [0, 1]}]
        cpu_ids: [4, 5]
        memory: [{type: hugepages-1Gi, size: 1073741824, numa: [1]}]
        claims:
          - name: claim-a
            namespace: ns1
            resources:
              - {driver: gpu.nvidia.com, pool: n1, device: gpu-1, cdi: ["nvidia.com/gpu=gpu-1"], share_id: "s1"}
      - name: sidecar
  - name: later
    namespace: ns2
    start: 10
    containers: [{name: c, devices: [{resource: nvidia.com/gpu, ids: [GPU-b]}]}]
"""


@pytest.fixture
def sock(tmp_path: Path) -> Path:
    return tmp_path / "pod-resources" / "kubelet.sock"


async def test_v1_list_and_allocatable(sock: Path) -> None:
    kubelet = SimulatedKubelet(parse_scenario(SCENARIO), sock, clock=lambda: 0.0)
    await kubelet.start()
    client = PodResourcesClient(sock)
    try:
        state = await client.poll()
    finally:
        await client.close()
        await kubelet.stop()
    assert state.api_version == "v1"
    assert state.allocatable_known
    assert [(d.resource_name, d.device_ids, d.numa_nodes) for d in state.allocatable] == [
        ("nvidia.com/gpu", ("GPU-a", "GPU-b"), (0,))
    ]
    (pod,) = state.pods  # `later` starts at t=10
    assert (pod.name, pod.namespace) == ("p1", "ns1")
    c1, sidecar = pod.containers
    assert c1.devices[0].device_ids == ("GPU-a",)
    assert c1.devices[0].numa_nodes == (0, 1)
    assert c1.cpu_ids == (4, 5)
    assert c1.memory[0].memory_type == "hugepages-1Gi"
    assert c1.memory[0].size_bytes == 1 << 30
    assert c1.memory[0].numa_nodes == (1,)
    claim = c1.dynamic_resources[0]
    assert (claim.claim_name, claim.claim_namespace) == ("claim-a", "ns1")
    res = claim.claim_resources[0]
    assert (res.driver_name, res.pool_name, res.device_name, res.share_id) == (
        "gpu.nvidia.com",
        "n1",
        "gpu-1",
        "s1",
    )
    assert res.cdi_devices == ("nvidia.com/gpu=gpu-1",)
    assert sidecar.devices == ()
    health = client.health()
    assert health.requests_total[("List", "OK")] == 1
    assert health.requests_total[("GetAllocatableResources", "OK")] == 1


async def test_pod_set_changes_over_time(sock: Path) -> None:
    clock = Clock()
    kubelet = SimulatedKubelet(parse_scenario(SCENARIO), sock, clock=clock)
    await kubelet.start()
    client = PodResourcesClient(sock)
    try:
        assert [p.name for p in (await client.poll()).pods] == ["p1"]
        clock.now = 11
        assert [p.name for p in (await client.poll()).pods] == ["p1", "later"]
    finally:
        await client.close()
        await kubelet.stop()


async def test_get_and_get_disabled(sock: Path) -> None:
    kubelet = SimulatedKubelet(parse_scenario(SCENARIO), sock, clock=lambda: 0.0)
    await kubelet.start()
    client = PodResourcesClient(sock)
    try:
        pod = await client.get("p1", "ns1")
        assert [c.name for c in pod.containers] == ["c1", "sidecar"]
        with pytest.raises(PodResourcesError, match="pod nope in namespace ns1 not found"):
            await client.get("nope", "ns1")
        kubelet.set_behaviour(get=False)
        with pytest.raises(PodResourcesError) as err:
            await client.get("p1", "ns1")
        assert err.value.message == GET_DISABLED
        assert err.value.code == "UNKNOWN"
        # List keeps working on a kubelet without the Get gate.
        assert [p.name for p in (await client.poll()).pods] == ["p1"]
    finally:
        await client.close()
        await kubelet.stop()


async def test_v1alpha1_only_kubelet_then_v1_appears(sock: Path) -> None:
    scenario = parse_scenario(SCENARIO + "kubelet: {api: v1alpha1}\n")
    kubelet = SimulatedKubelet(scenario, sock, clock=lambda: 0.0)
    await kubelet.start()
    clock = Clock()
    client = PodResourcesClient(sock, clock=clock, v1_retry_interval=60)
    try:
        state = await client.poll()
        assert state.api_version == "v1alpha1"
        assert not state.allocatable_known
        (pod,) = state.pods
        assert pod.containers[0].devices[0].device_ids == ("GPU-a",)
        assert pod.containers[0].cpu_ids == ()  # v1alpha1 has no CPUs/topology
        assert client.health().requests_total[("List", "UNIMPLEMENTED")] == 1
        # Still v1alpha1 within the retry interval: no v1 call is wasted.
        clock.now = 30
        assert (await client.poll()).api_version == "v1alpha1"
        assert client.health().requests_total[("List", "UNIMPLEMENTED")] == 1
        # The kubelet is upgraded (restarts with v1); after the interval we move back.
        await kubelet.restart(api="v1")
        clock.now = 61
        state = await client.poll()
        assert state.api_version == "v1"
        assert state.allocatable_known
    finally:
        await client.close()
        await kubelet.stop()


async def test_restart_on_the_same_path(sock: Path) -> None:
    """A stopped kubelet leaves its socket behind (connect: UNAVAILABLE); the restarted
    one answers empty for a while, and the client holds the last good answer meanwhile
    (real kubelet K3, K4; real kubelet C11)."""
    wall = Clock(100.0)
    kubelet = SimulatedKubelet(parse_scenario(SCENARIO), sock, clock=lambda: 0.0, monotonic=wall)
    await kubelet.start()
    client = PodResourcesClient(sock, timeout=2)
    try:
        assert (await client.poll()).pods
        await kubelet.stop()
        assert sock.exists()
        with pytest.raises(PodResourcesError) as err:
            await client.poll()
        assert err.value.code == "UNAVAILABLE"
        await kubelet.start()
        state = await client.poll()  # the kubelet answers nothing: held
        assert [p.name for p in state.pods] == ["p1"]
        assert [d.device_ids for d in state.allocatable] == [("GPU-a", "GPU-b")]
        assert client.health().held == ("GetAllocatableResources", "List")
        assert client.health().requests_total[("List", "OK")] == 2
        wall.now += 1.0  # past the kubelet's window: its own answer again
        assert [p.name for p in (await client.poll()).pods] == ["p1"]
        assert client.health().connected
        assert client.health().held == ()
    finally:
        await client.close()
        await kubelet.stop()


async def test_socket_absent_at_start_then_appears(sock: Path) -> None:
    client = PodResourcesClient(sock, timeout=2)
    try:
        with pytest.raises(PodResourcesError, match="does not exist"):
            await client.poll()
        assert not client.health().connected
        kubelet = SimulatedKubelet(parse_scenario(SCENARIO), sock, clock=lambda: 0.0)
        await kubelet.start()
        try:
            assert [p.name for p in (await client.poll()).pods] == ["p1"]
        finally:
            await kubelet.stop()
    finally:
        await client.close()


async def test_rate_limit_backs_off_and_recovers(sock: Path) -> None:
    scenario = parse_scenario(SCENARIO + "kubelet: {qps: 0.0001, burst: 3}\n")
    kubelet = SimulatedKubelet(scenario, sock, clock=lambda: 0.0)
    await kubelet.start()
    clock = Clock()
    client = PodResourcesClient(
        sock, clock=clock, backoff_initial=1.0, backoff_max=8.0, allocatable_interval=60.0
    )
    try:
        await client.poll()  # List + GetAllocatableResources: 2 of 3 tokens
        await client.poll()  # List: the last token
        with pytest.raises(PodResourcesError) as err:
            await client.poll()
        assert err.value.code == "RESOURCE_EXHAUSTED"
        assert "rejected by rate limit" in err.value.message
        served = dict(kubelet.requests)
        # During back-off the client makes no call at all.
        clock.now = 0.5
        with pytest.raises(PodResourcesError) as err:
            await client.poll()
        assert err.value.code == "BACKOFF"
        assert kubelet.requests == served
        # Back-off doubles on the next rejection...
        clock.now = 1.1
        with pytest.raises(PodResourcesError):
            await client.poll()
        clock.now = 2.5
        with pytest.raises(PodResourcesError) as err:
            await client.poll()
        assert err.value.code == "BACKOFF"
        # ...and a kubelet with tokens again is read normally.
        kubelet.set_behaviour(qps=100.0, burst=10)
        clock.now = 3.2
        assert (await client.poll()).pods
    finally:
        await client.close()
        await kubelet.stop()


def test_token_bucket_matches_kubelet_numbers() -> None:
    from simulator.kubelet import TokenBucket

    clock = Clock()
    bucket = TokenBucket(100, 10, clock)
    assert sum(bucket.allow() for _ in range(20)) == 10  # burst 10
    clock.now = 0.05  # 100 qps refills 5 tokens in 50 ms
    assert sum(bucket.allow() for _ in range(20)) == 5


async def test_slow_kubelet_past_the_deadline(sock: Path) -> None:
    scenario = parse_scenario(SCENARIO + "kubelet: {latency: 1.0}\n")
    kubelet = SimulatedKubelet(scenario, sock, clock=lambda: 0.0)
    await kubelet.start()
    client = PodResourcesClient(sock, timeout=0.2)
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(PodResourcesError) as err:
            await client.poll()
        assert err.value.code == "DEADLINE_EXCEEDED"
        assert loop.time() - started < 0.9  # the deadline, not the kubelet, ended the call
        kubelet.set_behaviour(latency=0.0)
        assert (await client.poll()).pods
    finally:
        await client.close()
        await kubelet.stop()


@pytest.mark.slow
async def test_list_larger_than_grpc_default_4mib(sock: Path) -> None:
    ids = ", ".join(f"GPU-{i:08x}-0000-4000-8000-{i:012x}" for i in range(40))
    scenario = parse_scenario(
        "node: big\npod_sets:\n"
        "  - prefix: a-rather-long-pod-name-prefix-like-real-controllers-make\n"
        "    namespace: some-team-namespace\n    count: 2500\n"
        f"    containers: [{{name: main, devices: [{{resource: nvidia.com/gpu.shared, ids: [{ids}]}}]}}]\n"
    )
    kubelet = SimulatedKubelet(scenario, sock, clock=lambda: 0.0)
    await kubelet.start()
    small = PodResourcesClient(sock, max_message_bytes=4 * 1024 * 1024, timeout=20)
    client = PodResourcesClient(sock, timeout=20)
    try:
        with pytest.raises(PodResourcesError) as err:
            await small.poll()
        assert err.value.code == "RESOURCE_EXHAUSTED"
        assert "larger than max" in err.value.message
        state = await client.poll()
        assert len(state.pods) == 2500
        assert len(state.pods[-1].containers[0].devices[0].device_ids) == 40
    finally:
        await small.close()
        await client.close()
        await kubelet.stop()


async def test_a_shuffled_list_is_parsed_only_when_its_content_changes(
    sock: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kubelet sends pods, containers and devices in a new order on each call (real
    kubelet K2): the same state is not parsed again, and the same objects are handed on."""
    parsed: list[bytes] = []

    def counting_parse(response_type: Any, raw: bytes, invalid: list[str]) -> tuple[Pod, ...]:
        parsed.append(raw)
        return parse_list(response_type, raw, invalid)

    monkeypatch.setattr(podresources_answers, "parse_list", counting_parse)
    scenario = SCENARIO + (
        "pod_sets:\n  - {prefix: web, count: 30, containers: [app, side]}\n"
        "  - {prefix: eight, count: 2, containers: [{name: c, devices: "
        "[{resource: nvidia.com/gpu, ids: [G0, G1, G2, G3, G4, G5, G6, G7], numa: [0, 1]}]}]}\n"
    )
    clock = Clock()
    kubelet = SimulatedKubelet(parse_scenario(scenario), sock, clock=clock)
    kubelet.set_behaviour(rate_limit=False)  # twelve polls back to back
    await kubelet.start()
    client = PodResourcesClient(sock)
    answers: list[bytes] = []
    real_call = client._call

    async def recording_call(method: str, rpc: Any, request: Any) -> Any:
        answer = await real_call(method, rpc, request)
        if method == "List":
            answers.append(answer)
        return answer

    client._call = recording_call  # type: ignore[method-assign]
    try:
        first = await client.poll()
        same = [await client.poll() for _ in range(10)]
        clock.now = 11.0  # `later` has started: a different answer
        grown = await client.poll()
    finally:
        await client.close()
        await kubelet.stop()
    assert len(set(answers[:11])) == 11  # the kubelet's bytes differed every time
    assert all(state.pods is first.pods for state in same)
    assert [p.name for p in grown.pods][:2] == ["eight-0", "eight-1"]
    assert "later" in [p.name for p in grown.pods]
    assert len(parsed) == 2 and parsed[1] == answers[-1]  # the first answer, then `later`
    (eight,) = first.pods[0].containers
    assert [(d.resource_name, d.device_ids, d.numa_nodes) for d in eight.devices] == [
        ("nvidia.com/gpu", tuple(f"G{i}" for i in range(8)), (0, 1))
    ]  # eight entries of one device each, merged back per resource and NUMA nodes


async def test_allocatable_is_asked_at_most_every_interval_and_parsed_when_it_changes(
    sock: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plugin's health report reaches the exporter within `allocatable_interval` (5 s in
    the exporter); between calls the last answer stands, and an unchanged answer is not
    parsed again."""
    parsed: list[bytes] = []
    real = v1_pb2.AllocatableResourcesResponse.FromString

    def counting_parse(raw: bytes) -> Any:
        parsed.append(raw)
        return real(raw)

    monkeypatch.setattr(v1_pb2.AllocatableResourcesResponse, "FromString", counting_parse)
    scenario = SCENARIO + "unhealthy:\n  - {ids: [GPU-b], start: 3}\n"
    clock = Clock()
    kubelet = SimulatedKubelet(parse_scenario(scenario), sock, clock=clock)
    await kubelet.start()
    client = PodResourcesClient(sock, clock=clock, allocatable_interval=5.0)
    healthy: dict[float, tuple[str, ...]] = {}
    try:
        for t in (0.0, 1.0, 2.0, 4.0, 5.0, 6.0, 10.0):
            clock.now = t
            state = await client.poll()
            healthy[t] = tuple(i for d in state.allocatable for i in d.device_ids)
    finally:
        await client.close()
        await kubelet.stop()
    requests = client.health().requests_total
    assert requests[("GetAllocatableResources", "OK")] == 3  # at 0, 5 and 10 s
    assert requests[("List", "OK")] == 7
    both, one = ("GPU-a", "GPU-b"), ("GPU-a",)
    # GPU-b turns unhealthy at 3 s; the exporter learns it at the 5 s call.
    assert healthy == {0.0: both, 1.0: both, 2.0: both, 4.0: both, 5.0: one, 6.0: one, 10.0: one}
    assert len(parsed) == 2 and parsed[0] != parsed[1]  # the 10 s answer is the 5 s one


async def test_a_restarted_kubelet_gets_a_new_channel_even_on_a_reused_inode(sock: Path) -> None:
    """A kubelet restart recreates its socket, and the filesystem may hand the freed inode
    number straight back (it does here). Keyed on the inode alone, the client kept its
    channel and sent the next call down the dead connection ("Stream removed", a failed
    cycle, now and then); keyed on the file's creation too, it rebuilds the channel."""
    kubelet = SimulatedKubelet(parse_scenario(SCENARIO), sock, clock=lambda: 0.0)
    await kubelet.start()
    client = PodResourcesClient(sock)
    try:
        await client.poll()
        before = (os.stat(sock).st_ino, client._channel)  # the channel: nothing else shows it
        await kubelet.restart(api="v1")
        if os.stat(sock).st_ino != before[0]:
            pytest.skip("this filesystem gave the new socket a new inode number")
        await client.poll()
        assert client._channel is not None and client._channel is not before[1]
    finally:
        await client.close()
        await kubelet.stop()
