"""What the publish step keeps from cycle to cycle (issue 27): the join, who holds each
device (container usage), the family holders of the energy ledger, the GPU-NIC pairs, the
budget's per-layout group decisions. Each is kept only while what it read is unchanged.

One poller runs a node through changes between cycles (a new pod, a process that exits and
whose PID another container's process reuses, a sample whose group decision differs, a
device that disappears); a twin poller fed the same inputs has every kept result emptied
before each cycle. Their /metrics must be the same text every cycle, and the values a user
checks must follow each change."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from exporter.attribution.resolver import ProcessResolver
from exporter.cycle.poller import Poller
from exporter.derive.budget import Budget
from exporter.derive.energy import EnergyLedger
from exporter.derive.placement import PlacementReader
from exporter.model import (
    Allocation,
    Container,
    ContainerDevices,
    Device,
    DeviceReading,
    Holder,
    JoinedDevice,
    Pod,
    PodResourcesState,
    ProcessUsage,
    Sample,
    Snapshot,
    SourceResult,
)
from exporter.sinks.prometheus import PrometheusSink
from simulator.procfs import container_id
from tests.support import Clock, FixedKubelet, StaticSource, metrics_text
from tests.support.cycle import make_poller
from tests.support.sysfs_nodes import dgx_sysfs

UID_A = "8c1e2f3a-4b5c-4d6e-8f70-00000000000a"
UID_B = "8c1e2f3a-4b5c-4d6e-8f70-00000000000b"
CID_A, CID_B = container_id("ml", "a", "main"), container_id("ml", "b", "main")


@dataclass
class Node:
    """The inputs of a cycle, changed by hand between cycles."""

    gpus: list[str]
    nics: list[str]
    joules: float = 1000.0
    pods: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """pod -> the device-plugin IDs its one container holds."""
    processes: tuple[ProcessUsage, ...] = ()
    errors_type: str = "ecc_uncorrected"
    dropped: frozenset[str] = frozenset()
    """GPUs the source no longer sees."""

    def result(self) -> SourceResult:
        readings = []
        for i, bus_id in enumerate(self.gpus):
            gpu_id = f"GPU-{i}"
            if gpu_id in self.dropped:
                continue
            device = Device(gpu_id, "gpu", "nvidia", "H100", "fake",
                            attributes=(("hw.pci.bus_id", bus_id),))  # fmt: skip
            samples = (
                Sample("hw.gpu.memory.usage", 2.0**30 * (i + 1)),
                Sample("hw.gpu.memory.free", 2.0**33),  # group `memory`: off by default
                Sample("hw.errors", 1.0, (("error.type", self.errors_type),)),
                Sample("hw.energy", self.joules * (i + 1)),
            )
            readings.append(DeviceReading(device, samples))
        port = Device("mlx5_0/1", "network", "mellanox", "MT4129", "fake", parent=self.nics[0],
                      attributes=(("hw.pci.bus_id", self.nics[0]),),
                      aliases=frozenset({self.nics[0]}))  # fmt: skip
        readings.append(DeviceReading(port))
        return SourceResult("fake", tuple(readings), self.processes)

    def state(self) -> PodResourcesState:
        pods = []
        for name, ids in self.pods.items():
            gpus = tuple(i for i in ids if i.startswith("GPU-"))
            nics = tuple(i for i in ids if not i.startswith("GPU-"))
            devices = [ContainerDevices("nvidia.com/gpu", gpus)] if gpus else []
            devices += [ContainerDevices("rdma/hca", nics)] if nics else []
            pods.append(Pod(name, "ml", (Container("main", tuple(devices)),)))
        return PodResourcesState(pods=tuple(pods), api_version="v1")


def _proc(root: Path, pid: int, started: int, uid: str, cid: str) -> None:
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "stat").write_text(
        f"{pid} (python) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {started} 0 0\n"
    )
    (root / str(pid) / "cgroup").write_text(f"0::/kubepods/pod{uid}/{cid}\n")


@dataclass
class Twin:
    poller: Poller
    kubelet: FixedKubelet
    source: StaticSource
    budget: Budget
    ledger: EnergyLedger
    placement: PlacementReader

    def forget(self) -> None:
        """Empty everything the publish step keeps between cycles (the resolver's cache by
        PID start time is its own, tested in test_attribution)."""
        steps = {step.name: step.run for step in self.poller.pipeline.steps}
        getattr(steps["join"], "__self__")._cache = None  # noqa: B009 - a bound method's owner
        getattr(steps["attribution"], "__self__")._held._last = None  # noqa: B009
        self.budget._masks.clear()
        self.ledger._families = None
        self.ledger._by_size.clear()
        self.placement._last = None


def _twin(node: Node, sysfs: Path, proc: Path, logs: Path) -> Twin:
    kubelet, source = FixedKubelet(node.state()), StaticSource(node.result())
    budget = Budget(groups=frozenset({"energy"}))
    ledger, placement = EnergyLedger(), PlacementReader(sysfs)
    now = [1.7e9]

    def wall_clock() -> float:
        now[0] += 10.0
        return now[0]

    poller = make_poller(
        node="n1",
        sources={"fake": source},
        client=kubelet,
        budget=budget,
        sinks=[PrometheusSink()],
        clock=lambda: 0.0,
        wall_clock=wall_clock,
        resolver=ProcessResolver(proc, logs),
        parts=[placement.step, ledger.step],
    )
    return Twin(poller, kubelet, source, budget, ledger, placement)


def _value(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_every_kept_result_follows_its_inputs(tmp_path: Path) -> None:
    sysfs, gpus, nics = dgx_sysfs(tmp_path / "sysfs")
    proc, logs = tmp_path / "proc", tmp_path / "containers"
    logs.mkdir()
    for pod, cid in (("a", CID_A), ("b", CID_B)):
        os.symlink("/var/log/pods/x", logs / f"{pod}_ml_main-{cid}.log")
    _proc(proc, 42, 500, UID_A, CID_A)
    node = Node(gpus[:2], nics, pods={"a": ("GPU-0", nics[0]), "b": ("GPU-1",)})
    node.processes = (ProcessUsage("GPU-0", 42, 2.0**30, 0.5),)
    kept, fresh = _twin(node, sysfs, proc, logs), _twin(node, sysfs, proc, logs)

    async def cycle() -> str:
        node.joules += 100.0  # each GPU's counter moves every cycle: shares settle each time
        texts = []
        for twin in (kept, fresh):
            twin.kubelet.state, twin.source.result = node.state(), node.result()
            if twin is fresh:
                twin.forget()
            await twin.poller.run_once()
            assert twin.budget.last is not None
            texts.append(metrics_text(twin.budget.last))
        assert texts[0] == texts[1]
        return texts[0]

    try:
        text = await cycle()
        usage = "hw_gpu_container_memory_usage_bytes"
        assert _value(text, usage, k8s_pod_name="a", hw_id="GPU-0") == 2.0**30
        assert _value(text, usage, k8s_pod_name="a", hw_allocation_requested="true") == 2.0**30
        assert _value(text, "hw_container_pcie_placement", k8s_pod_name="a") is not None
        assert _value(text, "hw_errors_total", hw_id="GPU-0") == 1.0
        assert _value(text, "hw_gpu_memory_free_bytes", hw_id="GPU-0") is None

        node.joules *= 2  # only values change: everything kept is used as is
        text = await cycle()
        assert (_value(text, "hw_container_energy_joules_total", k8s_pod_name="a") or 0) > 0

        # PID 42 exits; another container's process gets the PID (a later start time).
        _proc(proc, 42, 900, UID_B, CID_B)
        text = await cycle()
        assert _value(text, usage, k8s_pod_name="a", hw_id="GPU-0") is None
        assert _value(text, usage, k8s_pod_name="b", hw_id="GPU-0") == 2.0**30
        assert _value(text, usage, k8s_pod_name="b", hw_allocation_requested="false") == 2.0**30

        # A new pod on GPU-0 (time-sliced with a): it is requested there now, and placed.
        node.pods["c"] = ("GPU-0", nics[0])
        text = await cycle()
        assert _value(text, "hw_allocation_info", k8s_pod_name="c", hw_id="GPU-0") == 1.0
        assert _value(text, "hw_container_pcie_placement", k8s_pod_name="c") is not None

        # b is given GPU-0 too: its process there is on a device it asked for now.
        node.pods["b"] = ("GPU-1", "GPU-0")
        text = await cycle()
        assert _value(text, usage, k8s_pod_name="b", hw_allocation_requested="true") == 2.0**30

        # c leaves and d takes its devices: as many allocations, another holder; b's process
        # exits, so nobody's use is measured and GPU-0's energy goes by what each holds.
        node.pods["d"] = node.pods.pop("c")
        node.processes = ()
        text = await cycle()
        assert _value(text, "hw_allocation_info", k8s_pod_name="c") is None
        assert _value(text, "hw_container_pcie_placement", k8s_pod_name="d") is not None
        assert _value(text, "hw_container_energy_joules_total", k8s_pod_name="d") == 0.0

        # An error type of another group (interconnect, off): the sample goes, not the GPU.
        node.errors_type = "pcie_replay"
        text = await cycle()
        assert _value(text, "hw_errors_total", hw_id="GPU-0") is None
        assert (_value(text, "hw_container_energy_joules_total", k8s_pod_name="d") or 0) > 0
        assert _value(text, "hw_gpu_memory_usage_bytes", hw_id="GPU-0") == 2.0**30

        # GPU-1 disappears: its series go, b's allocation of it is no longer joined.
        node.dropped = frozenset({"GPU-1"})
        text = await cycle()
        assert _value(text, "hw_gpu_memory_usage_bytes", hw_id="GPU-1") is None
        assert _value(text, "hw_allocation_info", k8s_pod_name="b", hw_id="GPU-1") is None
        assert _value(text, "hw_gpu_memory_usage_bytes", hw_id="GPU-0") == 2.0**30
    finally:
        await kept.poller.close()
        await fresh.poller.close()


def test_kept_pairs_are_made_again_when_their_pci_paths_are_due(tmp_path: Path) -> None:
    """The pairs follow the sysfs tree as often as before they were kept: a NIC gone from
    sysfs (hot-removed) still pairs until the paths are due a new read, then no longer."""
    sysfs, gpus, nics = dgx_sysfs(tmp_path)
    node = Node(gpus[:1], nics, pods={"a": ("GPU-0", nics[0])})
    clock = Clock(1000.0)
    reader = PlacementReader(sysfs, refresh=300.0, clock=clock)
    result = node.result()
    joined = tuple(JoinedDevice(r) for r in result.readings)
    holder = Holder("ml", "a", "main")
    allocations = (
        Allocation(holder, "nvidia.com/gpu", "GPU-0", "GPU-0"),
        Allocation(holder, "rdma/hca", nics[0], "mlx5_0/1"),
    )
    snapshot = Snapshot(timestamp=0.0, node="n1", devices=joined, allocations=allocations)
    first = reader.step(snapshot, {0: 0, 64: 1}).placements
    assert [(p.gpu_id, p.nic_id) for p in first] == [("GPU-0", "mlx5_0/1")]
    (sysfs / "bus" / "pci" / "devices" / nics[0]).unlink()
    clock.now += 299.0
    assert reader.step(snapshot, {0: 0, 64: 1}).placements == first
    clock.now += 2.0
    assert reader.step(snapshot, {0: 0, 64: 1}).placements == ()
