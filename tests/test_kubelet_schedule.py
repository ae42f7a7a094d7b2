"""The kubelet is asked at most every `--kubernetes.poll-interval`, in whole cycles; a
failed poll is retried the next cycle; gRPC's threads do not outlive a poll. Against the
simulated kubelet over real gRPC on a unix socket."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from exporter.model import (
    Device,
    DeviceReading,
    PodResourcesHealth,
    PodResourcesState,
    Sample,
    SourceResult,
)
from exporter.podresources.client import PodResourcesClient
from exporter.poller import Poller
from simulator.kubelet import SimulatedKubelet
from simulator.scenario import parse_scenario
from tests.support import Clock, StaticSource

SCENARIO = """
node: node-1
allocatable:
  - {resource: nvidia.com/gpu, ids: [GPU-a], numa: [0]}
pods:
  - name: train
    namespace: ml
    start: 2.5
    containers:
      - name: pytorch
        devices: [{resource: nvidia.com/gpu, ids: [GPU-a], numa: [0]}]
"""
"""A pod that the kubelet lists from scenario time 2.5 s on."""

READINGS = SourceResult(
    "nvml",
    (
        DeviceReading(
            Device("GPU-a", "gpu", "nvidia", "NVIDIA H100", "nvml"),
            (Sample("hw.gpu.utilization", 0.5),),
        ),
    ),
)


def _poller(client: PodResourcesClient, clock: Clock, every: float) -> Poller:
    return Poller(
        node="node-1",
        sources={"nvml": StaticSource(READINGS)},
        client=client,
        clock=clock,
        interval=1.0,
        kubelet_every=every,
    )


def _lists(client: PodResourcesClient) -> int:
    return client.health().requests_total.get(("List", "OK"), 0)


async def test_polled_every_fifth_cycle_at_1s_and_the_pod_lags_until_the_next_poll(
    tmp_path: Path,
) -> None:
    clock, scenario_t = Clock(1000.0), Clock(0.0)
    sock = tmp_path / "kubelet.sock"
    kubelet = SimulatedKubelet(parse_scenario(SCENARIO), sock, clock=scenario_t)
    await kubelet.start()
    client = PodResourcesClient(sock, clock=clock, allocatable_interval=5.0)
    poller = _poller(client, clock, every=5.0)
    holders = []
    try:
        for _ in range(11):  # cycles at scenario time 0, 1, ..., 10
            snapshot = await poller.run_once()
            holders.append(snapshot.devices[0].holder)
            clock.now += 1.0
            scenario_t.now += 1.0
    finally:
        await poller.close()
        await kubelet.stop()
    assert _lists(client) == 3  # cycles 0, 5 and 10
    # The pod appears at 2.5 s; the labels follow at the next poll (5 s), not before.
    held = [h is not None and h.pod == "train" for h in holders]
    assert held == [False] * 5 + [True] * 6
    assert snapshot.podresources.connected


async def test_a_failed_poll_is_retried_the_next_cycle(tmp_path: Path) -> None:
    clock, scenario_t = Clock(1000.0), Clock(10.0)
    sock = tmp_path / "kubelet.sock"
    kubelet = SimulatedKubelet(parse_scenario(SCENARIO), sock, clock=scenario_t)
    client = PodResourcesClient(sock, clock=clock)
    poller = _poller(client, clock, every=5.0)
    try:
        first = await poller.run_once()  # no socket yet
        await kubelet.start()
        clock.now += 1.0
        second = await poller.run_once()
    finally:
        await poller.close()
        await kubelet.stop()
    assert not first.podresources.connected and first.devices[0].holder is None
    assert second.podresources.connected
    assert second.devices[0].holder is not None and second.devices[0].holder.pod == "train"


PROBE = """
import asyncio, sys
from pathlib import Path
from exporter.podresources.client import PodResourcesClient

def grpc_threads():
    names = [(t / "comm").read_text().strip() for t in Path("/proc/self/task").iterdir()]
    return sum(n.startswith(("event_engine", "grpc_global", "lifeguard")) for n in names)

async def main():
    client = PodResourcesClient(sys.argv[1])
    state = await client.poll()
    during = grpc_threads()
    await client.close_channel()
    await asyncio.sleep(0.5)  # gRPC ends its threads after the channel's last reference
    after = grpc_threads()
    again = await client.poll()
    await client.close()
    print(len(state.pods), during, after, len(again.pods))

asyncio.run(main())
"""


async def test_grpc_threads_end_when_the_channel_is_closed_between_polls(
    tmp_path: Path,
) -> None:
    """In a process of its own: this one runs the simulated kubelet's gRPC server."""
    sock = tmp_path / "kubelet.sock"
    kubelet = SimulatedKubelet(parse_scenario(SCENARIO), sock, clock=Clock(10.0))
    await kubelet.start()
    try:
        probe = await asyncio.create_subprocess_exec(
            sys.executable, "-c", PROBE, str(sock), stdout=asyncio.subprocess.PIPE
        )
        out, _ = await asyncio.wait_for(probe.communicate(), 60)
    finally:
        await kubelet.stop()
    pods, during, after, pods_again = (int(x) for x in out.split())
    assert pods == pods_again == 1  # a new channel answers as the first did
    assert during >= 2  # gRPC's event engine and timer run while the channel is open ...
    assert after == 0  # ... and none is left once it is closed


class HoldingKubelet:
    """A client that answers every poll and, for its first three, holds an answer back
    (a restarted kubelet's empty answer replaced by the last good one)."""

    def __init__(self) -> None:
        self.polls = 0

    async def poll(self) -> PodResourcesState:
        self.polls += 1
        return PodResourcesState(api_version="v1")

    def health(self) -> PodResourcesHealth:
        return PodResourcesHealth(held=("List",) if self.polls <= 3 else ())

    async def close_channel(self) -> None:
        return None  # no channel

    async def close(self) -> None:
        return None


async def test_while_an_answer_is_held_the_kubelet_is_asked_every_cycle() -> None:
    kubelet = HoldingKubelet()
    poller = _poller(kubelet, Clock(1000.0), every=5.0)  # type: ignore[arg-type]
    try:
        for _ in range(10):
            await poller.run_once()
    finally:
        await poller.close()
    # cycles 0-3 ask (after each of the first three, held, the next cycle asks again),
    # then five cycles on: cycle 8
    assert kubelet.polls == 5
