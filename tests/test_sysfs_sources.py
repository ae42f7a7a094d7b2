"""The four sysfs sources against fixture trees: units by hand, robustness, identity, join."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from exporter.join import join
from exporter.model import PodResourcesState, Sample, SourceResult
from exporter.sources.amdgpu import AmdgpuSource
from exporter.sources.intel import IntelSource
from exporter.sources.netdev import NetdevSource, NetStats
from exporter.sources.rdma import RdmaSource
from simulator.netlink import RecordedVfStats
from simulator.scenario import ScenarioError
from tests.support import Clock
from tests.support.sysfs_nodes import AMD, AMD_DEV, IB
from tests.sysfs_support import blocking_file, context, make_tree, scenario


def values(
    result: SourceResult, device_id: str
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    [reading] = [r for r in result.readings if r.device.id == device_id]
    return {(s.metric, s.attributes): s.value for s in reading.samples}


def value(result: SourceResult, device_id: str, metric: str, *attrs: tuple[str, str]) -> float:
    return values(result, device_id)[(metric, tuple(attrs))]


def read_file(root: Path, rel: str) -> str:
    return (root / rel).read_text().strip()


# --- AMD -----------------------------------------------------------------------------------


def test_amdgpu_units_against_hand_computed_values(tmp_path: Path) -> None:
    part = make_tree(tmp_path, AMD)
    # the fixture holds what the kernel writes: µW, m°C, Hz, percent, bytes
    assert read_file(part.root, f"{AMD_DEV}/hwmon/hwmon0/power1_average") == "123456000"
    assert read_file(part.root, f"{AMD_DEV}/hwmon/hwmon0/temp1_input") == "41250"
    assert read_file(part.root, f"{AMD_DEV}/hwmon/hwmon0/freq1_input") == "1700000000"
    result = AmdgpuSource(context(part, Clock())).collect()
    gpu = "0000:03:00.0"  # no unique_id: the PCI address is the id
    assert value(result, gpu, "hw.gpu.utilization", ("hw.gpu.task", "general")) == 0.37
    assert value(result, gpu, "hw.gpu.memory.bandwidth.utilization") == 0.05
    assert value(result, gpu, "hw.gpu.memory.usage") == 1_610_612_736  # 1.5 GiB
    assert value(result, gpu, "hw.gpu.memory.limit") == 68_719_476_736
    assert value(result, gpu, "hw.gpu.memory.visible.usage") == 134_217_728
    assert value(result, gpu, "hw.gpu.memory.visible.limit") == 268_435_456
    assert value(result, gpu, "hw.gpu.memory.gtt.usage") == 536_870_912
    assert value(result, gpu, "hw.gpu.memory.gtt.limit") == 17_179_869_184
    assert value(result, gpu, "hw.power") == 123.456
    assert value(result, gpu, "hw.power.limit") == 300.0
    assert value(result, gpu, "hw.temperature", ("hw.sensor_location", "edge")) == 41.25
    assert value(result, gpu, "hw.temperature", ("hw.sensor_location", "junction")) == 50.5
    assert value(result, gpu, "hw.temperature", ("hw.sensor_location", "memory")) == 38.0
    assert value(result, gpu, "hw.gpu.clock", ("hw.gpu.clock.type", "graphics")) == 1.7e9
    assert value(result, gpu, "hw.gpu.clock", ("hw.gpu.clock.type", "memory")) == 1.6e9
    assert value(result, gpu, "hw.errors", ("error.type", "pcie_replay")) == 9
    umc = ("hw.error.block", "umc")
    assert value(result, gpu, "hw.errors", ("error.type", "ecc_uncorrected"), umc) == 1
    assert value(result, gpu, "hw.errors", ("error.type", "ecc_corrected"), umc) == 4
    assert result.field_errors == 0
    [reading] = result.readings
    assert reading.device.model == "amdgpu [1002:74a1]"
    assert reading.device.aliases == frozenset({"0000:03:00.0"})


def test_amdgpu_power1_input_and_unique_id(tmp_path: Path) -> None:
    text = AMD.replace("card: 1", "card: 1\n      power_file: power1_input\n      unique_id: 00ab")
    part = make_tree(tmp_path, text)
    result = AmdgpuSource(context(part, Clock())).collect()
    assert value(result, "00ab", "hw.power") == 123.456
    assert result.readings[0].device.aliases == frozenset({"0000:03:00.0"})


def test_amdgpu_identity_survives_an_unreadable_unique_id(tmp_path: Path) -> None:
    text = AMD.replace("card: 1", "card: 1\n      unique_id: 00ab\n      product: MI210")
    part = make_tree(tmp_path, text)
    unique_id = part.root / f"{AMD_DEV}/unique_id"
    source = AmdgpuSource(context(part, Clock()))
    with blocking_file(unique_id):
        first = source.collect()
    assert first.readings[0].device.id == "0000:03:00.0", "without unique_id: the PCI address"
    assert first.field_errors == 1
    assert source.collect().readings[0].device.id == "00ab"
    with blocking_file(unique_id):
        later = source.collect()
    assert later.readings[0].device.id == "00ab", "once known, a failed read keeps the id"
    assert later.readings[0].device.model == "MI210"


def test_amdgpu_partitions_join_their_gpu_through_kfd(tmp_path: Path) -> None:
    part = make_tree(tmp_path, "mixed")
    result = AmdgpuSource(context(part, Clock())).collect()
    by_id = {r.device.id: r.device for r in result.readings}
    assert sorted(by_id) == [
        "8f3a1c2e5b7d9e01",
        "8f3a1c2e5b7d9e02",
        "amdgpu_xcp_0",
        "amdgpu_xcp_1",
        "amdgpu_xcp_2",
    ]
    xcp = by_id["amdgpu_xcp_1"]
    assert xcp.parent == "8f3a1c2e5b7d9e01"
    assert ("hw.pci.bus_id", "0000:19:00.0") in xcp.attributes
    # QPX: each of 4 partitions holds a quarter of the 192 GiB and of the 96 GiB used
    assert value(result, "amdgpu_xcp_1", "hw.gpu.memory.limit") == 48 * 1024**3
    assert value(result, "amdgpu_xcp_1", "hw.gpu.memory.usage") == 24 * 1024**3


def test_amdgpu_unreadable_files_skip_fields_and_hold_counters(tmp_path: Path) -> None:
    part = make_tree(tmp_path, AMD)
    source = AmdgpuSource(context(part, Clock()))
    first = source.collect()
    umc_ce = ("hw.errors", (("error.type", "ecc_corrected"), ("hw.error.block", "umc")))
    assert values(first, "0000:03:00.0")[umc_ce] == 4

    (part.root / f"{AMD_DEV}/ras/umc_err_count").write_text("Query currently inaccessible\n")
    (part.root / f"{AMD_DEV}/hwmon/hwmon0/power1_average").unlink()
    (part.root / f"{AMD_DEV}/gpu_busy_percent").write_text("banana\n")
    with blocking_file(part.root / f"{AMD_DEV}/pcie_replay_count"):
        second = source.collect()
    got = values(second, "0000:03:00.0")
    assert second.field_errors == 4  # RAS garbage, power gone, busy garbage, replays EAGAIN
    assert got[umc_ce] == 4, "a briefly unreadable counter keeps its last value"
    assert got[("hw.errors", (("error.type", "pcie_replay"),))] == 9
    assert ("hw.power", ()) not in got, "an unreadable gauge is no series, not 0"
    assert ("hw.gpu.utilization", (("hw.gpu.task", "general"),)) not in got
    assert got[("hw.temperature", (("hw.sensor_location", "edge"),))] == 41.25


# --- Intel ---------------------------------------------------------------------------------

INTEL = """
sysfs:
  intel:
    - pci: "0000:4d:00.0"
      card: 2
      driver: {driver}
      media_gt: true
      freq_mhz: 1500
      busy_percent: 25
      power_w: 80
      energy_j: 1000
      power_max_w: 120
      temperature_c: {{pkg: 55.5, vram: 60}}
"""


@pytest.mark.parametrize("driver", ["i915", "xe"])
def test_intel_busy_and_power_from_counters(tmp_path: Path, driver: str) -> None:
    part = make_tree(tmp_path, INTEL.format(driver=driver))
    clock = Clock(500.0)
    source = IntelSource(context(part, clock))
    first = source.collect()
    gpu = "0000:4d:00.0"
    assert ("hw.gpu.utilization", (("hw.gpu.task", "general"),)) not in values(first, gpu)
    assert ("hw.power", ()) not in values(first, gpu), "one energy reading is no power"
    part.advance(20.0)
    clock.now = 520.0
    result = source.collect()
    # 25 % busy for 20 s: 15 s idle (15000 ms in the file); 80 W for 20 s: +1600 J
    assert value(result, gpu, "hw.gpu.idle.time") == 15.0
    assert value(result, gpu, "hw.gpu.utilization", ("hw.gpu.task", "general")) == 0.25
    assert value(result, gpu, "hw.energy") == 2600.0
    assert value(result, gpu, "hw.power") == 80.0
    assert value(result, gpu, "hw.power.limit") == 120.0
    assert value(result, gpu, "hw.gpu.clock", ("hw.gpu.clock.type", "graphics")) == 1.5e9
    if driver == "xe":
        assert value(result, gpu, "hw.temperature", ("hw.sensor_location", "package")) == 55.5
        assert value(result, gpu, "hw.temperature", ("hw.sensor_location", "memory")) == 60.0
    device = result.readings[0].device
    assert device.aliases == frozenset({"0000:4d:00.0", "card2"})
    assert device.model == "Intel Data Center GPU Flex 170"
    assert result.field_errors == 0


def test_intel_legacy_i915_paths(tmp_path: Path) -> None:
    part = make_tree(tmp_path, INTEL.format(driver="i915"))
    card = part.root / "class/drm/card2"
    shutil.rmtree(card / "gt")
    (card / "power").mkdir()
    (card / "power/rc6_residency_ms").write_text("1000\n")
    clock = Clock()
    source = IntelSource(context(part, clock))
    source.collect()
    (card / "power/rc6_residency_ms").write_text("5000\n")
    clock.now = 10.0
    result = source.collect()
    assert value(result, "0000:4d:00.0", "hw.gpu.utilization", ("hw.gpu.task", "general")) == 0.6
    assert value(result, "0000:4d:00.0", "hw.gpu.clock", ("hw.gpu.clock.type", "graphics")) == 1.5e9


# --- InfiniBand ----------------------------------------------------------------------------

PORT = "class/infiniband/mlx5_4/ports/1"


def test_infiniband_units_against_hand_computed_values(tmp_path: Path) -> None:
    part = make_tree(tmp_path, IB.format(state="ACTIVE"))
    part.advance(10.0)
    # 8 Gb/s for 10 s = 1e10 octets; the kernel counts them divided by 4
    assert read_file(part.root, f"{PORT}/counters/port_rcv_data") == "2500000000"
    result = RdmaSource(context(part, Clock())).collect()
    port = "mlx5_4/1"
    rx, tx = ("network.io.direction", "receive"), ("network.io.direction", "transmit")
    assert value(result, port, "hw.network.io", rx) == 1e10
    assert value(result, port, "hw.network.io", tx) == 2.5e9
    assert value(result, port, "hw.network.packets", rx) == 1e7
    assert value(result, port, "hw.network.dropped", tx) == 2
    assert value(result, port, "hw.errors", ("error.type", "symbol")) == 5
    assert value(result, port, "hw.network.ib.transmit_wait") == 70
    assert value(result, port, "hw.network.up") == 1.0
    assert value(result, port, "hw.network.bandwidth.limit") == 12.5e9  # 100 Gb/s in bytes
    assert (
        value(
            result, port, "hw.network.rdma.statistic", ("hw.network.rdma.counter", "out_of_buffer")
        )
        == 3
    )
    assert ("hw.network.rdma.statistic", (("hw.network.rdma.counter", "lifespan"),)) not in values(
        result, port
    )
    device = result.readings[0].device
    assert device.parent == "0000:c1:00.1"
    assert device.aliases == frozenset({"0000:c1:00.1"})
    assert device.vendor == "mellanox"
    assert result.field_errors == 0


def test_infiniband_down_port_and_legacy_counters(tmp_path: Path) -> None:
    part = make_tree(tmp_path, IB.format(state="DOWN"))
    part.advance(10.0)
    counters = part.root / PORT / "counters"
    legacy = part.root / PORT / "counters_ext"
    legacy.mkdir()
    (counters / "port_rcv_data").rename(legacy / "port_rcv_data_64")
    result = RdmaSource(context(part, Clock())).collect()
    assert value(result, "mlx5_4/1", "hw.network.up") == 0.0
    assert value(result, "mlx5_4/1", "hw.network.io", ("network.io.direction", "receive")) == 1e10


def test_infiniband_counter_never_goes_backwards(tmp_path: Path) -> None:
    part = make_tree(tmp_path, IB.format(state="ACTIVE"))
    part.advance(10.0)
    source = RdmaSource(context(part, Clock()))
    rx = ("network.io.direction", "receive")
    seen = [value(source.collect(), "mlx5_4/1", "hw.network.io", rx)]
    data = part.root / PORT / "counters/port_rcv_data"
    data.write_text("")  # a short read
    seen.append(value(source.collect(), "mlx5_4/1", "hw.network.io", rx))
    data.unlink()
    seen.append(value(source.collect(), "mlx5_4/1", "hw.network.io", rx))
    data.write_text("100\n")  # the counters were cleared (perfquery -R)
    seen.append(value(source.collect(), "mlx5_4/1", "hw.network.io", rx))
    data.write_text("101\n")  # the next read confirms the reset
    seen.append(value(source.collect(), "mlx5_4/1", "hw.network.io", rx))
    assert seen == [1e10, 1e10, 1e10, 1e10, 1e10 + 404]


# --- RDMA shared pools ---------------------------------------------------------------------


def test_pool_config_assigns_hcas_by_selector(tmp_path: Path) -> None:
    part = make_tree(tmp_path, "mixed")
    source = RdmaSource(context(part, Clock(), None, **{"pool-config": str(part.pool_path)}))
    pools = {r.device.id: r.device.pools for r in source.collect().readings}
    assert pools == {
        "mlx5_0/1": frozenset({"rdma/hca_shared_devices_a"}),
        "mlx5_1/1": frozenset({"rdma/hca_shared_devices_b"}),
    }


def test_pool_config_as_configmap_with_prefix_and_devices(tmp_path: Path) -> None:
    part = make_tree(tmp_path, "mixed")
    configmap = tmp_path / "configmap.yaml"
    configmap.write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: rdma-devices}\ndata:\n"
        "  config.json: |\n"
        '    {"configList": [{"resourceName": "ib_all", "resourcePrefix": "example.com",\n'
        '      "rdmaHcaMax": 100, "devices": ["ib0", "ib1"]},\n'
        '     {"resourceName": "wrong_vendor", "selectors": {"vendors": ["8086"]}}]}\n'
    )
    source = RdmaSource(context(part, Clock(), None, **{"pool-config": str(configmap)}))
    result = source.collect()
    assert {r.device.id: r.device.pools for r in result.readings} == {
        "mlx5_0/1": frozenset({"example.com/ib_all"}),
        "mlx5_1/1": frozenset({"example.com/ib_all"}),
    }
    configmap.write_text("{not a config")
    later = source.collect()
    assert later.field_errors == 1, "a broken pool file is counted"
    assert all(r.device.pools == {"example.com/ib_all"} for r in later.readings), (
        "last good pools stay"
    )


# --- SR-IOV --------------------------------------------------------------------------------


def test_sriov_vfs_from_host_sysfs_and_from_the_pf(tmp_path: Path) -> None:
    part = make_tree(tmp_path, "mixed")
    part.advance(8.0)
    source = NetdevSource(context(part, Clock()), RecordedVfStats(part.netlink_path))
    result = source.collect()
    devices = {r.device.id: r.device for r in result.readings}
    assert sorted(devices) == [
        "0000:5e:00.0",
        "0000:5e:01.0",
        "0000:5e:01.1",
        "0000:5e:01.2",
        "0000:5e:01.3",
    ]
    moved, host = devices["0000:5e:01.0"], devices["0000:5e:01.1"]
    assert moved.parent == host.parent == "0000:5e:00.0"
    assert ("hw.network.stats_source", "pf_netlink") in moved.attributes
    assert ("hw.network.stats_source", "host_sysfs") in host.attributes
    assert ("hw.network.name", "ens2f0v1") in host.attributes
    rx = ("network.io.direction", "receive")
    # 9.5 Gb/s for 8 s = 9.5e9 bytes; 1500-byte frames; 3 drops a second
    assert value(result, "0000:5e:01.0", "hw.network.io", rx) == 9.5e9
    assert value(result, "0000:5e:01.0", "hw.network.packets", rx) == 6_333_333
    assert value(result, "0000:5e:01.0", "hw.network.dropped", rx) == 24
    assert value(result, "0000:5e:01.1", "hw.network.io", rx) == 0.5e9
    assert value(result, "0000:5e:00.0", "hw.network.bandwidth.limit") == 12.5e9  # 100000 Mb/s
    assert result.field_errors == 0


class _FlakyPf:
    """Recorded PF answers until `broken`, then the error of a PF that went away."""

    def __init__(self, path: Path) -> None:
        self.recorded = RecordedVfStats(path)
        self.broken = False
        self.calls = 0

    def vf_stats(self, pf: str) -> dict[int, NetStats]:
        self.calls += 1
        if self.broken:
            raise OSError(19, "No such device")
        return self.recorded.vf_stats(pf)


def test_sriov_netlink_failure_keeps_last_values_and_label(tmp_path: Path) -> None:
    part = make_tree(tmp_path, "mixed")
    part.advance(8.0)
    pf = _FlakyPf(part.netlink_path)
    source = NetdevSource(context(part, Clock()), pf)
    before = values(source.collect(), "0000:5e:01.0")
    pf.broken = True
    result = source.collect()
    assert pf.calls == 2, "one netlink call per PF and cycle"
    assert result.field_errors == 1
    assert values(result, "0000:5e:01.0") == before
    [moved] = [r.device for r in result.readings if r.device.id == "0000:5e:01.0"]
    assert ("hw.network.stats_source", "pf_netlink") in moved.attributes


# --- the join ------------------------------------------------------------------------------


def test_mixed_node_ids_resolve_to_devices(tmp_path: Path) -> None:
    sc = scenario("mixed")
    part = make_tree(tmp_path, "mixed")
    clock = Clock()
    results = [
        AmdgpuSource(context(part, clock)).collect(),
        IntelSource(context(part, clock)).collect(),
        RdmaSource(context(part, clock, None, **{"pool-config": str(part.pool_path)})).collect(),
        NetdevSource(context(part, clock), RecordedVfStats(part.netlink_path)).collect(),
    ]
    state = PodResourcesState(
        pods=sc.pods_at(0), allocatable=sc.allocatable, allocatable_known=True
    )
    joined = join(results, state)
    held = {(a.holder.pod, a.raw_id): (a.device_id, a.shared) for a in joined.allocations}
    assert held == {
        ("rocm-infer-a", "amdgpu_xcp_0"): ("amdgpu_xcp_0", False),
        ("rocm-infer-b", "amdgpu_xcp_1"): ("amdgpu_xcp_1", False),
        ("rocm-train", "0000:9d:00.0"): ("8f3a1c2e5b7d9e02", False),
        ("transcode-0", "card3-0"): ("0000:4d:00.0", False),  # one slot per card
        ("xe-infer", "card4-0"): ("0000:b3:00.0", False),
        ("mpi-worker-0", "0"): ("mlx5_0/1", True),
        ("mpi-worker-1", "1"): ("mlx5_0/1", True),
        ("storage-client", "0"): ("mlx5_1/1", True),
        ("cnf-router", "0000:5e:01.0"): ("0000:5e:01.0", False),
        ("cnf-probe", "0000:5e:01.1"): ("0000:5e:01.1", False),
    }
    holders = {d.reading.device.id: d.holder.pod if d.holder else d.holders for d in joined.devices}
    assert holders["mlx5_0/1"] == 2, "a pool shared by two pods labels no single pod"
    assert holders["mlx5_1/1"] == "storage-client"
    assert holders["0000:5e:01.0"] == "cnf-router"
    allocatable = {d.reading.device.id for d in joined.devices if d.allocatable}
    assert {"amdgpu_xcp_2", "8f3a1c2e5b7d9e01", "mlx5_1/1", "0000:5e:01.3"} <= allocatable


def test_sample_values_are_floats(tmp_path: Path) -> None:
    part = make_tree(tmp_path, AMD)
    for reading in AmdgpuSource(context(part, Clock())).collect().readings:
        assert all(isinstance(s, Sample) and isinstance(s.value, float) for s in reading.samples)


@pytest.mark.parametrize(
    ("snippet", "message"),
    [
        ("amdgpu: [{pci: '0000:03:00.0', card: 1, colour: red}]", "sysfs.amdgpu[0]: unknown keys"),
        ("amdgpu: [{pci: 'nope', card: 1}]", "sysfs.amdgpu[0].pci: expected a PCI address"),
        (
            "amdgpu: [{pci: '0000:03:00.0', card: 1, temperature_c: {hotspot: 9}}]",
            "sysfs.amdgpu[0].temperature_c: unknown 'hotspot'",
        ),
        ("intel: [{pci: '0000:4d:00.0', card: 2, driver: nouveau}]", "driver: i915 or xe"),
        (
            "infiniband: [{pci: '0000:3b:00.0', ports: [{rx_gbps: fast}]}]",
            "rx_gbps: expected a number",
        ),
        ("sriov: {pf: x}", "sysfs.sriov: expected a list"),
        ("infiniband: [{pci: '0000:3b:00.0', ports: [{state: UP}]}]", "ports[0].state: one of"),
    ],
)
def test_scenario_errors_name_the_key(tmp_path: Path, snippet: str, message: str) -> None:
    with pytest.raises(ScenarioError, match=re.escape(message)):
        make_tree(tmp_path, f"node: n\nsysfs:\n  {snippet}\n")
