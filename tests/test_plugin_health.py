"""Device health as the device plugin reports it: a GPU leaves GetAllocatableResources mid-run
and comes back. Real gRPC to the simulated kubelet over a unix socket, the real client and
poller, the whole /metrics text as a user scrapes it."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from exporter.app import Exporter
from exporter.cycle.poller import Poller
from exporter.model import Device, DeviceReading, Sample, SourceResult
from exporter.podresources.client import PodResourcesClient
from exporter.settings.config import Config
from exporter.sinks.prometheus import render
from exporter.web.app import DevicesView
from simulator.kubelet import SimulatedKubelet
from simulator.scenario import parse_scenario
from tests.peers import chromium
from tests.support import Clock, StaticSource
from tests.support.cycle import make_poller

SCENARIO = """
node: node-1
allocatable:
  - {resource: nvidia.com/gpu, ids: [GPU-held, GPU-free, GPU-spare], numa: [0]}
  - {resource: nvidia.com/mig-1g.10gb, ids: [MIG-a], numa: [0]}
unhealthy:
  - {ids: [GPU-held, GPU-free], start: 30, end: 60}
pods:
  - name: train
    namespace: ml
    containers:
      - name: pytorch
        devices: [{resource: nvidia.com/gpu, ids: [GPU-held], numa: [0]}]
"""


def _gpu(uuid: str, parent: str = "") -> DeviceReading:
    device = Device(uuid, "gpu", "nvidia", "NVIDIA H100", "nvml", parent=parent)
    return DeviceReading(device, (Sample("hw.gpu.utilization", 0.5),))


READINGS = (
    _gpu("GPU-held"),
    _gpu("GPU-free"),
    _gpu("GPU-spare"),
    _gpu("GPU-mig-parent"),
    _gpu("MIG-a", parent="GPU-mig-parent"),
)


class Node:
    def __init__(self, kubelet: SimulatedKubelet, clock: Clock, sock: Path) -> None:
        self.kubelet, self.clock, self.sock = kubelet, clock, sock
        self.pollers: list[tuple[Poller, PodResourcesClient]] = []

    def exporter(self) -> Poller:
        """A freshly started exporter (no memory of earlier answers)."""
        client = PodResourcesClient(self.sock, clock=self.clock)
        source = StaticSource(SourceResult("nvml", READINGS))
        poller = make_poller(
            node="node-1", sources={"nvml": source}, client=client, clock=self.clock
        )
        self.pollers.append((poller, client))
        return poller


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    clock = Clock()
    sock = tmp_path / "kubelet.sock"
    kubelet = SimulatedKubelet(parse_scenario(SCENARIO), sock, clock=clock)
    await kubelet.start()
    node = Node(kubelet, clock, sock)
    try:
        yield node
    finally:
        for _, client in node.pollers:
            await client.close()
        await kubelet.stop()


async def _scrape(poller: Poller) -> dict[str, float]:
    """`name{labels}` -> value of the series this test checks, from the rendered text."""
    text = render(await poller.run_once()).text.decode()
    wanted = re.compile(
        r"^(hw_device_allocatable|hw_not_allocatable_devices|hw_gpu_utilization_ratio)"
        r"\{([^}]*)\} (\S+)$"
    )
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = wanted.match(line)
        if m:
            keep = ",".join(
                p for p in m[2].split(",") if p.split("=")[0] in ("hw_id", "hw_allocation_resource")
            )
            out[f"{m[1]}{{{keep}}}"] = float(m[3])
    return out


def _allocatable(uuid: str) -> str:
    return f'hw_device_allocatable{{hw_allocation_resource="nvidia.com/gpu",hw_id="{uuid}"}}'


NOT_ALLOCATABLE = 'hw_not_allocatable_devices{hw_allocation_resource="nvidia.com/gpu"}'


def _utilization(uuid: str) -> str:
    return f'hw_gpu_utilization_ratio{{hw_id="{uuid}"}}'


async def test_gpu_leaves_the_allocatable_list_and_comes_back(node: Node) -> None:
    poller = node.exporter()
    node.clock.now = 10
    before = await _scrape(poller)
    assert before[_allocatable("GPU-held")] == 1
    assert before[_allocatable("GPU-free")] == 1
    assert before[NOT_ALLOCATABLE] == 0

    # The plugin reports two GPUs unhealthy at 30 s: the very next cycle shows it.
    node.clock.now = 31
    during = await _scrape(poller)
    assert during[_allocatable("GPU-held")] == 0
    assert during[_allocatable("GPU-free")] == 0
    assert during[_allocatable("GPU-spare")] == 1
    assert during[NOT_ALLOCATABLE] == 2
    # Their metrics keep coming: NVML still sees them, and the pod still holds its GPU.
    assert during[_utilization("GPU-held")] == 0.5
    assert during[_utilization("GPU-free")] == 0.5

    node.clock.now = 61
    after = await _scrape(poller)
    assert after[_allocatable("GPU-held")] == 1
    assert after[_allocatable("GPU-free")] == 1
    assert after[NOT_ALLOCATABLE] == 0


async def test_a_mig_parent_is_never_reported_as_lost_capacity(node: Node) -> None:
    node.clock.now = 31
    scraped = await _scrape(node.exporter())
    assert (
        'hw_device_allocatable{hw_allocation_resource="nvidia.com/mig-1g.10gb",hw_id="MIG-a"}'
        in scraped
    )
    assert not any("GPU-mig-parent" in k for k in scraped if k.startswith("hw_device"))


async def test_an_exporter_started_during_the_outage_knows_only_held_devices(node: Node) -> None:
    """The allocatable list does not name a device that left it: a fresh exporter learns the
    resource of a held device from List, and cannot place a free one (documented)."""
    node.clock.now = 31
    scraped = await _scrape(node.exporter())
    assert scraped[_allocatable("GPU-held")] == 0
    assert _allocatable("GPU-free") not in scraped
    assert scraped[NOT_ALLOCATABLE] == 1


async def test_unknown_allocatable_list_reports_nothing(tmp_path: Path) -> None:
    """A kubelet with GetAllocatableResources off: allocatable or not cannot be told."""
    clock = Clock(31)
    sock = tmp_path / "k.sock"
    kubelet = SimulatedKubelet(
        parse_scenario(SCENARIO + "kubelet: {allocatable: false}\n"), sock, clock=clock
    )
    await kubelet.start()
    node = Node(kubelet, clock, sock)
    try:
        scraped = await _scrape(node.exporter())
    finally:
        for _, client in node.pollers:
            await client.close()
        await kubelet.stop()
    assert not any(k.startswith(("hw_device_allocatable", "hw_not_allocatable")) for k in scraped)
    assert scraped[_utilization("GPU-held")] == 0.5


async def test_landing_page_json_says_not_allocatable(node: Node) -> None:
    node.clock.now = 31
    poller = node.exporter()
    view = DevicesView()
    view.update(await poller.run_once())
    assert view.body is not None
    devices = {d["id"]: d for d in json.loads(view.body)["devices"]}
    assert devices["GPU-held"]["not_allocatable"] is True
    assert devices["GPU-held"]["resource"] == "nvidia.com/gpu"
    assert devices["GPU-spare"]["not_allocatable"] is False
    assert devices["GPU-mig-parent"]["not_allocatable"] is False


@pytest.mark.peer
async def test_landing_page_shows_the_badge_in_headless_chromium(tmp_path: Path) -> None:
    sock = tmp_path / "k.sock"
    scenario = parse_scenario(SCENARIO.replace("start: 30, end: 60", "start: 0"))
    kubelet = SimulatedKubelet(scenario, sock, clock=lambda: 1.0)
    await kubelet.start()
    config = Config(kubelet_socket=sock, listen_address=("127.0.0.1", 0), node_name="node-1")
    exporter = Exporter(config, sources={"nvml": StaticSource(SourceResult("nvml", READINGS))})
    await exporter.start()
    try:
        await exporter.wait_ready(10)
        dom = await asyncio.to_thread(chromium, exporter.url)
    finally:
        await exporter.stop()
        await kubelet.stop()
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", dom, re.S)
    badged = {
        m[1]
        for row in rows
        if (m := re.search(r"<code>(GPU-[a-z-]+)</code>", row)) and "not allocatable" in row
    }
    # Started during the outage: the free GPU's resource is unknown to it (see above).
    assert badged == {"GPU-held"}
