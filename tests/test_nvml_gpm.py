"""GPM profiling metrics on whole GPUs (MIG off) and MIG slices, through the simulated driver.

Each expected value is read off the scenario (the signals' integrals between the two GPM
samples and `GPM_SHARES`), not off the exporter: the stand-in keeps cumulative busy seconds
and bytes per GPU and per GPU instance, and nvmlGpmMetricsGet returns their rate between
two samples (nvml.h: percent for the activities, MiB/sec for PCIe and NVLink).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import yaml

from exporter.model import DeviceReading, JoinedDevice, Snapshot
from exporter.sinks.dcgm import dcgm_points
from exporter.sources.nvml.gpm import interval
from simulator.nvml_spec import GPM_SHARES, GpuSpec, MigSpec
from simulator.scenario import load_scenario
from tests.nvml_support import NvidiaNode, fakenvml, nvidia_node

__all__ = ["fakenvml", "nvidia_node"]

T0, T1 = 1.0, 31.0
"""The priming sample and the measuring one, 30 s apart (the default GPM interval: 10 s)."""

RATIOS = {
    "hw.gpu.sm.activity": GPM_SHARES["gpm_sm_s"],
    "hw.gpu.sm.occupancy": GPM_SHARES["gpm_occupancy_s"],
    "hw.gpu.tensor.activity": GPM_SHARES["gpm_tensor_s"],
}
PIPES = {p: GPM_SHARES[f"gpm_{p}_s"] for p in ("fp64", "fp32", "fp16")}


def _mean(integral: Callable[[float], float]) -> float:
    return (integral(T1) - integral(T0)) / (T1 - T0)


def expected(device: GpuSpec | MigSpec) -> dict[tuple[str, str], float]:
    """(metric, attribute value or "") -> the value the stand-in's state implies."""
    if isinstance(device, GpuSpec):
        busy = _mean(device.busy_seconds)
    else:
        busy = _mean(device.utilization.integral)
    # DRAM: the device's memory_utilization where the scenario gives one (a slice, or a
    # GPU with MIG off), else its GPM_SHARES share of busy time (a MIG-enabled GPU too)
    memory = device.memory_utilization
    own_memory = memory is not None and not (isinstance(device, GpuSpec) and device.mig)
    dram = _mean(memory.integral) if memory is not None and own_memory else None
    out = {("hw.gpu.graphics.activity", ""): busy}
    out |= {(metric, ""): share * busy for metric, share in RATIOS.items()}
    out |= {("hw.gpu.pipe.activity", p): share * busy for p, share in PIPES.items()}
    out[("hw.gpu.dram.activity", "")] = GPM_SHARES["gpm_dram_s"] * busy if dram is None else dram
    if isinstance(device, GpuSpec):  # PCIe and NVLink: the GPU's, not an instance's
        out[("hw.gpu.pcie.throughput", "transmit")] = 1e6 + device.pcie_peak * busy
        out[("hw.gpu.pcie.throughput", "receive")] = 2e6 + 1.3 * device.pcie_peak * busy
        if device.nvlink_links:
            out[("hw.gpu.nvlink.throughput", "transmit")] = device.nvlink_peak * busy
            out[("hw.gpu.nvlink.throughput", "receive")] = 0.9 * device.nvlink_peak * busy
    return out


GPM_METRICS = {
    "hw.gpu.graphics.activity",
    "hw.gpu.sm.activity",
    "hw.gpu.sm.occupancy",
    "hw.gpu.tensor.activity",
    "hw.gpu.pipe.activity",
    "hw.gpu.dram.activity",
    "hw.gpu.pcie.throughput",
    "hw.gpu.nvlink.throughput",
}


def found(r: DeviceReading) -> dict[tuple[str, str], float]:
    out = {}
    for s in r.samples:
        if s.metric in GPM_METRICS:
            key = (s.metric, s.attributes[0][1] if s.attributes else "")
            assert key not in out, key
            out[key] = s.value
    return out


def _collect(node: NvidiaNode) -> dict[str, DeviceReading]:
    source = node.source()
    first = node.collect_at(source, T0)
    assert not any(found(r) for r in first.readings)  # one sample: no rate yet
    result = node.collect_at(source, T1)
    assert result.field_errors == 0
    return {r.device.id: r for r in result.readings}


@pytest.mark.parametrize("scenario", ["demo", "dense"])
def test_whole_gpus_and_slices_have_the_stand_ins_ratios(
    scenario: str, nvidia_node: Callable[[str], NvidiaNode]
) -> None:
    node = nvidia_node(scenario)
    readings = _collect(node)
    spec = node.part.spec
    mig_off = [g for g in spec.gpus if not g.mig]
    assert mig_off, "the scenario has whole GPUs with MIG off"
    for gpu in spec.gpus:
        want = expected(gpu)
        assert found(readings[gpu.uuid]) == pytest.approx(want, rel=1e-6, abs=1e-6), gpu.uuid
        for mig in gpu.mig:
            got = found(readings[mig.uuid])
            assert got == pytest.approx(expected(mig), rel=1e-6, abs=1e-6), mig.uuid
            # under MIG, GPM's GRAPHICS_UTIL is the slice's utilization too
            general = [
                s.value
                for s in readings[mig.uuid].samples
                if s.metric == "hw.gpu.utilization"
                and s.attributes == (("hw.gpu.task", "general"),)
            ]
            assert general == [pytest.approx(got[("hw.gpu.graphics.activity", "")])]
    # a whole GPU with MIG off keeps NVML's own utilization beside GPM's activity
    whole = readings[mig_off[0].uuid]
    nvml_own = [s for s in whole.samples if s.metric == "hw.gpu.utilization"]
    assert [s.value for s in nvml_own if s.attributes == (("hw.gpu.task", "general"),)] == [
        round(100 * mig_off[0].utilization.value(T1)) / 100
    ]


def test_demo_whole_gpu_values_a_user_checks(nvidia_node: Callable[[str], NvidiaNode]) -> None:
    """GPU 3 of the demo is a constant 25 % busy: every activity is share x 0.25."""
    node = nvidia_node("demo")
    r = found(_collect(node)["GPU-6a3f1c2e-1b7d-4c1e-9a55-000000000003"])
    assert r[("hw.gpu.graphics.activity", "")] == pytest.approx(0.25)
    assert r[("hw.gpu.sm.activity", "")] == pytest.approx(0.85 * 0.25)
    assert r[("hw.gpu.sm.occupancy", "")] == pytest.approx(0.4 * 0.25)
    assert r[("hw.gpu.tensor.activity", "")] == pytest.approx(0.6 * 0.25)
    assert r[("hw.gpu.pipe.activity", "fp64")] == pytest.approx(0.05 * 0.25)
    assert r[("hw.gpu.dram.activity", "")] == pytest.approx(0.5 * 0.25)
    # 1 MB/s idle + 12 GB/s at full load (the H100 default pcie_peak), in bytes per second
    assert r[("hw.gpu.pcie.throughput", "transmit")] == pytest.approx(1e6 + 12e9 * 0.25)
    assert r[("hw.gpu.nvlink.throughput", "transmit")] == pytest.approx(120e9 * 0.25)


def test_dcgm_prof_fields_in_dcgm_units(nvidia_node: Callable[[str], NvidiaNode]) -> None:
    """dcgm-exporter's etc/dcp-metrics-included.csv: DCGM_FI_PROF_* activities are ratios
    (0-1), PCIe (and NVLink) bytes are rates in bytes per second: equal to the native."""
    node = nvidia_node("demo")
    readings = _collect(node)
    gpu3 = "GPU-6a3f1c2e-1b7d-4c1e-9a55-000000000003"
    snapshot = Snapshot(0.0, "n", tuple(JoinedDevice(r) for r in readings.values()))
    points = {
        (p.spec.name, dict(p.attributes).get("GPU_I_ID", "")): p.value
        for p in dcgm_points(snapshot)
        if dict(p.attributes)["UUID"] == gpu3 or "GPU_I_ID" in dict(p.attributes)
    }
    busy = 0.25
    want = {
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": busy,
        "DCGM_FI_PROF_SM_ACTIVE": 0.85 * busy,
        "DCGM_FI_PROF_SM_OCCUPANCY": 0.4 * busy,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.6 * busy,
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE": 0.05 * busy,
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE": 0.3 * busy,
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE": 0.2 * busy,
        "DCGM_FI_PROF_DRAM_ACTIVE": 0.5 * busy,
        "DCGM_FI_PROF_PCIE_TX_BYTES": 1e6 + 12e9 * busy,
        "DCGM_FI_PROF_PCIE_RX_BYTES": 2e6 + 1.3 * 12e9 * busy,
        "DCGM_FI_PROF_NVLINK_TX_BYTES": 120e9 * busy,
        "DCGM_FI_PROF_NVLINK_RX_BYTES": 0.9 * 120e9 * busy,
    }
    assert {k: points[(k, "")] for k in want} == pytest.approx(want)
    # the 1g.10gb slice with GPU instance 10 is a constant 90 % busy until 40 s
    assert points[("DCGM_FI_PROF_SM_ACTIVE", "10")] == pytest.approx(0.85 * 0.9)
    assert ("DCGM_FI_PROF_PCIE_TX_BYTES", "10") not in points  # PCIe is the GPU's


def test_no_gpm_is_absent_said_once_not_a_failure(
    nvidia_node: Callable[[str], NvidiaNode], caplog: pytest.LogCaptureFixture
) -> None:
    """A pre-Hopper GPU (nvmlGpmQueryDeviceSupport: not supported) has no profiling series,
    its other metrics stay, and the log says so once, not every cycle or rediscovery."""
    loaded = load_scenario("demo")
    assert loaded.path is not None
    doc = yaml.safe_load(loaded.path.read_text())
    doc["nvidia"]["gpu_defaults"]["gpm"] = False
    node = nvidia_node(yaml.safe_dump(doc))
    caplog.set_level(logging.INFO)
    source = node.source(**{"rediscover-interval": "5s"})
    for t in (T0, 11.0, T1):
        result = node.collect_at(source, t)
    assert result.field_errors == 0
    assert not any(found(r) for r in result.readings)
    assert all(any(s.metric == "hw.power" for s in r.samples) for r in result.readings[:1])
    said = [m for m in caplog.messages if "no profiling metrics" in m]
    assert len(said) == 1, said  # one line for the four GPUs, not again on rediscoveries
    assert said[0].startswith("GPUs without GPM (GPM needs Hopper or later): 0 (NVIDIA H100")
    assert all(f"{i} (NVIDIA" in said[0] for i in range(4))


def test_a_driver_without_gpm_is_absent_too(
    nvidia_node: Callable[[str], NvidiaNode], caplog: pytest.LogCaptureFixture
) -> None:
    loaded = load_scenario("demo")
    assert loaded.path is not None
    doc = yaml.safe_load(loaded.path.read_text())
    doc["nvidia"]["faults"] = [{"kind": "missing", "function": "nvmlGpmQueryDeviceSupport"}]
    node = nvidia_node(yaml.safe_dump(doc))
    caplog.set_level(logging.INFO)
    result = _collect(node)
    assert not any(found(r) for r in result.values())
    said = [m for m in caplog.messages if "no profiling metrics" in m]
    assert len(said) == 1 and "(no GPM in this driver)" in said[0]


def test_gpm_interval_respects_nvml_h_100ms() -> None:
    assert interval("10s") == 10.0
    assert interval("250ms") == 0.25
    with pytest.raises(ValueError, match="100ms apart"):
        interval("100ms")


def test_a_request_the_driver_wrote_over_is_written_again_before_the_next_read(
    nvidia_node: Callable[[str], NvidiaNode],
) -> None:
    """Each device keeps one nvmlGpmMetricsGet_t; nvml.h does not say the driver leaves its
    inputs alone, so they are written again before every call: a request whose version,
    count and metric ids were overwritten still reads what a fresh one reads."""
    node = nvidia_node("dense")
    kept, fresh = node.source(), node.source()
    node.collect_at(kept, T0)
    node.collect_at(kept, T1)
    node.collect_at(fresh, T1)
    gpms = [g.gpm for g in kept._gpus or []] + [m.gpm for g in kept._gpus or [] for m in g.migs]
    scribbled = [gpm for gpm in gpms if gpm is not None and gpm.metrics_get is not None]
    assert len(scribbled) == len(gpms) > 8  # every GPU and slice of dense has read GPM
    for gpm in scribbled:
        raw = memoryview(gpm.metrics_get).cast("B")
        raw[: len(raw)] = b"\xff" * len(raw)
    later = T1 + 30.0
    want = {r.device.id: found(r) for r in node.collect_at(fresh, later).readings}
    got = {r.device.id: found(r) for r in node.collect_at(kept, later).readings}
    assert got == want
    assert sum(len(v) for v in got.values()) > 100  # rates, not an empty answer on both sides
