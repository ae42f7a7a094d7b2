"""The landing page: rendered on the server (curl and a page without scripts see the whole
table), refreshed by its script, rows nested under their own parent. Real headless Chromium."""

from __future__ import annotations

import asyncio
import ctypes
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from exporter.app import build_sources
from exporter.cli.flags import parse_config
from exporter.ids import ResourceMatcher
from exporter.model import Snapshot
from exporter.sinks.prometheus import PrometheusSink
from exporter.web.app import DevicesView, make_app
from simulator.node import SimulatedNode
from simulator.scenario import load_scenario, parse_scenario
from tests.nvml_support import fakenvml  # noqa: F401 - fixture
from tests.peers import chromium
from tests.support import Clock, StaticSource, one_cycle
from tests.support.fake_gpu import GPU, SCENARIO, gpu_result
from tests.support.simulated_node import scenario_snapshot

ROW = re.compile(r'<tr(?: class="child")? data-id="([^"]+)" data-depth="(\d+)">(.*?)</tr>', re.S)


@asynccontextmanager
async def serving(view: DevicesView, *, scripts: bool = True) -> AsyncIterator[str]:
    """The app on a free port. `scripts=False` sends a Content-Security-Policy that forbids
    every script, so Chromium shows only what the server rendered."""
    app = make_app(PrometheusSink(), view)
    if not scripts:

        async def no_scripts(request: web.Request, response: web.StreamResponse) -> None:
            response.headers["Content-Security-Policy"] = "script-src 'none'"

        app.on_response_prepare.append(no_scripts)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        await runner.cleanup()


async def gpu_snapshot(tmp_path: Path, util: float) -> Snapshot:
    return await one_cycle(
        parse_scenario(SCENARIO),
        tmp_path / f"k{util}.sock",
        {"fake": StaticSource(gpu_result(util))},
    )


async def test_first_view_is_in_the_html_the_server_sends(tmp_path: Path) -> None:
    view = DevicesView()
    async with serving(view) as url, aiohttp.ClientSession() as http:
        async with http.get(url) as r:
            assert "waiting for the first collection cycle" in await r.text()
        view.update(await gpu_snapshot(tmp_path, 0.73))
        async with http.get(url) as r:
            html = await r.text()
    (row,) = ROW.findall(html)
    assert row[0] == GPU
    assert "NVIDIA H100 80GB HBM3" in row[2] and "nvidia NVIDIA" not in row[2]
    assert "ns/weird &quot;pod&quot;\\name/c\nnewline" in row[2]  # escaped, not markup
    assert "73%" in row[2]
    assert "loading" not in html


@pytest.mark.peer
async def test_page_without_scripts_shows_the_table_and_the_script_refreshes_it(
    tmp_path: Path,
) -> None:
    view = DevicesView()
    view.update(await gpu_snapshot(tmp_path, 0.73))
    async with serving(view, scripts=False) as url:
        shot = tmp_path / "landing.png"
        static = await asyncio.to_thread(chromium, url, screenshot=shot)
    assert GPU in static and "73%" in static and "ns/weird" in static
    assert "node test-node · 1 devices · kubelet v1" in static
    assert shot.stat().st_size > 5000
    later_view = DevicesView()
    later_view.update(await gpu_snapshot(tmp_path, 0.41))
    flipping = FirstThenLater(view.page, later_view.page)
    async with serving(flipping) as url:
        # The page's script fetches the page again every 5 s (virtual time) and swaps it in.
        dom = await asyncio.to_thread(chromium, url, budget_ms=8000)
    assert flipping.served >= 2
    assert "41%" in dom and "73%" not in dom


class FirstThenLater(DevicesView):
    """Serves one page on the first request and another on every later one."""

    def __init__(self, first: bytes, later: bytes) -> None:
        super().__init__()
        self.first, self.later, self.served = first, later, 0

    @property
    def page(self) -> bytes:
        self.served += 1
        return self.first if self.served == 1 else self.later

    @page.setter
    def page(self, value: bytes) -> None:
        return None


@pytest.mark.peer
async def test_mixed_rows_nest_under_their_own_parent_in_chromium(tmp_path: Path) -> None:
    scenario = load_scenario("mixed")
    clock = Clock(5.0)
    node = SimulatedNode(scenario, tmp_path / "node", clock=clock)
    config = parse_config(node.exporter_args(), env={})
    sources = build_sources(config, clock=clock)
    try:
        snapshot = await one_cycle(scenario, tmp_path / "kubelet.sock", sources, t=5.0)
    finally:
        for source in sources.values():
            source.close()
        for part in node.parts:
            part.close()
    parents = {d.reading.device.id: d.reading.device.parent for d in snapshot.devices}
    view = DevicesView(ResourceMatcher(config.resource_patterns))
    view.update(snapshot)
    async with serving(view, scripts=False) as url:
        dom = await asyncio.to_thread(chromium, url)
    rows = [(device_id, int(depth)) for device_id, depth, _ in ROW.findall(dom)]
    assert sorted(d for d, _ in rows) == sorted(parents)
    stack: list[str] = []
    for device_id, depth in rows:
        stack = stack[:depth]
        expected = parents[device_id] if depth else ""
        assert (stack[-1] if stack else "") == expected, (device_id, rows)
        stack.append(device_id)
    depth_of = dict(rows)
    # The partitions of the first MI300X sit under it, not under the GPU a pod holds; the
    # HCA ports (whose parent PCI function is no row) stand alone, not under an Intel GPU.
    assert [d for d, _ in rows if parents[d] == "8f3a1c2e5b7d9e01"] == [
        "amdgpu_xcp_0",
        "amdgpu_xcp_1",
        "amdgpu_xcp_2",
    ]
    assert depth_of["mlx5_0/1"] == depth_of["mlx5_1/1"] == 0
    assert "link up · 200 Gb/s" in dom and "rx " in dom
    assert re.search(r"<li class=\"ok\"><b>ok</b> resource amd.com/gpu: 5 allocatable", dom)


def test_rows_name_the_gpu_index_and_shared_holders_by_replica() -> None:
    from exporter.model import Allocation, Device, DeviceReading, Holder, JoinedDevice

    gpu = Device(GPU, "gpu", "nvidia", "NVIDIA H100 80GB HBM3", "nvml",
                 attributes=(("hw.gpu.index", "3"),))  # fmt: skip
    holders = [Holder("batch", f"job-{i}", "worker") for i in (0, 1)]
    snapshot = Snapshot(
        timestamp=0.0,
        node="n",
        devices=(JoinedDevice(DeviceReading(gpu, ()), None, 2, True),),
        allocations=tuple(
            Allocation(h, "nvidia.com/gpu.shared", f"{GPU}::{i}", GPU, replica=str(i), shared=True)
            for i, h in enumerate(holders)
        ),
    )
    view = DevicesView()
    view.update(snapshot)
    (row,) = ROW.findall(view.page.decode())
    assert "<b>GPU 3</b>" in row[2]
    assert "batch/job-0/worker (shared, replica 0)" in row[2]
    assert "batch/job-1/worker (shared, replica 1)" in row[2]
    assert f"(shared {GPU}" not in row[2]  # the full ID only in the tooltip


def test_a_partitioned_gpu_reads_partitioned_not_free() -> None:
    """Issue 31, item 15: an MI300X in CPX mode, listed whole by its plugin and busy from its
    partitions, read "free" while pods held two of its three partitions."""
    from exporter.model import Allocation, Device, DeviceReading, Holder, JoinedDevice

    card = Device("8f3a1c2e5b7d9e01", "gpu", "amd", "AMD Instinct MI300X", "amdgpu")
    parts = [
        Device(f"amdgpu_xcp_{i}", "gpu", "amd", "AMD Instinct MI300X", "amdgpu",
               parent=card.id, attributes=(("hw.gpu.partition", str(i)),))
        for i in range(3)
    ]  # fmt: skip
    snapshot = Snapshot(
        timestamp=0.0,
        node="n",
        devices=tuple(JoinedDevice(DeviceReading(d, ()), None, 0, True) for d in (card, *parts)),
        allocations=tuple(
            Allocation(Holder("ml", f"train-{i}", "main"), "amd.com/gpu", p.id, p.id)
            for i, p in enumerate(parts[:2])
        ),
    )
    view = DevicesView()
    view.update(snapshot)
    rows = {device_id: cells for device_id, _, cells in ROW.findall(view.page.decode())}
    assert "partitioned: 2 of 3 held" in rows[card.id] and ">free<" not in rows[card.id]
    assert ">free<" in rows["amdgpu_xcp_2"]  # the partition nobody holds is free itself
    assert "ml/train-0/main" in rows["amdgpu_xcp_0"]
    card_json = next(d for d in json.loads(view.body or b"")["devices"] if d["id"] == card.id)
    assert (card_json["partitions"], card_json["partitions_held"]) == (3, 2)


@pytest.mark.peer
async def test_a_gpu_used_without_request_reads_so_not_free_in_chromium(
    tmp_path: Path,
    fakenvml: ctypes.CDLL,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 42, the first hour, item 1: the demo's dev-shell requests no GPU and uses the one
    nobody holds (`hw_allocation_requested="false"` on /metrics); the page said `free`
    ("offered to pods, held by none"). It names the pod and its share instead."""
    snapshot = await scenario_snapshot("demo", tmp_path, monkeypatch)
    (use,) = [u for u in snapshot.container_usage if u.owner and not u.requested]
    assert (use.owner.namespace, use.owner.pod) == ("research", "dev-shell")  # type: ignore[union-attr]
    view = DevicesView()
    view.update(snapshot)
    async with serving(view, scripts=False) as url:
        dom = await asyncio.to_thread(chromium, url)
    rows = {device_id: cells for device_id, _, cells in ROW.findall(dom)}
    cells = rows[use.device_id]
    share = f"{round((use.utilization or 0) * 100)}%, {(use.memory_bytes or 0) / 2**30:.1f} GiB"
    assert f"used without request</b> research/dev-shell/shell: {share}" in cells, cells
    assert ">free<" not in cells
    assert any(">free<" in c for d, c in rows.items() if d != use.device_id)  # others are
