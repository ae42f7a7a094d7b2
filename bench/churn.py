"""Memory under pod churn and on a big node, in processes of their own (`python -m bench
churn`), so their RSS is the pipeline's alone: the real poller, join, Prometheus sink,
/api/devices view and heap trimmer, fed by a kubelet whose pods come and go every cycle and
by 8 GPUs time-sliced so that 1,000 pods can hold them. One process per variant (the
exporter as the image runs it, without its heap trimmer, on Python's own allocator), run
side by side so that their CPU per cycle is compared under the same load."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import itertools
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from exporter.model import (
    Container,
    ContainerDevices,
    Device,
    DeviceReading,
    Pod,
    PodResourcesHealth,
    PodResourcesState,
    Sample,
    SourceResult,
)
from exporter.runtime.heap import SHIPPED_ENV, HeapTrimmer
from exporter.sinks.prometheus import PrometheusSink
from exporter.web.app import DevicesView
from tests.support.cycle import make_poller

GPUS = 8
SAMPLES = (
    ("hw.gpu.utilization", (("hw.gpu.task", "general"),)),
    ("hw.gpu.memory.usage", ()),
    ("hw.gpu.memory.limit", ()),
    ("hw.power", ()),
    ("hw.energy", ()),
    ("hw.temperature", (("hw.sensor_location", "gpu"),)),
)
SHRUNK_CYCLES = 90
"""Cycles after the shrink before RSS is read: both of the heap trimmer's trims run."""
SWINGS = 3
"""Times the node grows big and shrinks back: what stays after one swing must not grow."""


@dataclass(frozen=True)
class Variant:
    label: str
    env: dict[str, str]
    trim: bool
    """With the heap trimmer (exporter/runtime/heap.py) among the sinks, as the exporter runs."""


VARIANTS = {
    "": Variant("the exporter as the image runs it (glibc malloc, trimmer)", SHIPPED_ENV, True),
    "untrimmed.": Variant("the same without the heap trimmer", SHIPPED_ENV, False),
    "pymalloc.": Variant(
        "Python's own allocator (pymalloc), heap trimmer", {"PYTHONMALLOC": "pymalloc"}, True
    ),
}
"""Prefix of a variant's keys in the results -> the variant."""


def rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096


_MALLINFO2 = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _MALLINFO2.split(" ")]


def c_heap_in_use() -> float:
    """Bytes glibc's malloc has handed out and not got back (mallinfo2: heap + mmapped),
    which holds every container's table or array over 512 bytes; NaN without glibc 2.33."""
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except AttributeError:
        return float("nan")
    mallinfo2.restype = _Mallinfo2
    info = mallinfo2()
    return float(info.uordblks + info.hblkhd)


class Gpus:
    def __init__(self) -> None:
        self.t = 0.0

    def collect(self) -> SourceResult:
        self.t += 1.0
        readings = []
        for i in range(GPUS):
            device = Device(
                f"GPU-{i:08d}",
                "gpu",
                "nvidia",
                "H100",
                "nvml",
                attributes=(("hw.gpu.index", str(i)), ("hw.driver_version", "580.95.05")),
                aliases=frozenset({f"GPU-{i:08d}"}),
            )
            samples = tuple(Sample(m, self.t * (i + 1), a) for m, a in SAMPLES)
            readings.append(DeviceReading(device, samples))
        return SourceResult("nvml", tuple(readings))

    def close(self) -> None:
        return None


class ChurningKubelet:
    """`pods` pods of one container, each holding a replica of `per_pod` GPUs; every cycle
    the `churn` oldest are replaced by new ones (new names, new series)."""

    def __init__(self) -> None:
        self.pods = 0
        self.churn = 0
        self.per_pod = 1
        self.next = 0
        self.live: list[Pod] = []

    def resize(self, pods: int, churn: int, per_pod: int = 1) -> None:
        if per_pod != self.per_pod:
            self.live.clear()
        self.pods, self.churn, self.per_pod = pods, churn, per_pod

    def _pod(self) -> Pod:
        n = self.next
        self.next += 1
        ids = tuple(f"GPU-{(n + k) % GPUS:08d}::{n}" for k in range(self.per_pod))
        container = Container("main", (ContainerDevices("nvidia.com/gpu", ids),))
        return Pod(f"job-{n}", f"team-{n % 17}", (container,))

    async def poll(self, *, fresh_allocatable: bool = False) -> PodResourcesState:
        del self.live[: self.churn if len(self.live) >= self.pods else 0]
        del self.live[self.pods :]
        while len(self.live) < self.pods:
            self.live.append(self._pod())
        return PodResourcesState(pods=tuple(self.live), api_version="v1")

    def health(self) -> PodResourcesHealth:
        return PodResourcesHealth(api_version="v1", connected=True)

    def socket_changed(self) -> bool:
        return False  # no socket: no kubelet restarts

    def restarting(self) -> bool:
        return False

    async def close_channel(self) -> None:
        return None  # no channel: nothing kept between polls

    async def close(self) -> None:
        return None


async def run(
    cycles: int, big_pods: int, *, trim: bool = True, swings: int = SWINGS
) -> dict[str, float]:
    """`trim`: with the exporter's heap trimmer as the after-cycle step (False: as before it)."""
    kubelet = ChurningKubelet()
    prometheus, view = PrometheusSink(), DevicesView()
    ticks = itertools.count()
    trimmer = HeapTrimmer(clock=lambda: float(next(ticks)))  # a cycle is a second here
    poller = make_poller(
        node="bench-node",
        sources={"nvml": Gpus()},
        client=kubelet,
        sinks=[prometheus, view],
        after_cycle=[trimmer.after_cycle] if trim else [],
        interval=1.0,
        source_timeout=5.0,
    )

    async def cycle(scrape: bool) -> None:
        await poller.run_once()
        if scrape:  # formats and the JSON are built on request: ask, as scrapers would
            rendered = prometheus.rendered
            assert rendered is not None
            rendered.body(openmetrics=True, gzipped=True)
            _ = view.body

    out: dict[str, float] = {}
    kubelet.resize(200, 0)
    for i in range(50):
        await cycle(i % 15 == 0)
        if i == 0:  # as the exporter does after its first cycle (Poller.run_forever)
            gc.collect()
            gc.freeze()
    out["warm_rss"] = rss_bytes()
    kubelet.resize(200, 10)
    cpu = time.process_time()
    for i in range(cycles):
        await cycle(i % 15 == 0)
    out["cpu_per_cycle_s"] = (time.process_time() - cpu) / cycles
    out["churned_rss"] = rss_bytes()
    gc.collect()  # what is allocated, not what the free lists and cycles hold yet
    out["warm_blocks"] = float(sys.getallocatedblocks())
    out["warm_c_heap"] = c_heap_in_use()
    for swing in range(1, swings + 1):  # what stays after a swing must not grow with the next
        kubelet.resize(big_pods, 0, per_pod=GPUS)  # every pod holds a replica of every GPU
        for i in range(30):
            await cycle(i % 15 == 0)
        out[f"big_rss_{swing}"] = rss_bytes()
        out["big_series"] = float(prometheus.rendered.series if prometheus.rendered else 0)
        kubelet.resize(200, 0)
        for i in range(SHRUNK_CYCLES):
            await cycle(i % 15 == 0)
        out[f"shrunk_rss_{swing}"] = rss_bytes()
        gc.collect()
        out[f"shrunk_blocks_{swing}"] = float(sys.getallocatedblocks())
        out[f"shrunk_c_heap_{swing}"] = c_heap_in_use()
    out["cycles"] = float(cycles)
    out["trims"] = float(trimmer.trims)
    await poller.close()
    return out


def _child(env: dict[str, str], trim: bool, cycles: int, big_pods: int) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-m", "bench.churn", str(cycles), str(big_pods), str(int(trim))],
        env={**os.environ, **env},
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(cycles: int, big_pods: int) -> None:
    """Every variant in its own process, side by side (their CPU is compared under the
    same load); one JSON object, each variant's keys prefixed (`malloc.warm_rss`)."""
    with ThreadPoolExecutor(len(VARIANTS)) as pool:
        runs = {
            prefix: pool.submit(_child, v.env, v.trim, cycles, big_pods)
            for prefix, v in VARIANTS.items()
        }
    out = {prefix + k: v for prefix, done in runs.items() for k, v in done.result().items()}
    print(json.dumps(out))


if __name__ == "__main__":  # one variant: CYCLES BIG_PODS TRIM(0|1), as `main` runs it
    cycles_, big_pods_, trim_ = (int(a) for a in sys.argv[1:4])
    print(json.dumps(asyncio.run(run(cycles_, big_pods_, trim=bool(trim_)))))
