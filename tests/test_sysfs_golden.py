"""Whole /metrics output per vendor from the mixed node's fixture tree against tests/golden/
(promtool lints those files: the `peer` tests), and the simulated mixed node served end to
end."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from exporter.app import Exporter
from exporter.cli.flags import parse_config
from exporter.sources import Source
from exporter.sources.amdgpu import AmdgpuSource
from exporter.sources.intel import IntelSource
from exporter.sources.netdev import NetdevSource
from exporter.sources.rdma import RdmaSource
from exporter.sources.sysfs.source import SysfsSource
from simulator.netlink import RecordedVfStats
from simulator.node import SimulatedNode
from simulator.ports import free_port
from tests.peers import promtool_check_metrics
from tests.support import GOLDEN, Clock, assert_golden, metrics_text, one_cycle
from tests.sysfs_support import context, make_tree, scenario

VENDORS = {
    # golden name: (source, resource patterns of its pods)
    "amdgpu": (AmdgpuSource, ("amd.com/*",)),
    "intel": (IntelSource, ("gpu.intel.com/*",)),
    "rdma": (RdmaSource, ("rdma/*",)),
    "netdev": (NetdevSource, ("intel.com/*",)),
}


@pytest.mark.parametrize("vendor", sorted(VENDORS))
async def test_golden_metrics(tmp_path: Path, vendor: str, update_golden: bool) -> None:
    source_class, patterns = VENDORS[vendor]
    part = make_tree(tmp_path / "node", "mixed")
    clock = Clock(1000.0)
    options = {"rdma": {"pool-config": str(part.pool_path)}}.get(vendor, {})
    source: SysfsSource = source_class(context(part, clock, None, **options))
    if isinstance(source, NetdevSource):  # the node's recorded PF answers, not the kernel's
        source.vf_reader = RecordedVfStats(part.netlink_path)
    # A first cycle 30 s earlier, so rates (Intel busy and power) exist in the second.
    source.collect()
    part.advance(30.0)
    clock.now += 30.0
    sources: dict[str, Source] = {vendor: source}
    snapshot = await one_cycle(
        scenario("mixed"), tmp_path / "kubelet.sock", sources, t=30.0, patterns=patterns
    )
    text = metrics_text(snapshot)
    assert "k8s_pod_name=" in text.split("# HELP hw_allocation_info")[0], "pod-labelled devices"
    assert_golden(f"sysfs-{vendor}.prom", text, update_golden)


@pytest.mark.peer
@pytest.mark.parametrize("vendor", sorted(VENDORS))
def test_golden_metrics_pass_promtool(vendor: str) -> None:
    """promtool lints the file test_golden_metrics holds the output to, byte for byte."""
    promtool_check_metrics((GOLDEN / f"sysfs-{vendor}.prom").read_text())


async def test_simulate_mixed_serves_pod_labelled_metrics_of_every_vendor(tmp_path: Path) -> None:
    """What `kde-simulate mixed` runs, in process: node, flags, exporter."""
    node = SimulatedNode(scenario("mixed"), tmp_path, clock=lambda: 5.0)
    config = parse_config(
        [*node.exporter_args(), "--web.listen-address", f"127.0.0.1:{free_port()}"],
        env={},
    )
    await node.start()
    exporter = Exporter(config, sources=node.sources(config))
    await exporter.start()
    try:
        await exporter.wait_ready()
        async with aiohttp.ClientSession() as http, http.get(f"{exporter.url}metrics") as got:
            text = await got.text()
    finally:
        await exporter.stop()
        await node.stop()
    pod_series = [line for line in text.splitlines() if "k8s_pod_name=" in line]
    for vendor, pod in (
        ('hw_vendor="amd"', "rocm-infer-a"),
        ('hw_vendor="intel"', "xe-infer"),
        ('hw_id="mlx5_1/1"', "storage-client"),
        ('hw_id="0000:5e:01.0"', "cnf-router"),
    ):
        assert any(
            vendor in line and f'k8s_pod_name="{pod}"' in line and not line.startswith("hw_alloc")
            for line in pod_series
        ), f"no pod-labelled device series for {vendor} / {pod}"
    assert 'hw_network_stats_source="pf_netlink"' in text
    for source in ("amdgpu", "intel", "rdma", "netdev"):
        labels = f'k8s_node_name="mixed-node-1",source="{source}"'
        assert f"kube_device_exporter_source_success{{{labels}}} 1.0" in text
