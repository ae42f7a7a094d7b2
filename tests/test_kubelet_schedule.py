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

from exporter.cycle.collect import Collect
from exporter.cycle.pipeline import Cycle, Pipeline
from exporter.cycle.poller import Poller
from exporter.kubeapi.pods import PodMeta
from exporter.kubeapi.watcher import PodWatcher
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
from exporter.podresources.schedule import KubeletSchedule
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
from exporter.podresources.schedule import KubeletSchedule

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

    def socket_changed(self) -> bool:
        return False  # no socket: no kubelet restarts

    def restarting(self) -> bool:
        return False

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


TWO_PODS = SCENARIO.replace(
    "pods:\n",
    """pods:
  - name: serve
    namespace: ml
    containers:
      - name: web
        devices: [{resource: nvidia.com/gpu, ids: [GPU-b], numa: [0]}]
""",
).replace("ids: [GPU-a], numa: [0]}\npods:", "ids: [GPU-a, GPU-b], numa: [0]}\npods:")
"""`serve` holds GPU-b throughout; `train` (GPU-a) is listed from 2.5 s."""


async def test_a_restarted_kubelet_is_asked_in_the_cycle_that_sees_its_new_socket(
    tmp_path: Path,
) -> None:
    """The kubelet restarts on the same path between cycles 3 and 4 (a new file): cycle 4
    asks it although the interval (30 s) is far away. Its first answer is its restart
    window's empty one (held: serve keeps its GPU); the cycles after ask again until the
    window ends, and `train`, listed since 2.5 s, is labelled from cycle 5 on."""
    clock, scenario_t = Clock(1000.0), Clock(0.0)
    sock = tmp_path / "kubelet.sock"
    kubelet = SimulatedKubelet(parse_scenario(TWO_PODS), sock, clock=scenario_t, monotonic=clock)
    await kubelet.start()
    client = PodResourcesClient(sock, clock=clock)
    poller = _poller(client, clock, every=30.0)
    held: list[set[str]] = []
    try:
        for t in range(8):
            if t == 4:
                await kubelet.restart()
            snapshot = await poller.run_once()
            held.append({h.pod for d in snapshot.allocations for h in (d.holder,) if h})
            clock.now += 1.0
            scenario_t.now += 1.0
    finally:
        await poller.close()
        await kubelet.stop()
    assert held[:5] == [{"serve"}] * 5  # cycle 4: the new socket's empty answer, held
    assert held[5:] == [{"serve", "train"}] * 3
    # cycle 0; from cycle 4 every cycle while the socket is new (5 s): what a restart
    # costs. Two of them answer the new socket (the poll at it, and the one to settle).
    assert _lists(client) == 5
    assert client_schedule(poller).why == {"socket": 2}


def client_schedule(poller: Poller) -> KubeletSchedule:
    collect = poller.pipeline.collect
    assert isinstance(collect, Collect)
    return collect.kubelet


class Pods:
    """A pod feed as the schedule reads one (`PodChanges`): events counted, waited for."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.changes = 0
        self.changed_at = 0.0
        self._changed = asyncio.Event()

    def event(self) -> None:
        self.changes += 1
        self.changed_at = self.clock()
        self._changed.set()

    async def wait_change(self, seen: int) -> None:
        while self.changes == seen:
            self._changed.clear()
            await self._changed.wait()


async def test_a_pod_event_asks_the_kubelet_between_cycles_at_most_every_5s(
    tmp_path: Path,
) -> None:
    """`news()` (what the poller waits for between cycles): a pod event, 0.5 s without
    another (the debounce) and a poll; its answer differs (`train` listed since 2.5 s): news, the cycle runs now.
    Another event at once: its poll waits until 5 s after the last; the same answer is no
    news. The interval (30 s) is never reached."""
    clock, scenario_t = Clock(1000.0), Clock(3.0)
    sock = tmp_path / "kubelet.sock"
    kubelet = SimulatedKubelet(parse_scenario(SCENARIO), sock, clock=scenario_t)
    await kubelet.start()
    client = PodResourcesClient(sock, clock=clock, allocatable_interval=60.0)
    pods = Pods(clock)

    async def sleep(seconds: float) -> None:
        clock.now += seconds
        await asyncio.sleep(0)

    schedule = KubeletSchedule(client, every=30, stale_after=300.0, pods=pods, clock=clock,
                               sleep=sleep)  # fmt: skip
    try:
        kubelet.scenario = parse_scenario(SCENARIO.replace("    start: 2.5\n", "    start: 9\n"))
        first, _ = await schedule.state(schedule.start(), clock(), 5.0)  # cycle 0 at 1000
        assert first is not None and first.pods == ()
        kubelet.scenario = parse_scenario(SCENARIO)  # train is listed now
        news = asyncio.create_task(schedule.news())
        await asyncio.sleep(0)
        assert not news.done()  # nothing happened: no poll
        pods.event()
        await asyncio.wait_for(news, 5)
        assert clock() == 1000.5  # the debounce
        assert [p.name for p in schedule._state.pods] == ["train"]  # type: ignore[union-attr]
        pods.event()  # another, at once: its poll waits for the 5 s bound
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(schedule.news(), 0.5)  # the same answer: no news
        assert clock() == 1010.5  # and one more 5 s later, to settle: no news either
    finally:
        await schedule.close()
        await kubelet.stop()
    assert _lists(client) == 4  # 1000, 1000.5 (news), 1005.5 and 1010.5 (no news)
    assert schedule.why == {"pods": 3}
    allocatable = client.health().requests_total.get(("GetAllocatableResources", "OK"), 0)
    assert allocatable == 1  # a pod event asks List alone (a device change: both)


async def test_a_feed_that_never_goes_quiet_is_answered_5s_after_it_was_first_seen(
    tmp_path: Path,
) -> None:
    """Pod events every 0.2 s (a node in a rollout): no 0.5 s of quiet ever comes, and the
    poll comes `soonest` (5 s) after the schedule first saw them."""
    clock = Clock(1000.0)
    sock = tmp_path / "kubelet.sock"
    kubelet = SimulatedKubelet(parse_scenario(SCENARIO), sock, clock=Clock(3.0))
    await kubelet.start()
    pods = Pods(clock)

    async def busy(seconds: float) -> None:  # a pod event every 0.2 s while the schedule waits
        for _ in range(round(seconds / 0.2)):
            clock.now += 0.2
            pods.event()
        await asyncio.sleep(0)

    client = PodResourcesClient(sock, clock=clock)
    schedule = KubeletSchedule(client, every=30, stale_after=300.0, pods=pods, clock=clock,
                               sleep=busy)  # fmt: skip
    try:
        pods.event()
        await asyncio.wait_for(schedule.news(), 5)  # the first answer is news
    finally:
        await schedule.close()
        await kubelet.stop()
    assert clock() == pytest.approx(1005.0)
    assert _lists(client) == 1


async def test_pod_events_are_counted_by_the_pod_watcher() -> None:
    """The feed side of `PodChanges`: every event counts (a MODIFIED pod whose metadata is
    the same: its containers started), a replace only when it differs and the feed had
    synced before (the first list is the feed starting, not news)."""
    watcher = PodWatcher(lambda: None, "node-1")  # type: ignore[arg-type,return-value]
    pod = PodMeta("ml", "train", "uid-1")
    waiting = asyncio.create_task(watcher.wait_change(0))
    watcher.replace({"uid-0": PodMeta("ml", "serve", "uid-0")})  # the first list
    watcher.synced.set()
    watcher.replace(dict(watcher.pods))  # the same again: no change
    await asyncio.sleep(0)
    assert watcher.changes == 0 and not waiting.done()
    watcher.apply("ADDED", pod)
    await asyncio.wait_for(waiting, 1)
    watcher.apply("MODIFIED", pod)
    watcher.replace(dict(watcher.pods))  # a replay of what the cache has
    watcher.apply("DELETED", pod)
    watcher.replace({})  # a replay without serve: it left while the feed was down
    assert watcher.changes == 4


class NewsOnce:
    """The collect step of a poller whose kubelet has news once, right after the first
    cycle."""

    name = "collect"
    source_timeout = 1.0
    restart_required: dict[str, str] = {}

    def __init__(self) -> None:
        self.cycles = 0
        self.told = False
        self.second = asyncio.Event()

    async def run(self, cycle: Cycle) -> None:
        self.cycles += 1
        if self.cycles == 2:
            self.second.set()

    async def news(self) -> None:
        if self.told:
            await asyncio.Future()
        self.told = True

    async def close(self, timeout: float) -> dict[str, str]:
        return {}


async def test_the_poller_runs_the_next_cycle_at_once_on_the_kubelets_news() -> None:
    collect = NewsOnce()
    poller = Poller(Pipeline(collect, [], node="n"), interval=60.0)
    stop = asyncio.Event()
    task = asyncio.create_task(poller.run_forever(stop))
    try:
        await asyncio.wait_for(collect.second.wait(), 5)
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
    assert poller.early == 1 and collect.cycles == 2  # not 60 s later
