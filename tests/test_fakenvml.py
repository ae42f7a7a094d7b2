"""The simulated libnvidia-ml.so.1 answers the unmodified nvidia-ml-py binding like a driver.

These tests call pynvml directly (the exporter itself only does in sources/nvml.py) to pin
the library's behaviour: struct layouts, versioned entry points, return codes, events.
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pynvml
import pytest

from simulator import nvml as simnvml
from tests.nvml_support import NvidiaNode, fakenvml, nvidia_node

__all__ = ["fakenvml", "nvidia_node"]

TWO_GPUS = """
nvidia:
  driver_version: "580.95.05"
  pid_namespace: host       # a hostPID pod: the process lists show the host's processes
  gpus:
    - uuid: GPU-00000000-0000-4000-8000-000000000000
      pci_bus_id: "0000:9a:00.0"
      minor: 3
      utilization: 0.5
      unsupported: [encoder_utilization]
      processes: [{pid: 77, memory: 1GiB, utilization: 0.25}]
    - uuid: GPU-00000000-0000-4000-8000-000000000001
      mig:
        - {uuid: MIG-00000000-0000-5000-8000-000000000101, profile: 3g.40gb, gi: 2,
           processes: [{pid: 88, memory: 2GiB}]}
        - {uuid: MIG-00000000-0000-5000-8000-000000000102, profile: 1g.10gb, gi: 9}
  xid:
    - {at: 10, device: 0, xid: 79}
    - {at: 11, device: MIG-00000000-0000-5000-8000-000000000102, xid: 43}
  faults:
    - {kind: slow, function: nvmlDeviceGetPowerUsage, ms: 60, start: 20, end: 30}
"""


@pytest.fixture
def nvml(nvidia_node: Callable[[str], NvidiaNode]) -> Iterator[NvidiaNode]:
    node = nvidia_node(TWO_GPUS)
    pynvml.nvmlInit()
    yield node
    pynvml.nvmlShutdown()


def test_devices_identity_and_memory_come_through_the_binding(nvml: NvidiaNode) -> None:
    assert pynvml.nvmlDeviceGetCount() == 2
    assert pynvml.nvmlSystemGetDriverVersion() == "580.95.05"
    gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetUUID(gpu) == "GPU-00000000-0000-4000-8000-000000000000"
    assert pynvml.nvmlDeviceGetName(gpu) == "NVIDIA H100 80GB HBM3"
    assert pynvml.nvmlDeviceGetMinorNumber(gpu) == 3
    pci = pynvml.nvmlDeviceGetPciInfo(gpu)
    assert (pci.busId, pci.busIdLegacy, pci.bus) == ("00000000:9A:00.0", "0000:9A:00.0", 0x9A)
    mem = pynvml.nvmlDeviceGetMemoryInfo(gpu, version=pynvml.nvmlMemory_v2)
    assert mem.total == 81559 * 2**20
    assert mem.used == 2**30  # the one process
    assert mem.total == mem.used + mem.free + mem.reserved
    legacy = pynvml.nvmlDeviceGetMemoryInfo(gpu)
    assert legacy.used == mem.used + mem.reserved  # v1 counts reserved as used
    assert pynvml.nvmlDeviceGetUtilizationRates(gpu).gpu == 50
    assert pynvml.nvmlDeviceGetHandleByPciBusId("0000:9a:00.0") is not None


def test_not_supported_is_nvml_not_supported(nvml: NvidiaNode) -> None:
    gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetEncoderUtilization(gpu)
    # MIG-enabled GPUs have no utilization counters, as on real hardware
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByIndex(1))


def test_field_values_report_per_field_status(nvml: NvidiaNode) -> None:
    gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
    energy, unknown = pynvml.nvmlDeviceGetFieldValues(
        gpu, [pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, pynvml.NVML_FI_DEV_RETIRED_SBE]
    )
    assert energy.nvmlReturn == pynvml.NVML_SUCCESS
    assert energy.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    assert unknown.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    nvml.at(10.0)
    (later,) = pynvml.nvmlDeviceGetFieldValues(gpu, [pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION])
    # 70 W idle + (665 - 70) W * 0.5 busy for 10 s, in mJ
    assert later.value.ullVal == pytest.approx(10 * (70 + 595 * 0.5) * 1000, abs=1)


def test_mig_devices_and_lookups(nvml: NvidiaNode) -> None:
    gpu = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetMigMode(gpu) == [1, 1]
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu) == 7
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
    assert pynvml.nvmlDeviceGetName(mig) == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    assert pynvml.nvmlDeviceGetGpuInstanceId(mig) == 2
    assert pynvml.nvmlDeviceGetComputeInstanceId(mig) == 0
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 5)
    by_uuid = pynvml.nvmlDeviceGetHandleByUUID("MIG-00000000-0000-5000-8000-000000000102")
    assert pynvml.nvmlDeviceIsMigDeviceHandle(by_uuid).value == 1
    parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(by_uuid)
    assert pynvml.nvmlDeviceGetUUID(parent) == "GPU-00000000-0000-4000-8000-000000000001"
    (proc,) = pynvml.nvmlDeviceGetComputeRunningProcesses(mig)
    assert (proc.pid, proc.usedGpuMemory, proc.gpuInstanceId) == (88, 2 * 2**30, 2)
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(by_uuid) == []


def test_process_utilization_samples_and_not_found(nvml: NvidiaNode) -> None:
    gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
    nvml.at(12.0)
    # as a real driver answers (measured): one sample per busy process, the newest
    (sample,) = pynvml.nvmlDeviceGetProcessUtilization(gpu, 0)
    assert (sample.pid, sample.smUtil) == (77, 25)
    with pytest.raises(pynvml.NVMLError_NotFound):  # nothing newer than what was seen
        pynvml.nvmlDeviceGetProcessUtilization(gpu, sample.timeStamp)
    nvml.at(12.6)  # a driver sample period later
    (later,) = pynvml.nvmlDeviceGetProcessUtilization(gpu, sample.timeStamp)
    assert later.timeStamp == sample.timeStamp + 500_000


def test_xid_events_are_delivered_once_each(nvml: NvidiaNode) -> None:
    event_set = pynvml.nvmlEventSetCreate()
    for index in range(2):
        pynvml.nvmlDeviceRegisterEvents(
            pynvml.nvmlDeviceGetHandleByIndex(index),
            pynvml.nvmlEventTypeXidCriticalError,
            event_set,
        )
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 0)
    nvml.at(12.0)
    first = pynvml.nvmlEventSetWait_v2(event_set, 1000)
    second = pynvml.nvmlEventSetWait_v2(event_set, 1000)
    assert (first.eventData, first.gpuInstanceId) == (79, 0xFFFFFFFF)
    assert (second.eventData, second.gpuInstanceId, second.computeInstanceId) == (43, 9, 0)
    assert pynvml.nvmlDeviceGetUUID(second.device) == "GPU-00000000-0000-4000-8000-000000000001"
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 20)
    pynvml.nvmlEventSetFree(event_set)


def test_a_blocked_wait_wakes_when_an_event_is_written(nvml: NvidiaNode) -> None:
    """The wait blocks (as a driver does) and is woken by the new state, not by a timer."""
    event_set = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(
        pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlEventTypeXidCriticalError, event_set
    )
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(pynvml.nvmlEventSetWait_v2, event_set, 30_000)
        with pytest.raises(concurrent.futures.TimeoutError):
            waiting.result(timeout=0.05)  # nothing to deliver yet: still blocked
        nvml.at(12.0)
        event = waiting.result(timeout=10)  # woken long before its 30 s timeout
    assert event.eventData == 79
    pynvml.nvmlEventSetFree(event_set)


def test_events_from_before_the_set_existed_are_not_delivered(nvml: NvidiaNode) -> None:
    nvml.at(12.0)
    event_set = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(
        pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlEventTypeXidCriticalError, event_set
    )
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 20)
    pynvml.nvmlEventSetFree(event_set)


def test_gpm_metrics_are_rates_between_two_samples(nvml: NvidiaNode) -> None:
    gpu = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlGpmQueryDeviceSupport(gpu).isSupportedDevice == 1
    first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    pynvml.nvmlGpmMigSampleGet(gpu, 2, first)
    nvml.at(10.0)
    pynvml.nvmlGpmMigSampleGet(gpu, 2, second)
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = 1
    request.sample1, request.sample2 = first, second
    request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL
    pynvml.nvmlGpmMetricsGet(request)
    assert request.metrics[0].nvmlReturn == pynvml.NVML_SUCCESS
    assert request.metrics[0].value == 0.0  # the 3g.40gb slice is idle in this scenario
    pynvml.nvmlGpmSampleFree(first)
    pynvml.nvmlGpmSampleFree(second)


def _gpm_request(first: object, second: object, *metric_ids: int) -> object:
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(metric_ids)
    request.sample1, request.sample2 = first, second
    for i, metric_id in enumerate(metric_ids):
        request.metrics[i].metricId = metric_id
    return request


def test_gpm_on_a_whole_gpu_in_nvml_h_units(nvml: NvidiaNode) -> None:
    """nvml.h's nvmlGpmMetricId_t: activities in percent (0.0 - 100.0), PCIe and NVLink in
    MiB/sec; GPU 0 is a constant 50 % busy, MIG off."""
    gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlGpmQueryDeviceSupport(gpu).isSupportedDevice == 1
    first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    nvml.at(5.0)
    pynvml.nvmlGpmSampleGet(gpu, first)
    nvml.at(15.0)
    pynvml.nvmlGpmSampleGet(gpu, second)
    ids = {
        pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 50.0,
        pynvml.NVML_GPM_METRIC_SM_UTIL: 0.85 * 50,
        pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 0.4 * 50,
        pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 0.6 * 50,
        pynvml.NVML_GPM_METRIC_FP64_UTIL: 0.05 * 50,
        pynvml.NVML_GPM_METRIC_FP32_UTIL: 0.3 * 50,
        pynvml.NVML_GPM_METRIC_FP16_UTIL: 0.2 * 50,
        pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 0.5 * 50,
        pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: (1e6 + 12e9 * 0.5) / 2**20,
        pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: (2e6 + 1.3 * 12e9 * 0.5) / 2**20,
        pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: 120e9 * 0.5 / 2**20,
        pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: 0.9 * 120e9 * 0.5 / 2**20,
        pynvml.NVML_GPM_METRIC_INTEGER_UTIL: None,  # not simulated: NOT_SUPPORTED
    }
    request: Any = _gpm_request(first, second, *ids)
    pynvml.nvmlGpmMetricsGet(request)
    for i, want in enumerate(ids.values()):
        got = request.metrics[i]
        if want is None:
            assert got.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
            continue
        assert got.nvmlReturn == pynvml.NVML_SUCCESS, i
        assert got.value == pytest.approx(want, rel=1e-6), i
    assert request.metrics[8].metricInfo.unit == b"MiB/sec"
    assert request.metrics[0].metricInfo.unit == b"%"
    # the version nvml.h names, and samples of one device
    request.version = 2
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlGpmMetricsGet(request)
    pynvml.nvmlGpmSampleFree(first)
    pynvml.nvmlGpmSampleFree(second)


def test_gpm_per_instance_through_a_mig_handle_or_the_gpu(nvml: NvidiaNode) -> None:
    """nvml.h: nvmlGpmSampleGet "supports the device handle and MIG device handle"; a MIG
    handle samples its GPU instance, as nvmlGpmMigSampleGet(gpu, gi) does. An instance has
    no PCIe or NVLink counters of its own (NOT_SUPPORTED), samples of two devices are
    INVALID_ARGUMENT."""
    gpu = pynvml.nvmlDeviceGetHandleByIndex(1)
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 1)  # gi 9
    a, b, c = (pynvml.nvmlGpmSampleAlloc() for _ in range(3))
    pynvml.nvmlGpmSampleGet(mig, a)
    nvml.at(10.0)
    pynvml.nvmlGpmMigSampleGet(gpu, 9, b)
    pynvml.nvmlGpmMigSampleGet(gpu, 2, c)
    request: Any = _gpm_request(
        a, b, pynvml.NVML_GPM_METRIC_SM_UTIL, pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC
    )
    pynvml.nvmlGpmMetricsGet(request)
    assert (request.metrics[0].nvmlReturn, request.metrics[0].value) == (pynvml.NVML_SUCCESS, 0)
    assert request.metrics[1].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpmMetricsGet(_gpm_request(a, c, pynvml.NVML_GPM_METRIC_SM_UTIL))
    for sample in (a, b, c):
        pynvml.nvmlGpmSampleFree(sample)


def test_slow_calls_take_their_injected_time(nvml: NvidiaNode) -> None:
    gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
    nvml.at(25.0)
    started = time.perf_counter()
    pynvml.nvmlDeviceGetPowerUsage(gpu)
    assert time.perf_counter() - started >= 0.06
    nvml.at(30.0)
    started = time.perf_counter()
    pynvml.nvmlDeviceGetPowerUsage(gpu)
    assert time.perf_counter() - started < 0.05


def test_no_state_file_means_no_driver(fakenvml: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(simnvml.STATE_ENV, raising=False)
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()


@pytest.mark.peer
def test_a_subprocess_finds_the_library_through_ld_library_path(
    nvidia_node: Callable[[str], NvidiaNode],
) -> None:
    """No preloading here: pynvml's own loader finds the library on LD_LIBRARY_PATH."""
    node = nvidia_node(TWO_GPUS)
    script = (
        "import pynvml; pynvml.nvmlInit(); "
        "h = pynvml.nvmlDeviceGetHandleByIndex(1); "
        "print(pynvml.nvmlDeviceGetCount(), pynvml.nvmlDeviceGetUUID(h), pynvml.nvmlLib._name)"
    )
    env = {**os.environ, **node.part.env()}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    count, uuid, loaded = out.stdout.split()
    assert (count, uuid) == ("2", "GPU-00000000-0000-4000-8000-000000000001")
    assert loaded == "libnvidia-ml.so.1"
    assert node.part.env()["LD_LIBRARY_PATH"].split(":")[0] == str(simnvml.library_dir())
