"""The NVML source against the simulated driver: discovery, metrics in base units, MIG,
NOT_SUPPORTED, lost GPUs, driver reloads, XID events and counters that never go back."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest
import yaml

from exporter.metrics import ATTRIBUTES, SPECS, Kind
from exporter.model import DeviceReading, SourceResult
from exporter.sources import registry
from exporter.sources.nvml import NvmlUnavailable
from exporter.sources.nvml.xid import XidEvents
from simulator.nvml import STATE_ENV
from simulator.nvml_scenario import parse_nvidia
from simulator.scenario import load_scenario
from tests.nvml_support import NvidiaNode, fakenvml, nvidia_node

__all__ = ["fakenvml", "nvidia_node"]

GPU = "GPU-6a3f1c2e-1b7d-4c1e-9a55-00000000000{}"
MIG = "MIG-0b6f4a21-7d3c-5e2a-8f10-00000000010{}"

DGX = """
nvidia:
  driver_version: "580.95.05"
  gpu_defaults:
    utilization: 0.5
    unsupported: [encoder_utilization]
  gpus:
""" + "".join(f"    - uuid: GPU-6a3f1c2e-1b7d-4c1e-9a55-00000000000{i}\n" for i in range(8))


def reading(result: SourceResult, device_id: str) -> DeviceReading:
    (found,) = [r for r in result.readings if r.device.id == device_id]
    return found


def value(r: DeviceReading, metric: str, **attrs: str) -> float | None:
    wanted = {k.replace("__", "."): v for k, v in attrs.items()}
    hits = [
        s.value
        for s in r.samples
        if s.metric == metric and wanted.items() <= dict(s.attributes).items()
    ]
    assert len(hits) <= 1, f"{metric} {attrs}: {hits}"
    return hits[0] if hits else None


def with_faults(scenario: str, faults: list[dict[str, object]]) -> str:
    """A bundled scenario's YAML with `faults` in its nvidia section."""
    loaded = load_scenario(scenario)
    assert loaded.path is not None
    doc = yaml.safe_load(loaded.path.read_text())
    doc["nvidia"]["faults"] = faults
    return str(yaml.safe_dump(doc))


def status(r: DeviceReading) -> str:
    (state,) = [
        dict(s.attributes)["hw.state"]
        for s in r.samples
        if s.metric == "hw.status" and s.value == 1
    ]
    return state


def test_registered_with_options() -> None:
    info = registry()["nvml"]
    assert info.default_enabled
    assert {o.name for o in info.options} == {
        "rediscover-interval",
        "processes",
        "xid-events",
        "slow-interval",
        "gpm-interval",
        "restart-after",
        "lost-retention",
    }


def test_a_dgx_node_reports_eight_gpus_in_base_units(
    nvidia_node: Callable[[str], NvidiaNode],
) -> None:
    node = nvidia_node(DGX)
    source = node.source()
    source.collect()
    result = node.collect_at(source, 10.0)
    assert len(result.readings) == 8
    assert result.field_errors == 0
    for i, r in enumerate(result.readings):
        device = r.device
        assert (device.id, device.type, device.vendor, device.model) == (
            GPU.format(i),
            "gpu",
            "nvidia",
            "NVIDIA H100 80GB HBM3",
        )
        attrs = dict(device.attributes)
        assert set(attrs) <= set(ATTRIBUTES)
        assert attrs["hw.gpu.index"] == attrs["hw.gpu.minor"] == str(i)
        assert attrs["hw.driver_version"] == "580.95.05"
        assert (
            attrs["hw.pci.bus_id"]
            == f"0000:{('18', '2a', '3a', '5d', '9a', 'ab', 'ba', 'db')[i]}:00.0"
        )
        assert all(s.metric in SPECS for s in r.samples)
        assert status(r) == "ok"
    r = result.readings[3]
    assert value(r, "hw.gpu.utilization", hw__gpu__task="general") == 0.5
    assert value(r, "hw.gpu.utilization", hw__gpu__task="encoder") is None  # NOT_SUPPORTED
    assert value(r, "hw.gpu.memory.limit") == 81559 * 2**20
    assert value(r, "hw.gpu.memory.reserved") == 491 * 2**20
    assert value(r, "hw.power") == pytest.approx(70 + 595 * 0.5)
    assert value(r, "hw.power.limit") == 700.0
    assert value(r, "hw.energy") == pytest.approx(10 * (70 + 595 * 0.5), abs=0.01)
    assert value(r, "hw.gpu.clock", hw__gpu__clock__type="sm") == 1980e6
    assert value(r, "hw.gpu.clock", hw__gpu__clock__type="memory") == 2619e6
    assert value(r, "hw.temperature", hw__sensor_location="gpu") == 55.0
    assert value(r, "hw.temperature", hw__sensor_location="memory") == 61.0
    assert value(r, "hw.gpu.io", network__io__direction="transmit") == pytest.approx(
        10 * 1e6 + 12e9 * 5, abs=1
    )
    assert value(r, "hw.gpu.nvlink.io", network__io__direction="transmit") == pytest.approx(
        120e9 * 5, rel=1e-6
    )
    assert value(r, "hw.errors", error__type="ecc_corrected") == 0
    assert value(r, "hw.gpu.clock.throttled", hw__gpu__clock__throttle_reason="gpu_idle") == 0


def test_mig_slices_with_mixed_profiles(nvidia_node: Callable[[str], NvidiaNode]) -> None:
    node = nvidia_node("demo")
    source = node.source()
    first = node.collect_at(source, 10.0)
    slice_ = reading(first, MIG.format(2))
    assert value(slice_, "hw.gpu.utilization", hw__gpu__task="general") is None  # one GPM sample
    result = node.collect_at(source, 30.0)
    parent = reading(result, GPU.format(1))
    assert value(parent, "hw.gpu.memory.limit") == 81559 * 2**20
    profiles = {}
    for n in range(1, 5):
        r = reading(result, MIG.format(n))
        attrs = dict(r.device.attributes)
        profiles[n] = attrs["hw.gpu.mig.profile"]
        assert r.device.parent == GPU.format(1)
        assert r.device.model == f"NVIDIA H100 80GB HBM3 MIG {attrs['hw.gpu.mig.profile']}"
        assert attrs["hw.gpu.index"] == "1"
        assert attrs["hw.gpu.mig.compute_instance_id"] == "0"
        assert status(r) == "ok"
    assert profiles == {1: "1g.10gb", 2: "1g.10gb", 3: "1g.10gb", 4: "3g.40gb"}
    assert (
        dict(reading(result, MIG.format(4)).device.attributes)["hw.gpu.mig.gpu_instance_id"] == "2"
    )
    small, big = reading(result, MIG.format(2)), reading(result, MIG.format(4))
    assert value(small, "hw.gpu.memory.limit") == 9984 * 2**20
    assert value(big, "hw.gpu.memory.limit") == 39936 * 2**20
    # per-instance activity through GPM: the 1g.10gb slice 102 is a constant 90% busy
    assert value(small, "hw.gpu.utilization", hw__gpu__task="general") == pytest.approx(0.9)
    # and GPM SM_UTIL: the simulated slice keeps 85 % of its SMs busy while busy
    assert value(small, "hw.gpu.sm.activity") == pytest.approx(0.9 * 0.85)
    # and ANY_TENSOR_UTIL: its tensor pipes are busy 60 % of that time
    assert value(small, "hw.gpu.tensor.activity") == pytest.approx(0.9 * 0.6)
    # the MIG-enabled parent has no utilization counter, but GPM gives its activity
    assert value(parent, "hw.gpu.utilization", hw__gpu__task="general") is not None
    # processes belong to their slice, with memory and no utilization (not under MIG)
    procs = {p.pid: p for p in result.processes}
    assert procs[5101].device_id == MIG.format(1)
    assert procs[5201].device_id == MIG.format(4)
    assert procs[5201].memory_bytes == 22 * 2**30
    assert procs[5201].utilization is None


def test_mig_processes_are_not_seen_from_an_own_pid_namespace(
    nvidia_node: Callable[[str], NvidiaNode],
) -> None:
    """Without hostPID the lists are empty and MIG has no utilization samples: nothing."""
    loaded = load_scenario("demo")
    assert loaded.path is not None
    doc = yaml.safe_load(loaded.path.read_text())
    doc["nvidia"]["pid_namespace"] = "own"
    node = nvidia_node(yaml.safe_dump(doc))
    result = node.collect_at(node.source(), 30.0)
    assert not [p for p in result.processes if p.device_id.startswith("MIG-")]
    # whole GPUs still have their busy processes, by utilization only
    assert {p.pid: p.memory_bytes for p in result.processes} == {
        4242: None,
        900: None,
        6001: None,
        6002: None,
        7001: None,
    }


def test_not_supported_fields_have_no_series(nvidia_node: Callable[[str], NvidiaNode]) -> None:
    node = nvidia_node("""
nvidia:
  pid_namespace: host
  gpus:
    - uuid: GPU-00000000-0000-4000-8000-000000000000
      unsupported: [power, memory_temperature, ecc, nvlink, process_utilization]
      processes: [{pid: 5, memory: 1GiB, utilization: 0.5}]
    - uuid: GPU-00000000-0000-4000-8000-000000000001
  faults:
    - {kind: not_supported, gpus: [1], features: [energy, clocks], start: 20, end: 40}
""")
    source = node.source()
    result = node.collect_at(source, 10.0)
    bare, full = result.readings
    assert value(bare, "hw.power") is None
    assert value(bare, "hw.temperature", hw__sensor_location="memory") is None
    assert value(bare, "hw.temperature", hw__sensor_location="gpu") is not None
    assert value(bare, "hw.errors", error__type="ecc_corrected") is None
    assert not [s for s in bare.samples if s.metric == "hw.gpu.nvlink.io"]
    ((pid, memory, utilization),) = [
        (p.pid, p.memory_bytes, p.utilization)
        for p in result.processes
        if p.device_id == bare.device.id
    ]
    assert (pid, memory, utilization) == (5, 2**30, None)
    assert value(full, "hw.power") is not None
    assert result.field_errors == 0  # NOT_SUPPORTED is not an error
    during = reading(node.collect_at(source, 30.0), full.device.id)
    assert value(during, "hw.energy") is None
    assert not [s for s in during.samples if s.metric == "hw.gpu.clock"]
    after = reading(node.collect_at(source, 45.0), full.device.id)
    assert value(after, "hw.energy") == pytest.approx(45 * 70.0)


def test_a_gpu_lost_mid_run_fails_alone(nvidia_node: Callable[[str], NvidiaNode]) -> None:
    node = nvidia_node(with_faults("demo", [{"kind": "lost", "gpus": [1], "start": 20}]))
    source = node.source(**{"rediscover-interval": "30s"})
    before = node.collect_at(source, 10.0)
    assert status(reading(before, GPU.format(1))) == "ok"
    for t in (25.0, 60.0):  # 60: after a rediscovery, where the handle cannot be had
        result = node.collect_at(source, t)
        lost = reading(result, GPU.format(1))
        assert status(lost) == "failed"
        assert [s.metric for s in lost.samples] == ["hw.status"] * 3
        for n in range(1, 5):
            assert status(reading(result, MIG.format(n))) == "failed"
        for other in (0, 2, 3):
            r = reading(result, GPU.format(other))
            assert status(r) == "ok"
            assert value(r, "hw.power") is not None


def test_xid_events_are_counted_once_each(nvidia_node: Callable[[str], NvidiaNode]) -> None:
    node = nvidia_node("""
nvidia:
  gpus:
    - uuid: GPU-00000000-0000-4000-8000-000000000000
    - uuid: GPU-00000000-0000-4000-8000-000000000001
      mig: [{uuid: MIG-00000000-0000-5000-8000-000000000101, profile: 3g.40gb, gi: 2}]
  xid:
    - {at: 5, device: 0, xid: 13}
    - {at: 6, device: 0, xid: 13}
    - {at: 7, device: 0, xid: 31}
    - {at: 8, device: MIG-00000000-0000-5000-8000-000000000101, xid: 43}
    - {at: 30, device: 1, xid: 79}
""")
    source = node.source()
    result = node.collect_at(source, 1.0)
    assert not [s for r in result.readings for s in r.samples if s.metric == "hw.gpu.xid.errors"]
    # dcgm-exporter's DCGM_FI_DEV_XID_ERRORS before any XID: 0 on every GPU and slice
    assert {value(r, "hw.gpu.xid.last") for r in result.readings} == {0.0}
    for t in (10.0, 15.0, 20.0):  # the cycle after the events counts each once
        result = node.collect_at(source, t)
        gpu0 = reading(result, "GPU-00000000-0000-4000-8000-000000000000")
        mig = reading(result, "MIG-00000000-0000-5000-8000-000000000101")
        gpu1 = reading(result, "GPU-00000000-0000-4000-8000-000000000001")
        assert value(gpu0, "hw.gpu.xid.errors", hw__gpu__xid="13") == 2
        assert value(gpu0, "hw.gpu.xid.errors", hw__gpu__xid="31") == 1
        assert value(mig, "hw.gpu.xid.errors", hw__gpu__xid="43") == 1
        assert value(gpu1, "hw.gpu.xid.errors", hw__gpu__xid="43") is None
        # the last XID: 31 on GPU 0 (after two 13s); the slice's 43 on its GPU and the slice
        assert value(gpu0, "hw.gpu.xid.last") == 31
        assert (value(gpu1, "hw.gpu.xid.last"), value(mig, "hw.gpu.xid.last")) == (43, 43)
    result = node.collect_at(source, 31.0)
    gpu1 = reading(result, "GPU-00000000-0000-4000-8000-000000000001")
    assert value(gpu1, "hw.gpu.xid.errors", hw__gpu__xid="79") == 1
    assert value(gpu1, "hw.gpu.xid.last") == 79
    mig = reading(result, "MIG-00000000-0000-5000-8000-000000000101")
    assert value(mig, "hw.gpu.xid.last") == 79  # the GPU's XID shows on its slice too
    assert sum(source.xids.snapshot().values()) == 5


COUNTERS = """
nvidia:
  gpus:
    - uuid: GPU-00000000-0000-4000-8000-000000000000
      utilization: {pattern: sine, min: 0.1, max: 0.9, period: 17}
      ecc_corrected_per_hour: 3600
      pcie_replays_per_hour: 1800
      nvlink_crc_per_hour: 720
      ecc_uncorrected_at: [12, 55]
  faults:
    - {kind: driver_unloaded, start: 30, end: 40}
"""


def test_counters_never_go_backwards_even_across_a_driver_reload(
    nvidia_node: Callable[[str], NvidiaNode],
) -> None:
    node = nvidia_node(COUNTERS)
    source = node.source()
    last: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    failed_cycles = 0
    for step in range(0, 80):
        t = step * 1.5
        try:
            result = node.collect_at(source, t)
        except NvmlUnavailable:
            failed_cycles += 1
            continue
        for r in result.readings:
            for s in r.samples:
                if SPECS[s.metric].kind is Kind.COUNTER:
                    key = (s.metric, s.attributes)
                    assert s.value >= last.get(key, 0.0), f"{key} went back at t={t}"
                    last[key] = s.value
    assert failed_cycles == 7  # t = 30 .. 39: no driver
    # the driver's own energy counter restarted at t=40; ours kept adding
    energy = last[("hw.energy", ())]
    assert energy > 70 * 100
    assert last[("hw.errors", (("error.type", "ecc_uncorrected"),))] == 2
    assert last[("hw.errors", (("error.type", "ecc_corrected"),))] >= 100


def test_no_driver_is_no_devices_until_one_appears(
    nvidia_node: Callable[[str], NvidiaNode], caplog: pytest.LogCaptureFixture
) -> None:
    node = nvidia_node(COUNTERS)
    node.part.close()  # no state file: as if no driver were loaded
    source = node.source()
    caplog.set_level("INFO")
    for _ in range(2):
        result = source.collect()
        assert (result.readings, result.field_errors) == ((), 0)
        assert result.absent == "the NVIDIA driver is not loaded on this node"
    assert [r.message for r in caplog.records].count(
        "no NVIDIA GPUs here: the NVIDIA driver is not loaded on this node"
    ) == 1
    result = node.collect_at(source, 5.0)  # init is tried again every cycle
    assert [r.device.id for r in result.readings] == ["GPU-00000000-0000-4000-8000-000000000000"]
    assert result.absent == ""


def test_a_driver_reload_recovers_with_fresh_handles(
    nvidia_node: Callable[[str], NvidiaNode],
) -> None:
    node = nvidia_node(COUNTERS)
    source = node.source()
    before = node.collect_at(source, 20.0)
    with pytest.raises(NvmlUnavailable, match="lost the driver"):
        node.collect_at(source, 31.0)
    with pytest.raises(NvmlUnavailable, match="init failed"):
        node.collect_at(source, 35.0)
    after = node.collect_at(source, 41.0)
    assert [r.device for r in after.readings] == [r.device for r in before.readings]
    assert status(after.readings[0]) == "ok"
    assert node.calls("nvmlInitWithFlags") == 3


def test_static_queries_are_cached_and_counters_batched(
    nvidia_node: Callable[[str], NvidiaNode],
) -> None:
    node = nvidia_node("demo")
    source = node.source(**{"rediscover-interval": "60s"})
    node.collect_at(source, 1.0)
    discovery = {
        f: node.calls(f)
        for f in ("nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetPciInfo_v3")
    }
    assert discovery["nvmlDeviceGetUUID"] == 8  # 4 GPUs + 4 MIG slices
    fields = node.calls("nvmlDeviceGetFieldValues")
    for t in (10.0, 20.0, 30.0):
        node.collect_at(source, t)
    assert {f: node.calls(f) for f in discovery} == discovery
    assert node.calls("nvmlDeviceGetFieldValues") == fields + 3 * 4  # one batch per GPU
    assert node.calls("nvmlDeviceGetPcieThroughput") == 0
    node.collect_at(source, 61.0)  # the rediscovery interval passed
    assert node.calls("nvmlDeviceGetUUID") == 16


def test_a_pending_row_remap_degrades_the_gpu(nvidia_node: Callable[[str], NvidiaNode]) -> None:
    node = nvidia_node("""
nvidia:
  gpus:
    - uuid: GPU-00000000-0000-4000-8000-000000000000
      remapped_rows: {correctable: 2, uncorrectable: 1, pending: true}
""")
    (r,) = node.collect_at(node.source(), 1.0).readings
    assert status(r) == "degraded"
    assert value(r, "hw.gpu.memory.row_remap.pending") == 1
    assert (
        value(r, "hw.gpu.memory.remapped_rows", hw__gpu__memory__remap_cause="uncorrectable") == 1
    )


def test_processes_option_turns_per_process_reads_off(
    nvidia_node: Callable[[str], NvidiaNode],
) -> None:
    node = nvidia_node("demo")
    result = node.collect_at(node.source(processes="false"), 1.0)
    assert result.processes == ()
    assert not [
        s for r in result.readings for s in r.samples if s.metric.startswith("hw.gpu.process")
    ]
    assert node.calls("nvmlDeviceGetComputeRunningProcesses_v3") == 0
    assert node.calls("nvmlDeviceGetProcessUtilization") == 0


def test_xid_events_need_no_thread_and_close_frees_the_event_set(
    nvidia_node: Callable[[str], NvidiaNode],
) -> None:
    node = nvidia_node("demo")
    before = set(threading.enumerate())
    source = node.source()
    node.collect_at(source, 1.0)
    node.collect_at(source, 2.0)
    assert source._events is not None
    assert set(threading.enumerate()) == before  # collect() empties the set: no waiting thread
    assert node.calls("nvmlEventSetWait_v2") >= 2  # once a cycle at least (until it times out)
    source.close()
    assert source._events is None
    assert node.calls("nvmlEventSetFree") == 1


def test_an_xid_storm_is_taken_over_cycles_and_none_is_lost(
    nvidia_node: Callable[[str], NvidiaNode], monkeypatch: pytest.MonkeyPatch
) -> None:
    storm = "\n".join(f"    - {{at: 5, device: 0, xid: {13 + i % 2}}}" for i in range(10))
    node = nvidia_node(f"""
nvidia:
  gpus:
    - uuid: GPU-00000000-0000-4000-8000-000000000000
  xid:
{storm}
""")
    monkeypatch.setattr(XidEvents, "MAX_PER_CYCLE", 4)
    source = node.source()
    node.collect_at(source, 1.0)
    seen = []
    for t in (6.0, 7.0, 8.0):
        node.collect_at(source, t)
        seen.append(sum(source.xids.snapshot().values()))
    assert seen == [4, 8, 10]  # 4 a cycle at most; the rest stay queued for the next
    result = node.collect_at(source, 9.0)
    gpu = reading(result, "GPU-00000000-0000-4000-8000-000000000000")
    assert value(gpu, "hw.gpu.xid.errors", hw__gpu__xid="13") == 5
    assert value(gpu, "hw.gpu.xid.errors", hw__gpu__xid="14") == 5


def test_samples_only_use_known_metrics_and_attributes(
    nvidia_node: Callable[[str], NvidiaNode],
) -> None:
    node = nvidia_node("dense")
    source = node.source()
    node.collect_at(source, 10.0)
    result = node.collect_at(source, 60.0)
    assert len(result.readings) == 8 + 6 * 7
    for r in result.readings:
        for s in r.samples:
            spec = SPECS[s.metric]
            assert {k for k, _ in s.attributes} <= set(spec.attributes), s
    # dense: GPU 7 lost memory temperature at t=30..90, GPU 3 is thermally throttled 40..70
    gpu7 = reading(result, "GPU-3f0c9a52-81d4-4b7e-b0c6-5e1a2d7c0007")
    assert value(gpu7, "hw.temperature", hw__sensor_location="memory") is None
    gpu3 = reading(result, "GPU-3f0c9a52-81d4-4b7e-b0c6-5e1a2d7c0003")
    assert (
        value(gpu3, "hw.gpu.clock.throttled", hw__gpu__clock__throttle_reason="hw_thermal_slowdown")
        == 1
    )


def test_rediscovery_keeps_mig_activity_and_the_event_set(
    nvidia_node: Callable[[str], NvidiaNode],
) -> None:
    node = nvidia_node("demo")
    source = node.source(**{"rediscover-interval": "5s"})
    node.collect_at(source, 1.0)
    events = source._events
    for t in (4.0, 7.0, 10.0, 13.0):  # rediscoveries at 7 and 13
        r = reading(node.collect_at(source, t), MIG.format(2))
        assert value(r, "hw.gpu.utilization", hw__gpu__task="general") == pytest.approx(0.9), t
    assert node.calls("nvmlDeviceGetUUID") == 3 * 8
    assert source._events is events
    assert node.calls("nvmlGpmSampleAlloc") == 2 * 8  # four GPUs (MIG or not), four slices


def test_a_mig_reconfiguration_is_picked_up(nvidia_node: Callable[[str], NvidiaNode]) -> None:
    node = nvidia_node("demo")
    source = node.source()
    node.collect_at(source, 1.0)
    doc = yaml.safe_load(with_faults("demo", []))
    migs = doc["nvidia"]["gpus"][1]["mig"]
    migs[2] = {"uuid": MIG.format(5), "profile": "2g.20gb", "gi": 5}  # 103 destroyed, 105 made
    node.part.spec = parse_nvidia(doc["nvidia"], "demo")
    node.collect_at(source, 2.0)  # the stale handle fails: rediscover next cycle
    result = node.collect_at(source, 3.0)
    ids = {r.device.id for r in result.readings}
    assert MIG.format(5) in ids
    assert MIG.format(3) not in ids
    new = reading(result, MIG.format(5))
    assert dict(new.device.attributes)["hw.gpu.mig.profile"] == "2g.20gb"
    assert result.field_errors == 0


NO_LIBRARY = """
import logging
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
from exporter.sources import SourceContext
from exporter.sources.nvml import NvmlSource
source = NvmlSource(SourceContext())
for _ in range(3):
    result = source.collect()
    print(len(result.readings), result.field_errors, result.absent)
"""


@pytest.mark.peer
@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has libnvidia-ml"
)
def test_without_any_nvml_library_the_source_has_no_devices_and_says_so_once() -> None:
    # An AMD, Intel or NIC-only node: no libnvidia-ml at all is "no devices", not a failure.
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", STATE_ENV)}
    out = subprocess.run(
        [sys.executable, "-c", NO_LIBRARY], env=env, capture_output=True, text=True, check=True
    )
    reason = "libnvidia-ml.so.1 not found (no NVIDIA driver mounted into this pod)"
    assert out.stdout.splitlines() == [f"0 0 {reason}"] * 3
    assert out.stderr.splitlines() == [f"INFO no NVIDIA GPUs here: {reason}"]


def test_a_failed_read_keeps_counters_and_counts_an_error(
    nvidia_node: Callable[[str], NvidiaNode],
) -> None:
    node = nvidia_node("""
nvidia:
  gpus:
    - uuid: GPU-00000000-0000-4000-8000-000000000000
  faults:
    - {kind: error, gpus: [0], features: [energy, memory_temperature, power], start: 20, end: 30}
""")
    source = node.source()
    (before,) = node.collect_at(source, 15.0).readings
    result = node.collect_at(source, 25.0)
    (during,) = result.readings
    assert result.field_errors == 3
    assert value(during, "hw.energy") == value(before, "hw.energy") == 15 * 70.0
    assert value(during, "hw.temperature", hw__sensor_location="memory") is None
    assert value(during, "hw.power") is None
    assert status(during) == "ok"
    (after,) = node.collect_at(source, 35.0).readings
    assert value(after, "hw.energy") == 35 * 70.0


@pytest.mark.slow
def test_close_does_not_hang_on_a_hung_driver_call(
    nvidia_node: Callable[[str], NvidiaNode],
) -> None:
    node = nvidia_node("""
nvidia:
  gpus: [{uuid: GPU-00000000-0000-4000-8000-000000000000}]
  faults: [{kind: slow, function: nvmlDeviceGetPowerUsage, ms: 1500, start: 10}]
""")
    source = node.source()
    node.collect_at(source, 1.0)
    node.at(10.0)
    collecting = threading.Thread(target=source.collect)
    collecting.start()
    deadline = time.monotonic() + 5
    while node.calls("nvmlDeviceGetPowerUsage") < 2 and time.monotonic() < deadline:
        time.sleep(0.005)  # no clock to inject: a real thread is inside a real (slow) call
    started = time.monotonic()
    source.close()  # gives up on the lock after 1 s: the call still has ~1.4 s to go
    assert time.monotonic() - started < 1.3
    assert node.calls("nvmlShutdown") == 0
    collecting.join()
    source.close()  # now it shuts NVML down
    assert node.calls("nvmlShutdown") == 1


def test_an_older_driver_without_newer_functions_still_reports(
    nvidia_node: Callable[[str], NvidiaNode], caplog: pytest.LogCaptureFixture
) -> None:
    node = nvidia_node("""
nvidia:
  gpus: [{uuid: GPU-00000000-0000-4000-8000-000000000000, utilization: 0.5}]
  faults:
    - {kind: missing, function: nvmlDeviceGetTemperatureV}
    - {kind: missing, function: nvmlDeviceGetMemoryInfo_v2}
    - {kind: missing, function: nvmlGpmQueryDeviceSupport}
    - {kind: missing, function: nvmlDeviceGetCurrentClocksEventReasons}
""")
    source = node.source()
    caplog.set_level("INFO")
    for t in (1.0, 2.0):
        result = node.collect_at(source, t)
        (r,) = result.readings
        assert result.field_errors == 0
        assert value(r, "hw.temperature", hw__sensor_location="gpu") == 55.0
        # v1 memory info: the reserved memory counts as used, and is not reported apart
        assert value(r, "hw.gpu.memory.usage") == 491 * 2**20
        assert value(r, "hw.gpu.memory.reserved") is None
        assert value(r, "hw.gpu.clock.throttled", hw__gpu__clock__throttle_reason="gpu_idle") == 0
    # the newer calls are tried once, then only the older ones
    assert node.calls("nvmlDeviceGetTemperatureV") == 1
    assert node.calls("nvmlDeviceGetTemperature") == 2
    assert node.calls("nvmlDeviceGetMemoryInfo_v2") == 1
    assert node.calls("nvmlDeviceGetMemoryInfo") == 2
    missing = sorted(r.getMessage() for r in caplog.records if "has no" in r.getMessage())
    assert missing == [  # each logged once
        f"NVML here has no {fn} (an older driver): not calling it again"
        for fn in (
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetMemoryInfo_v2",
            "nvmlDeviceGetTemperatureV",
            "nvmlGpmQueryDeviceSupport",
        )
    ]


def test_costly_values_are_read_every_slow_interval_and_held_between(
    nvidia_node: Callable[[str], NvidiaNode],
) -> None:
    # energy costs 3.1 ms a call on a real H100 (bench/nvml_probe.py): not every second
    node = nvidia_node(COUNTERS)
    source = node.source(**{"slow-interval": "10s"})
    (first,) = node.collect_at(source, 1.0).readings
    (held,) = node.collect_at(source, 5.0).readings
    (fresh,) = node.collect_at(source, 11.5).readings
    energy = [value(r, "hw.energy") for r in (first, held, fresh)]
    assert energy[0] == energy[1] is not None and energy[2] is not None and energy[2] > energy[1]
    replays = [value(r, "hw.errors", error__type="pcie_replay") for r in (first, held, fresh)]
    assert replays[1] == replays[0] is not None
    # the cheap values move every cycle
    assert value(held, "hw.power") != value(first, "hw.power")


def test_gpm_activity_is_measured_every_gpm_interval(
    nvidia_node: Callable[[str], NvidiaNode],
) -> None:
    # nvmlGpmMetricsGet costs 1.5 ms on a real H100 (docs/nvml.md), per device: primed
    # at the first cycle, measured at the second, then every GPM interval (its own flag,
    # not the slow interval's)
    node = nvidia_node("demo")
    source = node.source(**{"slow-interval": "1h", "gpm-interval": "10s"})
    node.collect_at(source, 1.0)
    node.collect_at(source, 2.0)
    measured = node.calls("nvmlGpmMetricsGet")
    assert measured == 8  # four GPUs (three with MIG off, one MIG parent), four slices
    sm = [
        value(reading(result, device), "hw.gpu.sm.activity")
        for result in [node.collect_at(source, 2.5)]
        for device in (GPU.format(0), MIG.format(2))
    ]
    assert all(s is not None for s in sm)
    for t in (3.0, 5.0, 9.0):
        result = node.collect_at(source, t)
        r = reading(result, MIG.format(2))
        assert value(r, "hw.gpu.utilization", hw__gpu__task="general") == pytest.approx(0.9)
        # between two measurements, the last stands, on a whole GPU and on a slice
        held = [
            value(reading(result, d), "hw.gpu.sm.activity") for d in (GPU.format(0), MIG.format(2))
        ]
        assert held == sm
    assert node.calls("nvmlGpmMetricsGet") == measured
    node.collect_at(source, 12.0)
    assert node.calls("nvmlGpmMetricsGet") == 2 * measured


def test_a_field_that_fails_after_answering_alike_for_cycles_is_still_an_error(
    nvidia_node: Callable[[str], NvidiaNode],
) -> None:
    """A field-value answer shaped like the last cycle's skips the checks of its return
    codes (readings.Reader.field_values); one that differs takes them again."""
    node = nvidia_node("""
nvidia:
  gpus:
    - uuid: GPU-00000000-0000-4000-8000-000000000000
  faults:
    - {kind: error, gpus: [0], features: [memory_temperature], start: 3.5, end: 4.5}
""")
    source = node.source()
    for at in (1.0, 2.0, 3.0):
        (before,) = node.collect_at(source, at).readings
        assert value(before, "hw.temperature", hw__sensor_location="memory") is not None
    result = node.collect_at(source, 4.0)
    (during,) = result.readings
    assert result.field_errors == 1
    assert value(during, "hw.temperature", hw__sensor_location="memory") is None
    assert value(during, "hw.energy") == value(before, "hw.energy")
    (after,) = node.collect_at(source, 5.0).readings
    assert value(after, "hw.temperature", hw__sensor_location="memory") is not None
