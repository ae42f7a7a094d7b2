"""What a real NVIDIA driver does, for the behaviour table and the stand-in library.

Run on a machine with a GPU: `python -m bench.nvml_probe [--load SECONDS]`. Prints one
JSON document: the driver's answers to the calls the NVML source relies on (which the
stand-in must imitate, see exporter/sources/nvml/behaviour.py), the cost of each call
(median of repeated calls), and, with `--load`, what per-process utilization samples look
like while a process keeps the GPU busy (a CUDA load started with PyTorch when importable).
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import json
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pynvml

LOAD = """
import time, torch
a = torch.randn(8192, 8192, device="cuda")
end = time.time() + {seconds}
while time.time() < end:
    (a @ a).sum().item()
"""


def timed(fn: Callable[[], Any], repeat: int = 50) -> tuple[float, Any]:
    """Median seconds per call, and the last answer (or the error's name)."""
    times, answer = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        try:
            answer = fn()
        except pynvml.NVMLError as exc:
            answer = f"NVMLError({exc.value}: {exc})"
        times.append(time.perf_counter() - started)
    return statistics.median(times), answer


def describe(value: Any) -> Any:
    if isinstance(value, (str, int, float, type(None))):
        return value
    if isinstance(value, (list, tuple)):
        return [describe(v) for v in value[:8]]
    fields = getattr(value, "_fields_", None)
    if fields:
        return {name: describe(getattr(value, name)) for name, *_ in fields}
    return repr(value)


def probe(load_seconds: float) -> dict[str, Any]:
    pynvml.nvmlInit()
    out: dict[str, Any] = {"driver": pynvml.nvmlSystemGetDriverVersion()}
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    calls: dict[str, Callable[[], Any]] = {
        "nvmlDeviceGetCount": pynvml.nvmlDeviceGetCount,
        "nvmlDeviceGetHandleByIndex": lambda: pynvml.nvmlDeviceGetHandleByIndex(0),
        "nvmlDeviceGetUUID": lambda: pynvml.nvmlDeviceGetUUID(handle),
        "nvmlDeviceGetMigMode": lambda: pynvml.nvmlDeviceGetMigMode(handle),
        "nvmlDeviceGetUtilizationRates": lambda: pynvml.nvmlDeviceGetUtilizationRates(handle),
        "nvmlDeviceGetMemoryInfo_v2": lambda: pynvml.nvmlDeviceGetMemoryInfo(
            handle, pynvml.nvmlMemory_v2
        ),
        "nvmlDeviceGetPowerUsage": lambda: pynvml.nvmlDeviceGetPowerUsage(handle),
        "nvmlDeviceGetTemperatureV": lambda: pynvml.nvmlDeviceGetTemperatureV(
            handle, pynvml.NVML_TEMPERATURE_GPU
        ),
        "nvmlDeviceGetClockInfo": lambda: pynvml.nvmlDeviceGetClockInfo(
            handle, pynvml.NVML_CLOCK_SM
        ),
        "nvmlDeviceGetCurrentClocksEventReasons": lambda: (
            pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
        ),
        "nvmlDeviceGetEncoderUtilization": lambda: pynvml.nvmlDeviceGetEncoderUtilization(handle),
        "nvmlDeviceGetFieldValues(17 fields)": lambda: [
            (v.fieldId, v.nvmlReturn)
            for v in pynvml.nvmlDeviceGetFieldValues(handle, _field_request())
        ],
        "nvmlDeviceGetComputeRunningProcesses": lambda: [
            (p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        ],
        "nvmlDeviceGetProcessUtilization(0)": lambda: len(
            pynvml.nvmlDeviceGetProcessUtilization(handle, 0)
        ),
        "nvmlGpmQueryDeviceSupport": lambda: bool(
            pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice
        ),
        "nvmlDeviceGetMigDeviceHandleByIndex(0)": lambda: (
            pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)
        ),
    }
    out["calls"] = {}
    for name, fn in calls.items():
        seconds, answer = timed(fn)
        out["calls"][name] = {"us": round(seconds * 1e6, 1), "answer": describe(answer)}
    out["field_us"] = {}
    for field_id, scope in _field_request():

        def field_return(f: int = field_id, sc: int = scope) -> Any:
            return pynvml.nvmlDeviceGetFieldValues(handle, [(f, sc)])[0].nvmlReturn

        seconds, answer = timed(field_return, repeat=20)
        out["field_us"][str(field_id)] = {"us": round(seconds * 1e6, 1), "return": answer}
    out["handle_index_out_of_range"] = timed(
        lambda: pynvml.nvmlDeviceGetHandleByIndex(64), repeat=1
    )[1]
    out["gpm"] = _gpm(handle)
    out["xid"] = _xid(handle)
    if load_seconds > 0:
        out["load"] = _under_load(handle, load_seconds)
    pynvml.nvmlShutdown()
    return out


def _gpm(handle: Any, spacing: float = 1.0) -> dict[str, Any]:
    """GPM on GPU 0 as the NVML source reads it (MIG off: nvmlGpmSampleGet on the GPU): the
    cost of a sample, of nvmlGpmMetricsGet for the source's 12 metrics and for the first 5,
    and each metric's value and return code between two samples `spacing` seconds apart."""
    from exporter.sources.nvml.gpm import METRICS, Gpm, request

    try:
        if not pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
            return {"supported": False}
    except pynvml.NVMLError as exc:
        return {"supported": f"NVMLError({exc.value}: {exc})"}
    pair = Gpm(pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc())
    try:
        sample_s, _ = timed(lambda: pynvml.nvmlGpmSampleGet(handle, pair.previous), repeat=20)
        time.sleep(spacing)
        pynvml.nvmlGpmSampleGet(handle, pair.current)
        full = request(pair)
        all_s, _ = timed(lambda: pynvml.nvmlGpmMetricsGet(full), repeat=20)
        five = request(pair)
        five.numMetrics = 5
        five_s, _ = timed(lambda: pynvml.nvmlGpmMetricsGet(five), repeat=20)
        values = {
            " ".join([spec.metric, *(v for _, v in spec.attributes)]): {
                "return": int(full.metrics[i].nvmlReturn),
                "value": float(full.metrics[i].value),
            }
            for i, spec in enumerate(METRICS)
        }
    finally:
        pynvml.nvmlGpmSampleFree(pair.previous)
        pynvml.nvmlGpmSampleFree(pair.current)
    return {
        "supported": True,
        "nvmlGpmSampleGet_us": round(sample_s * 1e6, 1),
        f"nvmlGpmMetricsGet_{len(METRICS)}_metrics_us": round(all_s * 1e6, 1),
        "nvmlGpmMetricsGet_5_metrics_us": round(five_s * 1e6, 1),
        "values_in_nvml_units": values,
    }


def _xid(handle: Any, repeat: int = 200) -> dict[str, Any]:
    """The XID drain as the NVML source runs it every cycle (exporter/sources/nvml/xid.py):
    an event set with GPU 0's XID critical errors registered, then nvmlEventSetWait_v2 with
    a zero timeout, through the binding (which raises on the timeout) and as the C function
    the source calls (its return code compared). Each answer's code is kept: on a quiet GPU
    every wait should time out (10) at once, never block."""
    try:
        supported = int(pynvml.nvmlDeviceGetSupportedEventTypes(handle))
    except pynvml.NVMLError as exc:
        return {"supported_event_types": f"NVMLError({exc.value}: {exc})"}
    out: dict[str, Any] = {
        "supported_event_types": hex(supported),
        "xid_supported": bool(supported & pynvml.nvmlEventTypeXidCriticalError),
    }
    create_s, event_set = timed(pynvml.nvmlEventSetCreate, repeat=1)
    out["nvmlEventSetCreate_us"] = round(create_s * 1e6, 1)
    if isinstance(event_set, str):
        out["nvmlEventSetCreate"] = event_set
        return out
    try:
        register_s, answer = timed(
            lambda: pynvml.nvmlDeviceRegisterEvents(
                handle, pynvml.nvmlEventTypeXidCriticalError, event_set
            ),
            repeat=1,
        )
        out["nvmlDeviceRegisterEvents_us"] = round(register_s * 1e6, 1)
        if answer is not None:
            out["nvmlDeviceRegisterEvents"] = answer
            return out
        binding_s, answer = timed(lambda: pynvml.nvmlEventSetWait_v2(event_set, 0), repeat)
        out["binding_wait_0ms_us"] = round(binding_s * 1e6, 1)
        out["binding_wait_0ms_answer"] = describe(answer)
        wait = pynvml._nvmlGetFunctionPointer("nvmlEventSetWait_v2")
        data = pynvml.c_nvmlEventData_t()
        data_ref, no_wait = ctypes.byref(data), ctypes.c_uint(0)
        codes: list[int] = []
        c_s, _ = timed(lambda: codes.append(wait(event_set, data_ref, no_wait)), repeat)
        out["c_wait_0ms_us"] = round(c_s * 1e6, 1)
        out["c_wait_0ms_returns"] = dict(sorted(Counter(codes).items()))
        started = time.perf_counter()
        code = wait(event_set, data_ref, ctypes.c_uint(100))
        out["c_wait_100ms"] = {
            "return": int(code),
            "ms": round((time.perf_counter() - started) * 1e3, 1),
        }
    finally:
        pynvml.nvmlEventSetFree(event_set)
    return out


def _field_request() -> list[tuple[int, int]]:
    from exporter.sources.nvml.fields import FIELDS

    return [(f.field_id, f.scope) for f in FIELDS]


def _under_load(handle: Any, seconds: float) -> dict[str, Any]:
    try:
        load = subprocess.Popen([sys.executable, "-c", LOAD.format(seconds=seconds)])
    except OSError as exc:
        return {"error": str(exc)}
    time.sleep(min(8.0, seconds / 2))
    seen = 0
    batches: list[str | dict[str, Any]] = []
    for _ in range(5):
        time.sleep(1.0)
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(handle, seen)
        except pynvml.NVMLError as exc:
            batches.append(f"NVMLError({exc.value})")
            continue
        stamps = sorted(int(s.timeStamp) for s in samples)
        batches.append(
            {
                "samples": len(samples),
                "pids": sorted({int(s.pid) for s in samples}),
                "sm": [int(s.smUtil) for s in samples][:10],
                "spacing_us": [b - a for a, b in itertools.pairwise(stamps)][:10],
            }
        )
        seen = max(stamps, default=seen)
    running = [
        (p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    ]
    busy_us, _ = timed(lambda: pynvml.nvmlDeviceGetProcessUtilization(handle, 0), repeat=10)
    field_us, _ = timed(
        lambda: pynvml.nvmlDeviceGetFieldValues(handle, _field_request()), repeat=10
    )
    util = pynvml.nvmlDeviceGetUtilizationRates(handle)
    load.wait()
    return {
        "batches_1s_apart": batches,
        "running": running,
        "gpu_util": util.gpu,
        "process_utilization_us": round(busy_us * 1e6, 1),
        "field_values_us": round(field_us * 1e6, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", type=float, default=0.0, help="seconds of CUDA load")
    args = parser.parse_args()
    print(json.dumps(probe(args.load), indent=1, default=str))


if __name__ == "__main__":
    main()
