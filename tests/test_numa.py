"""NUMA alignment per container: the CPU -> NUMA map from sysfs, the join's judgement, and
the bundled `numa` scenario end to end (real gRPC to the simulated kubelet, real sources)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from exporter.derive.numa import CpuNodeMap, parse_cpulist, read_cpu_nodes
from exporter.ids import ResourceMatcher
from exporter.join import container_numa
from exporter.model import Container, ContainerDevices, ContainerMemory
from simulator.scenario import ScenarioError, parse_scenario
from simulator.sysfs import render
from simulator.sysfstree import write_tree
from tests.support import Clock

TWO_SOCKETS = {cpu: 0 for cpu in range(0, 8)} | {cpu: 1 for cpu in range(8, 16)}
GPU = "nvidia.com/gpu"


def test_parse_cpulist_reads_the_kernels_list_format() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    assert parse_cpulist("5") == (5,)
    assert parse_cpulist("\n") == ()  # a memory-only node
    for garbage in ("0-", "a-b", "3-1"):
        with pytest.raises(ValueError):
            parse_cpulist(garbage)


def _sysfs(tmp_path: Path, numa: str) -> Path:
    scenario = parse_scenario(f"node: n\nsysfs:\n  numa_nodes: {numa}\n")
    tree, _ = render(scenario, 0.0)
    write_tree(tmp_path, tree)
    return tmp_path


def test_cpu_map_from_the_simulated_tree(tmp_path: Path) -> None:
    root = _sysfs(tmp_path, '{0: "0-1,4", 1: "2-3", 2: ""}')
    assert (root / "devices/system/node/online").read_text() == "0,1,2\n"
    assert read_cpu_nodes(root) == {0: 0, 1: 0, 4: 0, 2: 1, 3: 1}


def test_an_unreadable_node_loses_only_its_cpus(tmp_path: Path) -> None:
    root = _sysfs(tmp_path, '{0: "0-1", 1: "2-3"}')
    (root / "devices/system/node/node1/cpulist").write_text("garbage\n")
    assert read_cpu_nodes(root) == {0: 0, 1: 0}


def test_no_numa_directory_is_an_empty_map(tmp_path: Path) -> None:
    assert read_cpu_nodes(tmp_path) == {}


def test_map_is_read_again_only_after_refresh(tmp_path: Path) -> None:
    root = _sysfs(tmp_path, '{0: "0-1"}')
    clock = Clock()
    cpu_nodes = CpuNodeMap(root, refresh=300, clock=clock)
    assert dict(cpu_nodes.get()) == {0: 0, 1: 0}
    (root / "devices/system/node/node0/cpulist").write_text("0-3\n")  # CPUs hot-added
    clock.now = 299
    assert not cpu_nodes.stale()
    assert dict(cpu_nodes.get()) == {0: 0, 1: 0}
    clock.now = 300
    assert dict(cpu_nodes.get()) == {0: 0, 1: 0, 2: 0, 3: 0}


def _judge(
    devices: dict[int, tuple[int, ...]],
    cpus: tuple[int, ...] = (),
    memory: tuple[tuple[str, tuple[int, ...]], ...] = (),
    cpu_nodes: dict[int, int] = TWO_SOCKETS,
) -> bool | None:
    container = Container(
        "c",
        devices=tuple(
            ContainerDevices(GPU, (f"GPU-{i}",), numa) for i, numa in sorted(devices.items())
        ),
        cpu_ids=cpus,
        memory=tuple(ContainerMemory(kind, 1 << 30, numa) for kind, numa in memory),
    )
    numa = container_numa("ns", "pod", container, ResourceMatcher(), cpu_nodes)
    assert numa is not None
    return numa.aligned


@pytest.mark.parametrize(
    ("title", "devices", "cpus", "memory", "aligned"),
    [
        ("GPUs on 1, CPUs on 0", {0: (1,), 1: (1,)}, (0, 1), (), False),
        ("GPU and CPUs on 0", {0: (0,)}, (0, 1, 2), (), True),
        ("both sides span 0 and 1", {0: (0,), 1: (1,)}, (0, 8), (), True),
        ("GPUs on 0 and 1, CPUs on 0 only", {0: (0,), 1: (1,)}, (0, 1), (), False),
        ("CPUs on 0 and 1, GPU on 0 only", {0: (0,)}, (0, 8), (), False),
        ("CPUs on 0, memory on 1", {0: (0,)}, (0,), (("memory", (1,)),), False),
        (
            "CPUs, memory and hugepages on 0",
            {0: (0,)},
            (0,),
            (("memory", (0,)), ("hugepages-1Gi", (0,))),
            True,
        ),
        ("shared pool, pinned memory on the GPU's node", {0: (1,)}, (), (("memory", (1,)),), True),
        ("shared pool, pinned memory elsewhere", {0: (1,)}, (), (("memory", (0,)),), False),
        ("shared pool, no pinned memory: nothing to compare", {0: (1,)}, (), (), None),
        ("device without topology", {0: ()}, (0,), (), None),
        ("an exclusive CPU the map does not know", {0: (0,)}, (0, 99), (), None),
    ],
)
def test_alignment(
    title: str,
    devices: dict[int, tuple[int, ...]],
    cpus: tuple[int, ...],
    memory: tuple[tuple[str, tuple[int, ...]], ...],
    aligned: bool | None,
) -> None:
    assert _judge(devices, cpus, memory) is aligned, title


def test_no_cpu_map_leaves_exclusive_cpus_unplaced() -> None:
    assert _judge({0: (0,)}, (0, 1), cpu_nodes={}) is None


def test_containers_without_matched_devices_are_not_reported() -> None:
    matcher = ResourceMatcher()
    plain = Container("app", cpu_ids=(0, 1))
    other = Container("app", devices=(ContainerDevices("example.com/fpga", ("f0",), (0,)),))
    assert container_numa("ns", "p", plain, matcher, TWO_SOCKETS) is None
    assert container_numa("ns", "p", other, matcher, TWO_SOCKETS) is None


def test_placement_lists_every_node_by_what_sits_there() -> None:
    container = Container(
        "pytorch",
        devices=(
            ContainerDevices(GPU, ("GPU-0", "GPU-1"), (1,)),
            ContainerDevices("rdma/hca", ("0",), (1,)),
        ),
        cpu_ids=(0, 1, 2),
        memory=(ContainerMemory("hugepages-1Gi", 1 << 30, (0, 1)),),
    )
    numa = container_numa("ml", "train", container, ResourceMatcher(), TWO_SOCKETS)
    assert numa is not None
    assert numa.devices == ((GPU, 1), ("rdma/hca", 1))
    assert (numa.exclusive_cpus, numa.cpus) == (3, (0,))
    assert numa.memory == (("hugepages-1Gi", 0), ("hugepages-1Gi", 1))
    assert numa.aligned is False


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        ("sysfs:\n  numa_nodes: [0, 1]\n", "expected a mapping of node -> cpulist"),
        ('sysfs:\n  numa_nodes: {zero: "0-3"}\n', "expected `<node number>"),
        ("unhealthy:\n  - {start: 3}\n", "unhealthy[0].ids"),
        ("unhealthy:\n  - {ids: [GPU-a], when: 3}\n", "unknown keys ['when']"),
    ],
)
def test_scenario_errors_name_the_key(section: str, problem: str) -> None:
    with pytest.raises(ScenarioError, match=re.escape(problem)):
        render(parse_scenario(f"node: n\n{section}"), 0.0)
