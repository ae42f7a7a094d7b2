"""dcgm-exporter's Grafana dashboard (id 12239) through a real Prometheus, on the dense node.

The exporter runs the bundled `dense` scenario (8 H100s: six split into 1g.10gb MIG slices
held by pods, two time-sliced) with `--metrics.schema=native,dcgm` and no other flag: the
metric groups dcgm-exporter's default counters need come with the schema. Prometheus scrapes it
the way a ServiceMonitor with `honorLabels: true` does, with the target labels Kubernetes
service discovery adds (`namespace`, `pod` of the exporter itself). The dashboard's
variables and panel queries (grafana/dcgm-exporter-dashboard.json in NVIDIA/dcgm-exporter)
must return every GPU, with values equal to the native series converted to DCGM units.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from simulator.ports import free_port
from simulator.scenario import load_scenario
from tests.peers import PrometheusServer

GPUS = {str(i) for i in range(8)}
# The exporter pod's own labels, as Kubernetes service discovery sets them on the target.
TARGET = {"namespace": "monitoring", "pod": "kube-device-exporter-x7k2p"}


def _scrape(port: int, *, honor: bool) -> dict[str, Any]:
    static = [{"targets": [f"127.0.0.1:{port}"], "labels": TARGET}]
    return {"static_configs": static, "honor_labels": honor}


@pytest.fixture(scope="module")
def exporter_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    tmp = tmp_path_factory.mktemp("dcgm")
    scenario = load_scenario("dense")
    assert scenario.path is not None
    port = free_port()
    log = (tmp / "exporter.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "simulator", str(scenario.path),
         "--web.listen-address", f"127.0.0.1:{port}", "--collect-interval", "1s",
         # The schema flag alone: dcgm-exporter's default counters come with it.
         "--metrics.schema", "native,dcgm"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        yield port
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
        print((tmp / "exporter.log").read_text()[-3000:])


@pytest.fixture(scope="module")
def prom(
    exporter_port: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrometheusServer]:
    server = PrometheusServer(
        tmp_path_factory.mktemp("prom"), [], scrape_config=_scrape(exporter_port, honor=True)
    )
    server.start()
    try:
        server.wait_for("count(DCGM_FI_DEV_GPU_TEMP) == 8", timeout=60)
        yield server
    finally:
        server.stop()


def by_gpu(result: list[dict[str, Any]]) -> dict[str, float]:
    return {r["metric"]["gpu"]: float(r["value"][1]) for r in result}


def by_uuid(result: list[dict[str, Any]], key: str = "UUID") -> dict[str, float]:
    return {r["metric"][key]: float(r["value"][1]) for r in result}


@pytest.mark.peer
def test_dashboard_variables(prom: PrometheusServer) -> None:
    # label_values(DCGM_FI_DEV_GPU_TEMP, instance) and label_values(DCGM_FI_DEV_GPU_TEMP, gpu)
    instances = prom.api("label/instance/values", **{"match[]": "DCGM_FI_DEV_GPU_TEMP"})
    assert instances == [f"127.0.0.1:{prom_target_port(prom)}"]
    assert set(prom.api("label/gpu/values", **{"match[]": "DCGM_FI_DEV_GPU_TEMP"})) == GPUS


def prom_target_port(prom: PrometheusServer) -> str:
    (target,) = prom.api("targets")["activeTargets"]
    return str(target["labels"]["instance"]).rsplit(":", 1)[1]


@pytest.mark.peer
def test_dashboard_panels_return_every_gpu(prom: PrometheusServer) -> None:
    instance = f"127.0.0.1:{prom_target_port(prom)}"
    sel = f'{{instance=~"{instance}", gpu=~"{"|".join(sorted(GPUS))}"}}'
    native = 'hw_id=~"GPU-.*"'

    temp = prom.query(f"DCGM_FI_DEV_GPU_TEMP{sel}")
    native_temp = prom.query(f'hw_temperature_celsius{{{native},hw_sensor_location="gpu"}}')
    assert by_uuid(temp) == by_uuid(native_temp, "hw_id")
    assert set(by_gpu(temp)) == GPUS
    (avg,) = prom.query(f"avg(DCGM_FI_DEV_GPU_TEMP{sel})")
    assert float(avg["value"][1]) == pytest.approx(sum(by_gpu(temp).values()) / 8)

    power = prom.query(f"DCGM_FI_DEV_POWER_USAGE{sel}")
    assert by_uuid(power) == by_uuid(prom.query(f"hw_power_watts{{{native}}}"), "hw_id")
    (total,) = prom.query(f"sum(DCGM_FI_DEV_POWER_USAGE{sel})")
    assert float(total["value"][1]) == pytest.approx(sum(by_gpu(power).values()))
    assert 8 * 100 < float(total["value"][1]) < 8 * 700  # watts, H100 SXM

    clocks = prom.query(f"DCGM_FI_DEV_SM_CLOCK{sel} * 1000000")
    native_clocks = prom.query(f'hw_gpu_clock_hertz{{{native},hw_gpu_clock_type="sm"}}')
    assert by_uuid(clocks) == pytest.approx(by_uuid(native_clocks, "hw_id"))

    util = prom.query(f"DCGM_FI_DEV_GPU_UTIL{sel}")
    native_util = prom.query(f'hw_gpu_utilization_ratio{{{native},hw_gpu_task="general"}} * 100')
    assert set(by_gpu(util)) == GPUS
    assert by_uuid(util) == pytest.approx(by_uuid(native_util, "hw_id"))
    assert all(0 <= v <= 100 for v in by_gpu(util).values())

    # Tensor Core Utilization: from GPM, on every GPU (MIG on or off) and every slice.
    tensor = prom.query(f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{sel}")
    whole = {
        r["metric"]["UUID"]: float(r["value"][1]) for r in tensor if "GPU_I_ID" not in r["metric"]
    }
    native_tensor = prom.query(f"hw_gpu_tensor_activity_ratio{{{native}}}")
    assert {r["metric"]["gpu"] for r in tensor} == GPUS
    assert len(tensor) == 8 + 42
    assert whole == pytest.approx(by_uuid(native_tensor, "hw_id"))
    assert all(0 < v <= 1 for v in whole.values())

    energy = prom.query(f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{sel} / 1000")
    native_energy = prom.query(f"hw_energy_joules_total{{{native}}}")
    assert set(by_gpu(energy)) == GPUS
    assert by_uuid(energy) == pytest.approx(by_uuid(native_energy, "hw_id"))


@pytest.mark.peer
def test_framebuffer_panel_carries_the_holders(prom: PrometheusServer) -> None:
    instance = f"127.0.0.1:{prom_target_port(prom)}"
    fb = prom.query(f'DCGM_FI_DEV_FB_USED{{instance=~"{instance}", gpu=~".*"}}')
    assert {r["metric"]["gpu"] for r in fb} == GPUS
    whole = [r for r in fb if "GPU_I_ID" not in r["metric"]]
    slices = [r for r in fb if "GPU_I_ID" in r["metric"]]
    assert len(whole) == 8
    assert len(slices) == 42  # GPUs 0-5, seven 1g.10gb slices each
    held = {r["metric"]["pod"]: r["metric"] for r in slices if "pod" in r["metric"]}
    slice0 = held["infer-0-0"]
    assert (slice0["namespace"], slice0["container"]) == ("research", "model")
    assert (slice0["gpu"], slice0["GPU_I_PROFILE"], slice0["GPU_I_ID"]) == ("0", "1g.10gb", "7")
    assert slice0["UUID"] == "GPU-3f0c9a52-81d4-4b7e-b0c6-5e1a2d7c0000"  # the parent's
    # honorLabels: true: a holder's labels win over the target's, nothing is renamed; a
    # series without a holder gets the exporter pod's own target labels (as with
    # dcgm-exporter under honorLabels: true).
    assert not any(k.startswith("exported_") for r in fb for k in r["metric"])
    assert {r["metric"]["pod"] for r in whole} == {TARGET["pod"]}
    assert {r["metric"]["namespace"] for r in whole} == {TARGET["namespace"]}
    # MiB, as dcgm-exporter: equal to the native bytes / 2^20.
    mib = prom.query('DCGM_FI_DEV_FB_USED{GPU_I_ID="7", gpu="0"}')
    native = prom.query(
        'hw_gpu_memory_usage_bytes{hw_id="MIG-7c21e0b4-5a93-5d1f-9e64-0000a1b2c3d4"} / 2^20'
    )
    assert float(mib[0]["value"][1]) == pytest.approx(float(native[0]["value"][1]))
    # Time-sliced GPUs 6 and 7 are held by four pods each: one series each, not copied per
    # pod, so no holder (only the target's labels).
    shared = prom.query('DCGM_FI_DEV_GPU_UTIL{gpu=~"6|7"}')
    assert len(shared) == 2
    assert {r["metric"]["pod"] for r in shared} == {TARGET["pod"]}


@pytest.mark.peer
def test_without_honor_labels_the_holder_is_renamed(
    exporter_port: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Why the ServiceMonitor needs honorLabels: true in the dcgm schema (as dcgm-exporter's)."""
    server = PrometheusServer(
        tmp_path_factory.mktemp("prom-plain"), [], scrape_config=_scrape(exporter_port, honor=False)
    )
    server.start()
    try:
        (fb,) = server.wait_for('DCGM_FI_DEV_FB_USED{exported_pod="infer-0-0"}', timeout=30)
    finally:
        server.stop()
    assert fb["metric"]["pod"] == TARGET["pod"]
    assert fb["metric"]["exported_namespace"] == "research"


PROF = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "hw_gpu_graphics_activity_ratio",
    "DCGM_FI_PROF_SM_ACTIVE": "hw_gpu_sm_activity_ratio",
    "DCGM_FI_PROF_SM_OCCUPANCY": "hw_gpu_sm_occupancy_ratio",
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": 'hw_gpu_pipe_activity_ratio{hw_gpu_pipe="fp64"}',
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": 'hw_gpu_pipe_activity_ratio{hw_gpu_pipe="fp32"}',
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": 'hw_gpu_pipe_activity_ratio{hw_gpu_pipe="fp16"}',
    "DCGM_FI_PROF_DRAM_ACTIVE": "hw_gpu_dram_activity_ratio",
    "DCGM_FI_PROF_PCIE_TX_BYTES": (
        'hw_gpu_pcie_throughput_bytes_per_second{network_io_direction="transmit"}'
    ),
    "DCGM_FI_PROF_PCIE_RX_BYTES": (
        'hw_gpu_pcie_throughput_bytes_per_second{network_io_direction="receive"}'
    ),
}


@pytest.mark.peer
def test_profiling_fields_on_whole_gpus_with_mig_off(prom: PrometheusServer) -> None:
    """GPUs 6 and 7 (MIG off, time-sliced) have every DCGM_FI_PROF_* field, ratios 0-1 and
    bytes per second, equal to the native GPM series at the same scrape."""
    for dcgm, native in PROF.items():
        got = prom.query(f'{dcgm}{{gpu=~"6|7", GPU_I_ID=""}}')
        assert {r["metric"]["gpu"] for r in got} == {"6", "7"}, dcgm
        sel = 'hw_id=~"GPU-.*000[67]"'
        native_q = f"{native[:-1]},{sel}}}" if native.endswith("}") else f"{native}{{{sel}}}"
        assert by_uuid(got) == pytest.approx(by_uuid(prom.query(native_q), "hw_id")), dcgm
        if dcgm.endswith("_ACTIVE") or dcgm.endswith("_OCCUPANCY"):
            assert all(0 < float(r["value"][1]) <= 1 for r in got), dcgm
    pcie = prom.query('DCGM_FI_PROF_PCIE_TX_BYTES{gpu="6"}')
    assert float(pcie[0]["value"][1]) > 1e6  # bytes/s: 1 MB/s idle, GB/s when busy


@pytest.mark.peer
def test_xid_errors_the_last_xid_as_dcgm_exporter(prom: PrometheusServer) -> None:
    """dcgm-exporter's DCGM_FI_DEV_XID_ERRORS: the last XID's code, 0 before any. The dense
    node sends XID 13 to GPU 6 at 20 s; GPU 1 never has one. Dashboard 12239 has no XID
    panel; alerts query `DCGM_FI_DEV_XID_ERRORS > 0` (tests/test_dcgm_xid.py)."""
    prom.wait_for('DCGM_FI_DEV_XID_ERRORS{gpu="6"} == 13', timeout=90)
    gpus = prom.query('DCGM_FI_DEV_XID_ERRORS{GPU_I_ID=""}')
    assert {r["metric"]["gpu"] for r in gpus} == GPUS
    assert by_gpu(gpus)["1"] == 0
    assert prom.query('DCGM_FI_DEV_XID_ERRORS{gpu="6", GPU_I_ID=""} > 0')  # the alert's query
    native = prom.query('hw_gpu_xid_last{hw_id="GPU-3f0c9a52-81d4-4b7e-b0c6-5e1a2d7c0006"}')
    assert float(native[0]["value"][1]) == 13
    # the better native query: which XIDs, how many (a counter per code)
    counted = prom.query('hw_gpu_xid_errors_total{hw_id=~".*0006"}')
    assert {r["metric"]["hw_gpu_xid"]: float(r["value"][1]) for r in counted} == {"13": 1.0}
