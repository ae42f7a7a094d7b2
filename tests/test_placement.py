"""GPU-NIC placement (exporter/derive/placement.py): levels from the sysfs PCI tree, per pair and per
container, on the DGX-like simulated node (scenario `dgx`), and the alert its badly placed
pod fires in a promtool test over the exporter's own series."""

from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path

import pytest
import yaml

from exporter.derive.placement import (
    Level,
    PciPath,
    PlacementReader,
    level,
    parse_device_path,
)
from exporter.model import (
    Allocation,
    AllocationKind,
    Device,
    DeviceReading,
    Holder,
    JoinedDevice,
    PairPlacement,
)
from exporter.points import best_and_worst
from tests import kit
from tests.nvml_support import fakenvml  # noqa: F401 - fixture
from tests.peers import promtool
from tests.support import metrics_text
from tests.support.simulated_node import scenario_snapshot
from tests.support.sysfs_nodes import dgx_sysfs

# nvidia-smi topo -m of the dgx scenario, GPU rows, mlx5_0..7 columns: written from the
# tree's design in the scenario's header (level-2 switch PIX, level-1 switch PXB, socket 0's
# two root ports on one host bridge PHB, socket 1's two host bridges NODE, sockets SYS).
DGX_TOPO = """
GPU0 PIX  PXB  PHB  PHB  SYS  SYS  SYS  SYS
GPU1 PXB  PIX  PHB  PHB  SYS  SYS  SYS  SYS
GPU2 PHB  PHB  PIX  PXB  SYS  SYS  SYS  SYS
GPU3 PHB  PHB  PXB  PIX  SYS  SYS  SYS  SYS
GPU4 SYS  SYS  SYS  SYS  PIX  PXB  NODE NODE
GPU5 SYS  SYS  SYS  SYS  PXB  PIX  NODE NODE
GPU6 SYS  SYS  SYS  SYS  NODE NODE PIX  PXB
GPU7 SYS  SYS  SYS  SYS  NODE NODE PXB  PIX
"""


def test_every_gpu_nic_pair_of_the_dgx_tree_has_its_exact_level(tmp_path: Path) -> None:
    sysfs, gpus, nics = dgx_sysfs(tmp_path)
    reader = PlacementReader(sysfs)
    expected = [row.split()[1:] for row in DGX_TOPO.strip().splitlines()]
    got = []
    for gpu in gpus:
        gpu_path = reader.path(gpu)
        assert gpu_path is not None, gpu
        row = []
        for nic in nics:
            nic_path = reader.path(nic)
            assert nic_path is not None, nic
            found = level(gpu_path, nic_path)
            row.append(found.name if found else "?")
        got.append(row)
    assert got == expected


def test_the_tree_is_the_kernels_layout(tmp_path: Path) -> None:
    """What the reader relies on, checked on the rendered files themselves."""
    sysfs, gpus, nics = dgx_sysfs(tmp_path)
    link = sysfs / "bus/pci/devices" / nics[0]
    assert os.readlink(link).startswith("../../../devices/pci0000:00/0000:00:01.1/")
    assert (link / "numa_node").read_text() == "0\n"
    assert (sysfs / "bus/pci/devices" / gpus[7] / "numa_node").read_text() == "1\n"
    assert (sysfs / "bus/pci/devices/0000:01:00.0/class").read_text() == "0x060400\n"
    assert (sysfs / "class/infiniband/mlx5_0/device").resolve() == link.resolve()


def _path(host: str, *bridges: str, numa: int | None = 0) -> PciPath:
    return PciPath("0000:ff:00.0", host, bridges, numa)


RP, USP, DSP1, DSP2 = "0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:02:01.0"


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [
        # two functions of one card directly below a root port: one bridge
        (_path("pci0000:00", RP), _path("pci0000:00", RP), Level.PIX),
        # each below its own downstream port of one switch
        (_path("pci0000:00", RP, USP, DSP1), _path("pci0000:00", RP, USP, DSP2), Level.PIX),
        # one below the root port itself, one behind a switch below it
        (_path("pci0000:00", RP), _path("pci0000:00", RP, USP, DSP1), Level.PXB),
        # two root ports of one host bridge
        (_path("pci0000:00", RP), _path("pci0000:00", "0000:00:03.0"), Level.PHB),
        (_path("pci0000:00", RP), _path("pci0000:40", "0000:40:01.0"), Level.NODE),
        (_path("pci0000:00", RP), _path("pci0000:80", "0000:80:01.0", numa=1), Level.SYS),
        # NUMA node unknown (-1) on a two-node machine: no level rather than a guess
        (_path("pci0000:00", RP, numa=None), _path("pci0000:80", "0000:80:01.0"), None),
    ],
)
def test_levels(a: PciPath, b: PciPath, want: Level | None) -> None:
    assert level(a, b) == want
    assert level(b, a) == want


def test_an_unknown_numa_node_on_a_one_node_machine_is_that_node() -> None:
    a = _path("pci0000:00", RP, numa=None)
    b = _path("pci0000:80", "0000:80:01.0", numa=None)
    assert level(a, b, single_node=True) is Level.NODE


def test_device_paths() -> None:
    dev = "0000:03:00.0"
    assert parse_device_path(dev, f"/host/sys/devices/pci0000:00/{RP}/{USP}/{DSP1}/{dev}") == (
        "pci0000:00",
        (RP, USP, DSP1),
    )
    # a Hyper-V guest: the PCI root bus sits below VMBus
    hyperv = f"/sys/devices/LNXSYSTM:00/LNXSYBUS:00/ACPI0004:00/VMBUS:00/abcd/pci1234:00/{dev}"
    assert parse_device_path(dev, hyperv) == ("pci1234:00", ())
    assert parse_device_path(dev, f"/sys/devices/pci0000:00/{RP}/0000:09:00.0") is None
    assert parse_device_path(dev, f"/sys/devices/platform/soc/{dev}") is None


def test_a_device_missing_from_sysfs_gives_no_pair(tmp_path: Path) -> None:
    assert PlacementReader(tmp_path).path("0000:05:00.0") is None


def test_worst_is_the_worst_gpus_nearest_nic() -> None:
    h = Holder("ml", "train", "pytorch")

    def pair(gpu: str, nic: str, lvl: Level) -> PairPlacement:
        return PairPlacement(h, gpu, nic, int(lvl), lvl.name)

    pairs = [
        pair("g0", "n0", Level.PIX),
        pair("g0", "n1", Level.SYS),
        pair("g1", "n0", Level.PXB),
        pair("g1", "n1", Level.SYS),
    ]
    assert best_and_worst(pairs) == {h: (1, 2)}


async def test_the_simulated_dgx_node_reports_each_pods_placement(
    tmp_path: Path,
    fakenvml: ctypes.CDLL,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    snapshot = await scenario_snapshot("dgx", tmp_path, monkeypatch)
    text = metrics_text(snapshot)
    by_pod = {
        (pod, which): _value(text, f"hw_container_pcie_placement_{which}", pod)
        for pod in ("trainer-good", "trainer-bad", "trainer-node", "trainer-spread")
        for which in ("best", "worst")
    }
    assert by_pod == {
        ("trainer-good", "best"): 1.0,
        ("trainer-good", "worst"): 1.0,
        ("trainer-bad", "best"): 5.0,
        ("trainer-bad", "worst"): 5.0,
        ("trainer-node", "best"): 4.0,
        ("trainer-node", "worst"): 4.0,
        ("trainer-spread", "best"): 1.0,
        ("trainer-spread", "worst"): 1.0,
    }
    pairs = [line for line in text.splitlines() if line.startswith("hw_container_pcie_placement{")]
    assert len(pairs) == 4 + 4 + 2 + 2  # GPUs x NICs of each trainer; inference holds no NIC
    assert 'k8s_pod_name="inference"' not in "\n".join(pairs)


def _value(text: str, family: str, pod: str) -> float:
    found = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(family + "{") and f'k8s_pod_name="{pod}"' in line
    ]
    assert len(found) == 1, (family, pod, found)
    return found[0]


@pytest.mark.peer
async def test_the_badly_placed_pod_fires_the_alert_in_promtool(
    tmp_path: Path,
    fakenvml: ctypes.CDLL,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The exporter's own `..._worst` series of the dgx node, held for 20 minutes, into
    `promtool test rules` with the shipped rule file: only trainer-bad fires."""
    snapshot = await scenario_snapshot("dgx", tmp_path / "node", monkeypatch)
    lines = [
        line
        for line in metrics_text(snapshot).splitlines()
        if line.startswith("hw_container_pcie_placement_worst{")
    ]
    assert len(lines) == 4
    series = [
        {"series": line.rsplit(" ", 1)[0], "values": f"{float(line.rsplit(' ', 1)[1]):g}+0x20"}
        for line in lines
    ]
    alert = "KubeDeviceGpuNicCrossesCpuInterconnect"
    labels = {
        "k8s_node_name": "dgx-node-1",
        "k8s_namespace_name": "ml-team",
        "k8s_pod_name": "trainer-bad",
        "k8s_container_name": "pytorch",
        "severity": "warning",
    }
    rule = next(r for r in kit.rules() if r["alert"] == alert)
    annotations = {
        key: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m[1]], text)
        for key, text in rule["annotations"].items()
    }
    test = {
        "rule_files": [str(kit.RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": "4m", "alertname": alert, "exp_alerts": []},
                    {
                        "eval_time": "10m",
                        "alertname": alert,
                        "exp_alerts": [{"exp_labels": labels, "exp_annotations": annotations}],
                    },
                ],
            }
        ],
    }
    assert annotations["summary"].startswith("ml-team/trainer-bad pytorch has a GPU")
    path = tmp_path / "placement-test.yaml"
    path.write_text(yaml.safe_dump(test))
    done = promtool("test", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_mig_slice_takes_its_gpus_place_and_a_dra_claim_counts_as_an_allocation(
    tmp_path: Path,
) -> None:
    """The pairs come from allocations of either kind; a slice has no PCI address of its
    own and sits where its GPU does."""
    sysfs, gpus, nics = dgx_sysfs(tmp_path)
    gpu = Device("GPU-7", "gpu", "nvidia", "H100", "nvml", attributes=(("hw.pci.bus_id", gpus[7]),))
    mig = Device("MIG-7a", "gpu", "nvidia", "H100 MIG 1g.10gb", "nvml", parent="GPU-7")
    port = Device("mlx5_7/1", "network", "mellanox", "MT4129", "rdma", parent=nics[7],
                  attributes=(("hw.pci.bus_id", nics[7]),))  # fmt: skip
    far = Device("mlx5_0/1", "network", "mellanox", "MT4129", "rdma", parent=nics[0],
                 attributes=(("hw.pci.bus_id", nics[0]),))  # fmt: skip
    h = Holder("ml", "train", "pytorch")
    allocations = [
        Allocation(h, "nvidia.com/mig-1g.10gb", "MIG-7a", "MIG-7a"),
        Allocation(h, "nic.example.com", "mlx5-7", "mlx5_7/1", kind=AllocationKind.DRA,
                   claim="nics", driver="nic.example.com", pool="node-1"),
        Allocation(h, "nvidia.com/hostdev", nics[0], "mlx5_0/1"),
    ]  # fmt: skip
    joined = [JoinedDevice(DeviceReading(d)) for d in (gpu, mig, port, far)]
    pairs = PlacementReader(sysfs).placements(allocations, joined, {0: 0, 64: 1})
    assert [(p.gpu_id, p.nic_id, p.level_name) for p in pairs] == [
        ("MIG-7a", "mlx5_0/1", "SYS"),
        ("MIG-7a", "mlx5_7/1", "PIX"),
    ]
    assert best_and_worst(pairs) == {h: (1, 1)}
