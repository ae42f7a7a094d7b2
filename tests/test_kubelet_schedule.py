"""The kubelet is asked at most every `--kubernetes.poll-interval`, in whole cycles, and at
once (at most every 5 s) when the devices or their processes change, with one more poll 5 s
later; a failed poll is retried the next cycle; gRPC's threads do not outlive a poll.
Against the simulated kubelet over real gRPC on a unix socket."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from exporter.cycle.poller import Poller
from exporter.model import (
    Device,
    DeviceReading,
    Holder,
    PodResourcesHealth,
    PodResourcesState,
    ProcessUsage,
    Sample,
    Snapshot,
    SourceResult,
)
from exporter.podresources.client import PodResourcesClient
from simulator.kubelet import SimulatedKubelet
from simulator.scenario import parse_scenario
from tests.support import Clock, StaticSource
from tests.support.cycle import make_poller

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


def _poller(
    client: PodResourcesClient, clock: Clock, every: float, source: StaticSource | None = None
) -> Poller:
    return make_poller(
        node="node-1",
        sources={"nvml": source or StaticSource(READINGS)},
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
    # cycles at scenario time 0, 1, ..., 10
    snapshots, lists = await _run(SCENARIO, tmp_path, {}, 11, every=5.0)
    assert lists == 3  # cycles 0, 5 and 10
    # The pod appears at 2.5 s; the labels follow at the next poll (5 s), not before.
    held = [
        s.devices[0].holder is not None and s.devices[0].holder.pod == "train" for s in snapshots
    ]
    assert held == [False] * 5 + [True] * 6
    assert snapshots[-1].podresources.connected


def _running(*pids: int) -> SourceResult:
    """READINGS with these processes on GPU-a."""
    return replace(READINGS, processes=tuple(ProcessUsage("GPU-a", pid) for pid in pids))


async def _run(
    scenario: str,
    tmp_path: Path,
    results: dict[int, SourceResult],
    cycles: int,
    *,
    every: float = 30.0,
    allocatable_interval: float = 5.0,
) -> tuple[list[Snapshot], int]:
    """One cycle a second for `cycles` cycles, the source answering `results[t]` from cycle
    t on (READINGS before); each cycle's snapshot, and the `List` calls."""
    clock, scenario_t = Clock(1000.0), Clock(0.0)
    sock = tmp_path / "kubelet.sock"
    kubelet = SimulatedKubelet(parse_scenario(scenario), sock, clock=scenario_t)
    await kubelet.start()
    client = PodResourcesClient(sock, clock=clock, allocatable_interval=allocatable_interval)
    source = StaticSource(results.get(0, READINGS))
    poller = _poller(client, clock, every=every, source=source)
    snapshots = []
    try:
        for t in range(cycles):
            source.result = results.get(t, source.result)
            snapshots.append(await poller.run_once())
            clock.now += 1.0
            scenario_t.now += 1.0
    finally:
        await poller.close()
        await kubelet.stop()
    return snapshots, _lists(client)


async def _cycles(
    scenario: str, tmp_path: Path, processes: dict[int, tuple[int, ...]], cycles: int
) -> tuple[list[Holder | None], int]:
    """GPU-a running `processes[t]` from cycle t on: its holder each cycle, and the `List`
    calls."""
    results = {t: _running(*pids) for t, pids in processes.items()}
    snapshots, lists = await _run(scenario, tmp_path, results, cycles)
    return [s.devices[0].holder for s in snapshots], lists


async def test_a_process_on_a_device_asks_the_kubelet_in_the_cycle_that_sees_it(
    tmp_path: Path,
) -> None:
    # The pod is listed from 2.5 s, its process runs from 3 s; the schedule alone would ask
    # the kubelet again at 30 s.
    holders, lists = await _cycles(SCENARIO, tmp_path, {3: (4242,)}, 12)
    held = [h is not None and h.pod == "train" for h in holders]
    assert held == [False] * 3 + [True] * 9  # labelled in the cycle that saw the process
    assert lists == 3  # cycle 0, cycle 3 (the process), cycle 8 (5 s later, to settle)


async def test_nothing_changing_leaves_the_kubelet_to_the_poll_interval(tmp_path: Path) -> None:
    holders, lists = await _cycles(SCENARIO, tmp_path, {}, 12)
    assert lists == 1  # cycle 0 only: the next is due at 30 s
    assert holders == [None] * 12  # the idle pod (listed from 2.5 s) waits for that poll


async def test_processes_that_change_every_cycle_ask_at_most_every_5s(tmp_path: Path) -> None:
    holders, lists = await _cycles(SCENARIO, tmp_path, {t: (5000 + t,) for t in range(21)}, 21)
    assert lists == 5  # cycles 0, 1, 6, 11, 16: what the fixed 5 s schedule cost
    assert [h is not None for h in holders] == [False] * 6 + [True] * 15


GONE = SCENARIO.replace("    start: 2.5\n", "    end: 7.5\n")
"""The pod, listed until 7.5 s: its process ends at 4 s (a deleted pod leaves List a few
seconds after its containers stop, control-plane.md)."""


async def test_a_pod_whose_process_ended_is_unlabelled_by_the_poll_5s_later(
    tmp_path: Path,
) -> None:
    holders, lists = await _cycles(GONE, tmp_path, {0: (4242,), 4: ()}, 12)
    held = [h is not None and h.pod == "train" for h in holders]
    # cycle 4: the process is gone, the kubelet is asked and still lists the pod; cycle 9
    # asks again and it is gone.
    assert held == [True] * 9 + [False] * 3
    assert lists == 3  # cycles 0, 4 and 9


UNHEALTHY = SCENARIO.replace("[GPU-a], numa: [0]}\npods:", "[GPU-a, GPU-b], numa: [0]}\npods:")
UNHEALTHY += """unhealthy:
  - {ids: [GPU-a], start: 2.5}
"""
"""The plugin reports GPU-a unhealthy from 2.5 s (it leaves GetAllocatableResources; GPU-b
stays, so the answer is not the empty one of a restarting kubelet)."""


def _with_xids(count: int) -> SourceResult:
    xid = Sample("hw.gpu.xid.errors", float(count), (("hw.gpu.xid", "48"),))
    (reading,) = READINGS.readings
    return replace(READINGS, readings=(DeviceReading(reading.device, (*reading.samples, xid)),))


async def test_an_xid_on_a_device_asks_the_kubelet_for_its_plugins_verdict(
    tmp_path: Path,
) -> None:
    # cycle 3: the XID 48 the plugin acted on
    snapshots, lists = await _run(
        UNHEALTHY, tmp_path, {3: _with_xids(1)}, 8, allocatable_interval=0.0
    )
    allocatable = [s.devices[0].allocatable for s in snapshots]
    assert allocatable == [True] * 3 + [False] * 5  # the verdict in the XID's own cycle
    assert lists == 2  # cycle 0, cycle 3; the settle poll is due at 8


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


@pytest.mark.peer
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

    async def poll(self, *, fresh_allocatable: bool = False) -> PodResourcesState:
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
