"""The running exporter: cycle isolation, label semantics, HTTP endpoints, landing page."""

from __future__ import annotations

import asyncio
import gzip
import threading
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.app import Exporter
from exporter.cycle import steps as steps_module
from exporter.join import join
from exporter.model import (
    Container,
    ContainerDevices,
    Holder,
    Pod,
    PodResourcesState,
    SourceResult,
)
from exporter.sources import Source
from simulator.kubelet import SimulatedKubelet
from simulator.scenario import parse_scenario
from tests.peers import chromium
from tests.support import Clock, FixedKubelet, StaticSource, metrics_text, one_cycle
from tests.support.cycle import make_poller
from tests.support.exporter_config import config_for
from tests.support.fake_gpu import GPU, SCENARIO, gpu_result


class Broken:
    def collect(self) -> SourceResult:
        raise RuntimeError("driver fell off the bus")

    def close(self) -> None:
        return None


class Hung:
    def __init__(self) -> None:
        self.release = threading.Event()

    def collect(self) -> SourceResult:
        self.release.wait(10)
        return SourceResult("hung")

    def close(self) -> None:
        self.release.set()


def parse(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    return {
        f.name: [(s.labels, s.value) for s in f.samples]
        for f in text_string_to_metric_families(text)
    }


async def test_label_values_are_escaped_and_parse_back(tmp_path: Path) -> None:
    snap = await one_cycle(
        parse_scenario(SCENARIO), tmp_path / "k.sock", {"fake": StaticSource(gpu_result())}
    )
    families = parse(metrics_text(snap))
    ((labels, value),) = families["hw_gpu_utilization_ratio"]
    assert labels["k8s_pod_name"] == 'weird "pod"\\name'
    assert labels["k8s_container_name"] == "c\nnewline"
    assert labels["k8s_node_name"] == "test-node"
    assert value == 0.5


async def test_deleted_pod_is_gone_the_next_cycle(tmp_path: Path) -> None:
    scenario = parse_scenario(SCENARIO)
    sources = {"fake": StaticSource(gpu_result())}
    before = parse(metrics_text(await one_cycle(scenario, tmp_path / "a.sock", sources, t=0)))
    after = parse(metrics_text(await one_cycle(scenario, tmp_path / "b.sock", sources, t=6)))
    assert len(before["hw_allocation_info"]) == 1
    assert "hw_allocation_info" not in after
    ((labels, _),) = after["hw_gpu_utilization_ratio"]
    assert "k8s_pod_name" not in labels  # the device stays, unheld


async def test_a_broken_source_loses_only_its_own_devices(tmp_path: Path) -> None:
    sources: dict[str, Source] = {"fake": StaticSource(gpu_result()), "broken": Broken()}
    snap = await one_cycle(parse_scenario(SCENARIO), tmp_path / "k.sock", sources)
    families = parse(metrics_text(snap))
    success = {labels["source"]: v for labels, v in families["kube_device_exporter_source_success"]}
    assert success == {"fake": 1.0, "broken": 0.0}
    assert len(families["hw_gpu_utilization_ratio"]) == 1
    assert snap.sources[1].error == "RuntimeError: driver fell off the bus"


@pytest.mark.slow
async def test_hung_source_does_not_stall_cycles_or_scrapes(tmp_path: Path) -> None:
    hung = Hung()
    exporter = Exporter(
        config_for(tmp_path / "none.sock"),
        sources={"fake": StaticSource(gpu_result()), "hung": hung},
    )
    await exporter.start()
    try:
        await exporter.wait_ready(10)
        await asyncio.sleep(0.7)  # several cycles while `hung` never returns
        snap = exporter.poller.snapshot
        assert snap is not None and snap.cycles_total >= 2
        health = {h.name: h for h in snap.sources}
        assert not health["hung"].success
        assert health["hung"].error in ("timed out after 0.2s", "previous collection still running")
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{exporter.url}metrics") as r:
                assert r.status == 200
                assert "hw_gpu_utilization_ratio" in await r.text()
    finally:
        hung.release.set()
        await exporter.stop()


async def test_kubelet_absent_at_start_then_appears(tmp_path: Path) -> None:
    sock = tmp_path / "pr" / "kubelet.sock"
    exporter = Exporter(config_for(sock), sources={"fake": StaticSource(gpu_result())})
    await exporter.start()
    kubelet = SimulatedKubelet(parse_scenario(SCENARIO), sock, clock=lambda: 0.0)
    try:
        await exporter.wait_ready(10)
        snap = exporter.poller.snapshot
        assert snap is not None and not snap.podresources.connected
        assert snap.devices and not snap.allocations  # metrics keep answering without a kubelet
        await kubelet.start()
        for _ in range(50):
            await asyncio.sleep(0.1)
            snap = exporter.poller.snapshot
            if snap is not None and snap.allocations:
                break
        assert snap is not None and snap.podresources.connected and snap.allocations
    finally:
        await exporter.stop()
        await kubelet.stop()


async def test_http_endpoints(tmp_path: Path) -> None:
    sock = tmp_path / "k.sock"
    kubelet = SimulatedKubelet(parse_scenario(SCENARIO), sock, clock=lambda: 0.0)
    await kubelet.start()
    exporter = Exporter(config_for(sock), sources={"fake": StaticSource(gpu_result())})
    async with aiohttp.ClientSession(auto_decompress=False) as http:
        await exporter.start()
        try:
            async with http.get(f"{exporter.url}healthz") as r:
                assert r.status == 200
            await exporter.wait_ready(10)
            async with http.get(f"{exporter.url}readyz") as r:
                assert r.status == 200
            async with http.get(
                f"{exporter.url}metrics", headers={"Accept-Encoding": "identity"}
            ) as r:
                assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                text = await r.text()
                assert "hw_allocation_info{" in text
            async with http.get(
                f"{exporter.url}metrics",
                headers={"Accept": "application/openmetrics-text;version=1.0.0",
                         "Accept-Encoding": "gzip"},
            ) as r:  # fmt: skip
                assert r.headers["Content-Type"].startswith("application/openmetrics-text")
                assert r.headers["Content-Encoding"] == "gzip"
                body = gzip.decompress(await r.read()).decode()
                assert body.rstrip().endswith("# EOF")
            async with http.get(f"{exporter.url}api/devices") as r:
                data = await r.json()
                (device,) = data["devices"]
                assert device["id"] == GPU
                assert device["holders"][0]["namespace"] == "ns"
        finally:
            await exporter.stop()
            await kubelet.stop()


async def test_readyz_before_the_first_cycle(tmp_path: Path) -> None:
    exporter = Exporter(config_for(tmp_path / "k.sock"), sources={"hung": Hung()})
    exporter.poller.run_forever = _never  # type: ignore[method-assign]
    await exporter.start()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{exporter.url}readyz") as r:
                assert r.status == 503
            async with http.get(f"{exporter.url}metrics") as r:
                assert r.status == 503
            async with http.get(f"{exporter.url}healthz") as r:
                assert r.status == 200
    finally:
        await exporter.stop()


async def _never(stop: asyncio.Event) -> None:
    await stop.wait()


@pytest.mark.peer
async def test_landing_page_in_headless_chromium(tmp_path: Path) -> None:
    sock = tmp_path / "k.sock"
    kubelet = SimulatedKubelet(parse_scenario(SCENARIO), sock, clock=lambda: 0.0)
    await kubelet.start()
    exporter = Exporter(config_for(sock), sources={"fake": StaticSource(gpu_result(0.73))})
    await exporter.start()
    try:
        await exporter.wait_ready(10)
        shot = tmp_path / "landing.png"
        dom = await asyncio.to_thread(chromium, exporter.url, screenshot=shot)
    finally:
        await exporter.stop()
        await kubelet.stop()
    assert GPU in dom, dom[dom.find("<body") :][:600]
    assert "NVIDIA H100 80GB HBM3" in dom
    assert "ns/weird" in dom  # holder rendered by the page's script
    assert "73%" in dom
    assert "node n1 · 1 devices · kubelet v1" in dom
    assert shot.stat().st_size > 5000


async def test_missing_kubelet_is_said_once_and_recovery_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from exporter.podresources.client import PodResourcesClient

    sock = tmp_path / "kubelet.sock"
    client = PodResourcesClient(sock)
    poller = make_poller(node="n", sources={}, client=client)
    caplog.set_level("INFO", logger="exporter")
    for _ in range(3):
        await poller.run_once()
    kubelet = SimulatedKubelet(parse_scenario(SCENARIO), sock, clock=lambda: 0.0)
    await kubelet.start()
    try:
        for _ in range(3):
            await poller.run_once()
    finally:
        await client.close()
        await kubelet.stop()
    messages = [r.getMessage() for r in caplog.records if r.name == "exporter.poller"]
    assert len(messages) == 3, messages
    assert "does not exist" in messages[0] and "retrying every cycle" in messages[0]
    assert messages[1] == "PodResources v1 answering"
    # no source at all: the kubelet's GPU is unseen, said once over three cycles, in the
    # words of doctor's finding
    assert messages[2] == (
        "resource nvidia.com/gpu: 1 allocatable, 1 seen by no source; "
        "likely cause: the nvml source is turned off; fix: turn it on: --collector.nvml"
    )


class SlowKubelet(FixedKubelet):
    """A PodResources client whose first answer is prompt and every later one hangs."""

    def __init__(self, state: PodResourcesState) -> None:
        super().__init__(state)
        self.release = asyncio.Event()

    async def poll(self, *, fresh_allocatable: bool = False) -> PodResourcesState:
        self.calls += 1
        if self.calls > 1:
            await self.release.wait()
        return self.state

    async def close(self) -> None:
        self.release.set()


async def test_a_hung_kubelet_does_not_hold_back_device_readings() -> None:
    pod = Pod("p", "ns", (Container("c", (ContainerDevices("nvidia.com/gpu", (GPU,)),)),))
    kubelet = SlowKubelet(PodResourcesState(pods=(pod,), api_version="v1"))
    poller = make_poller(
        node="n1",
        sources={"fake": StaticSource(gpu_result())},
        client=kubelet,
        interval=0.2,
        source_timeout=5.0,
    )
    try:
        first = await poller.run_once()
        loop = asyncio.get_running_loop()
        started = loop.time()
        later = [await poller.run_once() for _ in range(3)]
        elapsed = loop.time() - started
    finally:
        await poller.close()
    assert first.podresources.connected
    assert kubelet.calls == 2  # the hung call is waited on, never piled up
    assert elapsed < 1.0  # three cycles within the budget (0.1 s each), not the 5 s deadline
    for snap in later:
        assert not snap.podresources.connected  # marked stale ...
        assert snap.devices[0].holder == Holder("ns", "p", "c")  # ... last good pod state kept


async def test_the_join_is_redone_only_when_pods_or_devices_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    joined: list[PodResourcesState] = []

    def counting_join(results: Any, state: PodResourcesState, *args: Any, **kw: Any) -> Any:
        joined.append(state)
        return join(results, state, *args, **kw)

    monkeypatch.setattr(steps_module, "join", counting_join)
    pod = Pod("p", "ns", (Container("c", (ContainerDevices("nvidia.com/gpu", (GPU,)),)),))
    kubelet = FixedKubelet(PodResourcesState(pods=(pod,), api_version="v1"))
    source = StaticSource(gpu_result(0.25))
    poller = make_poller(node="n1", sources={"fake": source}, client=kubelet)
    try:
        first = await poller.run_once()
        source.result = gpu_result(0.75)  # new readings, same devices and pods
        second = await poller.run_once()
        kubelet.state = PodResourcesState(api_version="v1")  # the pod is gone
        third = await poller.run_once()
    finally:
        await poller.close()
    assert [state.pods for state in joined] == [(pod,), ()]  # cycles 1 and 3 only
    assert first.devices[0].holder == second.devices[0].holder == Holder("ns", "p", "c")
    assert second.devices[0].reading.samples[0].value == 0.75
    assert second.allocations == first.allocations
    assert third.devices[0].holder is None and not third.allocations


class Absent(StaticSource):
    def __init__(self) -> None:
        super().__init__(SourceResult("amdgpu", absent="no amdgpu driver loaded"))
        self.calls = 0

    def collect(self) -> SourceResult:
        self.calls += 1
        return self.result


async def test_a_source_without_hardware_is_asked_again_only_every_absent_recheck() -> None:
    clock = Clock()
    absent = Absent()
    poller = make_poller(node="n1", sources={"amdgpu": absent}, client=None, clock=clock)
    try:
        first = await poller.run_once()
        clock.now = 30.0
        second = await poller.run_once()
        clock.now = 61.0
        await poller.run_once()
        clock.now = 90.0
        await poller.run_once()
        clock.now = 122.0
        absent.result = gpu_result()  # the driver was loaded meanwhile
        await poller.run_once()
        clock.now = 123.0
        last = await poller.run_once()
    finally:
        await poller.close()
    assert absent.calls == 4  # t = 0, 61, 122, 123
    assert first.sources == second.sources
    assert second.sources[0].success and second.sources[0].absent == "no amdgpu driver loaded"
    assert len(last.devices) == 1
