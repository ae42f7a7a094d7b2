"""Memory under pod churn and on a big node, in a process of its own (`python -m bench
churn`), so its RSS is the pipeline's alone: the real poller, join, Prometheus sink and
/api/devices view, fed by a kubelet whose pods come and go every cycle and by 8 GPUs
time-sliced so that 1,000 pods can hold them."""

from __future__ import annotations

import asyncio
import gc
import json
import sys
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
from exporter.poller import Poller
from exporter.sinks.prometheus import PrometheusSink
from exporter.sinks.web import DevicesView

GPUS = 8
SAMPLES = (
    ("hw.gpu.utilization", (("hw.gpu.task", "general"),)),
    ("hw.gpu.memory.usage", ()),
    ("hw.gpu.memory.limit", ()),
    ("hw.power", ()),
    ("hw.energy", ()),
    ("hw.temperature", (("hw.sensor_location", "gpu"),)),
)


def rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096


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

    async def poll(self) -> PodResourcesState:
        del self.live[: self.churn if len(self.live) >= self.pods else 0]
        del self.live[self.pods :]
        while len(self.live) < self.pods:
            self.live.append(self._pod())
        return PodResourcesState(pods=tuple(self.live), api_version="v1")

    def health(self) -> PodResourcesHealth:
        return PodResourcesHealth(api_version="v1", connected=True)

    async def close(self) -> None:
        return None


async def run(cycles: int, big_pods: int) -> dict[str, float]:
    kubelet = ChurningKubelet()
    prometheus, view = PrometheusSink(), DevicesView()
    poller = Poller(
        node="bench-node",
        sources={"nvml": Gpus()},
        client=kubelet,  # type: ignore[arg-type]
        sinks=[prometheus, view],
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
    gc.collect()
    out["warm_rss"] = rss_bytes()
    kubelet.resize(200, 10)
    for i in range(cycles):
        await cycle(i % 15 == 0)
    gc.collect()
    out["churned_rss"] = rss_bytes()
    out["warm_blocks"] = float(sys.getallocatedblocks())
    for swing in ("", "_again"):  # twice: what stays after the first swing must not grow
        kubelet.resize(big_pods, 0, per_pod=GPUS)  # every pod holds a replica of every GPU
        for i in range(30):
            await cycle(i % 15 == 0)
        out[f"big_rss{swing}"] = rss_bytes()
        out["big_series"] = float(prometheus.rendered.series if prometheus.rendered else 0)
        kubelet.resize(200, 0)
        for i in range(30):
            await cycle(i % 15 == 0)
        gc.collect()
        out[f"shrunk_rss{swing}"] = rss_bytes()
        out[f"shrunk_blocks{swing}"] = float(sys.getallocatedblocks())
    out["cycles"] = float(cycles)
    await poller.close()
    return out


def main(cycles: int, big_pods: int) -> None:
    print(json.dumps(asyncio.run(run(cycles, big_pods))))
