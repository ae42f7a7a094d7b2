"""GPM (Hopper and later): activity as a rate between two sample buffers."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pynvml

from exporter.model import Sample
from exporter.sources import add
from exporter.sources.nvml.calls import Calls


@dataclass(slots=True)
class Gpm:
    """Two GPM sample buffers: metrics are rates between the previous cycle and this one."""

    previous: Any
    current: Any
    primed: bool = False


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


def read(
    calls: Calls, gpm: Gpm, samples: list[Sample], sample: Callable[..., Any], *args: Any
) -> None:
    """GPM activity since the previous cycle's sample (`sample(*args, buffer)`)."""
    if calls.get(sample, *args, gpm.current, handle=True) is None:
        gpm.primed = False
        return
    if gpm.primed:
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 4
        request.sample1, request.sample2 = gpm.previous, gpm.current
        request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL
        request.metrics[1].metricId = pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL
        request.metrics[2].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
        request.metrics[3].metricId = pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
        if calls.get(pynvml.nvmlGpmMetricsGet, request) is not None:
            busy, dram, sm, tensor = request.metrics[0:4]
            if busy.nvmlReturn == pynvml.NVML_SUCCESS:
                add(samples, "hw.gpu.utilization", busy.value / 100, ("hw.gpu.task", "general"))
            if dram.nvmlReturn == pynvml.NVML_SUCCESS:
                add(samples, "hw.gpu.memory.bandwidth.utilization", dram.value / 100)
            # Per metric: one the driver does not support is no series, the others stay.
            if sm.nvmlReturn == pynvml.NVML_SUCCESS:
                add(samples, "hw.gpu.sm.activity", sm.value / 100)
            if tensor.nvmlReturn == pynvml.NVML_SUCCESS:
                add(samples, "hw.gpu.tensor.activity", tensor.value / 100)
    gpm.previous, gpm.current = gpm.current, gpm.previous
    gpm.primed = True
