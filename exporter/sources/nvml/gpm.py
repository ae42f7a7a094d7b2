"""GPM (Hopper and later): activity as a rate between two sample buffers."""

from __future__ import annotations

import ctypes
import logging
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pynvml

from exporter.model import Sample
from exporter.settings.values import duration_over
from exporter.sources import add
from exporter.sources.nvml.calls import Calls

MIN_INTERVAL = 0.1
"""nvml.h (nvmlGpmSampleGet): "The interval between two nvmlGpmSampleGet() calls should be
greater than 100ms due to the internal sample refresh rate"."""


interval = duration_over(MIN_INTERVAL, "nvml.h: GPM samples over 100ms apart")
"""`--collector.nvml.gpm-interval`: a duration over nvml.h's 100 ms between samples."""


@dataclass(slots=True)
class Gpm:
    """Two GPM sample buffers: metrics are rates between the previous cycle and this one."""

    previous: Any
    current: Any
    primed: bool = False
    metrics_get: Any = None
    """This device's nvmlGpmMetricsGet_t, made on its first read and written again before
    each (`_prepare`): a new one per read zeroed the whole struct, room for every GPM metric
    NVML has, to ask for twelve."""


def allocate(calls: Calls) -> Gpm | None:
    first = calls.get(pynvml.nvmlGpmSampleAlloc)
    second = calls.get(pynvml.nvmlGpmSampleAlloc)
    return Gpm(first, second) if first is not None and second is not None else None


def release(pairs: Iterable[Gpm | None], log: logging.Logger) -> None:
    for pair in pairs:
        if pair is None:
            continue
        for sample in (pair.previous, pair.current):
            try:
                pynvml.nvmlGpmSampleFree(sample)
            except pynvml.NVMLError as exc:
                log.debug("nvmlGpmSampleFree: %s", exc)


_PCT, _MIB = 0.01, 1024.0 * 1024.0
_TX, _RX = ("network.io.direction", "transmit"), ("network.io.direction", "receive")


@dataclass(frozen=True, slots=True)
class GpmMetric:
    """An NVML GPM metric (nvml.h `nvmlGpmMetricId_t`) and the native sample it becomes."""

    metric_id: int
    metric: str
    scale: float
    """percent -> ratio (0.01), MiB/sec -> bytes/s (2^20)."""
    attributes: tuple[tuple[str, str], ...] = ()


METRICS: tuple[GpmMetric, ...] = (
    GpmMetric(pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL, "hw.gpu.graphics.activity", _PCT),
    GpmMetric(pynvml.NVML_GPM_METRIC_SM_UTIL, "hw.gpu.sm.activity", _PCT),
    GpmMetric(pynvml.NVML_GPM_METRIC_SM_OCCUPANCY, "hw.gpu.sm.occupancy", _PCT),
    GpmMetric(pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, "hw.gpu.tensor.activity", _PCT),
    GpmMetric(
        pynvml.NVML_GPM_METRIC_FP64_UTIL, "hw.gpu.pipe.activity", _PCT, (("hw.gpu.pipe", "fp64"),)
    ),
    GpmMetric(
        pynvml.NVML_GPM_METRIC_FP32_UTIL, "hw.gpu.pipe.activity", _PCT, (("hw.gpu.pipe", "fp32"),)
    ),
    GpmMetric(
        pynvml.NVML_GPM_METRIC_FP16_UTIL, "hw.gpu.pipe.activity", _PCT, (("hw.gpu.pipe", "fp16"),)
    ),
    GpmMetric(pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL, "hw.gpu.dram.activity", _PCT),
    GpmMetric(pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC, "hw.gpu.pcie.throughput", _MIB, (_TX,)),
    GpmMetric(pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC, "hw.gpu.pcie.throughput", _MIB, (_RX,)),
    # nvml.h: TOTAL_TX "NvLink write bandwidth", TOTAL_RX "NvLink read bandwidth", all links.
    GpmMetric(
        pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC,
        "hw.gpu.nvlink.throughput",
        _MIB,
        (_TX,),
    ),
    GpmMetric(
        pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC,
        "hw.gpu.nvlink.throughput",
        _MIB,
        (_RX,),
    ),
)
"""Every metric one nvmlGpmMetricsGet call asks for, per device and read."""

_UNDER_MIG = {
    "hw.gpu.graphics.activity": ("hw.gpu.utilization", (("hw.gpu.task", "general"),)),
    "hw.gpu.dram.activity": ("hw.gpu.memory.bandwidth.utilization", ()),
}
"""Under MIG NVML has no utilization counter: GPM's stands in for it too (as before GPM
was read on whole GPUs), so a slice's `hw.gpu.utilization` keeps working."""


def request(gpm: Gpm) -> Any:
    """An nvmlGpmMetricsGet_t (nvml.h: version NVML_GPM_METRICS_GET_VERSION) for METRICS
    between the previous sample and this one."""
    req = pynvml.c_nvmlGpmMetricsGet_t()
    req.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    req.numMetrics = len(METRICS)
    req.sample1, req.sample2 = gpm.previous, gpm.current
    for i, spec in enumerate(METRICS):
        req.metrics[i].metricId = spec.metric_id
    return req


_METRICS_AT = pynvml.c_nvmlGpmMetricsGet_t.metrics.offset
_METRIC_SIZE = ctypes.sizeof(pynvml.c_nvmlGpmMetric_t)
_WRITTEN = _METRICS_AT + len(METRICS) * _METRIC_SIZE
"""The bytes of a request that METRICS use: its header and their entries."""


def _answers() -> struct.Struct:
    """Each metric's nvmlReturn and value, at the offsets ctypes gives the C struct (native
    byte order, no alignment of its own: the pads are spelled out)."""
    parts, at = ["="], 0
    for i in range(len(METRICS)):
        entry = _METRICS_AT + i * _METRIC_SIZE
        for offset, code in (
            (pynvml.c_nvmlGpmMetric_t.nvmlReturn.offset, "I"),
            (pynvml.c_nvmlGpmMetric_t.value.offset, "d"),
        ):
            parts.append(f"{entry + offset - at}x{code}")
            at = entry + offset + struct.calcsize(f"={code}")
    return struct.Struct("".join(parts))


_ANSWERS = _answers()


def _template() -> bytes:
    """A request's used bytes with no samples: written over a device's request before each
    call, as nvml.h says the driver fills the outputs, not that it leaves the inputs alone."""
    req = request(Gpm(None, None))
    return bytes(memoryview(req).cast("B")[:_WRITTEN])


_TEMPLATE = _template()


def _prepare(gpm: Gpm) -> Any:
    """`gpm`'s request, its inputs written again, for its previous and current samples."""
    req = gpm.metrics_get
    if req is None:
        req = gpm.metrics_get = pynvml.c_nvmlGpmMetricsGet_t()
    memoryview(req).cast("B")[:_WRITTEN] = _TEMPLATE
    req.sample1, req.sample2 = gpm.previous, gpm.current
    return req


def read(
    calls: Calls,
    gpm: Gpm,
    samples: list[Sample],
    sample: Callable[..., Any],
    *args: Any,
    mig: bool = False,
) -> None:
    """GPM activity since the previous read's sample (`sample(*args, buffer)`); `mig`: a
    MIG slice or a MIG-enabled GPU, where GPM also stands in for NVML's utilization."""
    if calls.get(sample, *args, gpm.current, handle=True) is None:
        gpm.primed = False
        return
    if gpm.primed:
        req = _prepare(gpm)
        if calls.get(pynvml.nvmlGpmMetricsGet, req) is not None:
            answers = _ANSWERS.unpack_from(memoryview(req).cast("B"))
            for spec, ret, raw in zip(METRICS, answers[0::2], answers[1::2], strict=True):
                # Per metric: one the driver does not support is no series, the others stay.
                if ret != pynvml.NVML_SUCCESS:
                    continue
                value = raw * spec.scale
                add(samples, spec.metric, value, *spec.attributes)
                if mig and spec.metric in _UNDER_MIG:
                    name, attributes = _UNDER_MIG[spec.metric]
                    add(samples, name, value, *attributes)
    gpm.previous, gpm.current = gpm.current, gpm.previous
    gpm.primed = True
