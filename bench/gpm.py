"""`python -m bench gpm`: what GPM (the profiling metrics) costs the NVML source per cycle.

GPM is read on its own cadence (`--collector.nvml.gpm-interval`, default 10 s): one
nvmlGpmSampleGet / nvmlGpmMigSampleGet and one nvmlGpmMetricsGet per device and GPM read.
This runs the NVML source in-process against the stand-in library on a scenario, with a
fake clock stepping one collection interval per cycle (the stand-in's time steps with it,
so each GPM read has a rate), and times every GPM call. The stand-in's calls cost
microseconds; a real H100's cost milliseconds, so the table also applies the per-call
figures measured on one (docs/nvml.md, `MEASURED_COSTS`): nvmlGpmSampleGet 0.04 ms,
nvmlGpmMetricsGet 1.5 ms for 5 metrics (the source asks 12 in that one call; an H200 on
the same driver answered 12 in 1.44 ms and 5 in 1.45 ms: docs/gpu-node.md).
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

from bench.nvml_calls import COUNTING, _Timed
from exporter.sources import SourceContext
from exporter.sources.nvml import NvmlSource
from simulator import nvml as simnvml
from simulator.scenario import load_scenario

H100_MS = {"nvmlGpmSampleGet": 0.04, "nvmlGpmMigSampleGet": 0.04, "nvmlGpmMetricsGet": 1.5}
"""Per call on an H100 (issue 28; docs/nvml.md). MigSampleGet: taken as SampleGet's."""


@dataclass(frozen=True)
class GpmCost:
    scenario: str
    gpm_interval: str
    devices: int
    metrics_calls_per_cycle: float
    stand_in_us_per_cycle: float
    """Time in GPM calls per cycle against the stand-in."""
    h100_ms_per_cycle: float
    """The same calls at an H100's measured per-call costs."""
    h100_ms_per_read: float
    """One GPM read of every device (the cycle it happens in pays it all)."""
    collect_us: float


def measure(scenario: str, cycles: int, interval: float, gpm_interval: str) -> GpmCost:
    loaded = load_scenario(scenario)
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    resolve = pynvml._nvmlGetFunctionPointer
    wrapped: dict[str, _Timed] = {}

    def timed_pointer(name: str) -> Any:
        if name not in wrapped:
            wrapped[name] = _Timed(name, resolve(name), totals)
        return wrapped[name]

    now = [0.0]
    with tempfile.TemporaryDirectory(prefix="kde-bench-gpm-") as tmp:
        part = simnvml.make_part(loaded, Path(tmp))
        os.environ[simnvml.STATE_ENV] = str(part.state_path)
        pynvml._nvmlGetFunctionPointer = timed_pointer
        ctx = SourceContext(
            options={"gpm-interval": gpm_interval, "xid-events": "false"},
            clock=lambda: now[0],
            logger=logging.getLogger("bench.gpm"),
        )
        source = NvmlSource(ctx)
        spent = 0.0
        try:
            for _ in range(3):  # warm-up: handles, field ids, the first GPM samples
                now[0] += interval
                part.advance(now[0])
                source.collect()
            totals.clear()
            for _ in range(cycles):
                now[0] += interval
                part.advance(now[0])
                COUNTING[0] = threading.get_ident()
                started = time.perf_counter()
                result = source.collect()
                spent += time.perf_counter() - started
                COUNTING[0] = 0
        finally:
            COUNTING[0] = 0
            source.close()
            part.close()
            pynvml._nvmlGetFunctionPointer = resolve
    gpm = {name: t for name, t in totals.items() if name.startswith("nvmlGpm")}
    metrics_calls = gpm.get("nvmlGpmMetricsGet", [0, 0.0])[0]
    h100 = sum(count * H100_MS.get(name, 0.0) for name, (count, _) in gpm.items())
    devices = len([r for r in result.readings])
    reads = metrics_calls / devices if devices else 0
    return GpmCost(
        scenario=scenario,
        gpm_interval=gpm_interval,
        devices=devices,
        metrics_calls_per_cycle=metrics_calls / cycles,
        stand_in_us_per_cycle=sum(t for _, t in gpm.values()) / cycles * 1e6,
        h100_ms_per_cycle=h100 / cycles,
        h100_ms_per_read=h100 / reads if reads else 0.0,
        collect_us=spent / cycles * 1e6,
    )


def table(costs: list[GpmCost], interval: float) -> str:
    lines = [
        f"GPM cost per {interval:g} s cycle of the NVML source (stand-in library; H100 column: "
        "the same calls at an H100's measured per-call costs)\n",
        "| node | devices | GPM interval | nvmlGpmMetricsGet per cycle | stand-in, µs per cycle "
        "| H100, ms per cycle | H100, ms per GPM read | collect(), µs per cycle |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in costs:
        lines.append(
            f"| {c.scenario} | {c.devices} | {c.gpm_interval} | {c.metrics_calls_per_cycle:.1f} "
            f"| {c.stand_in_us_per_cycle:.0f} | {c.h100_ms_per_cycle:.1f} "
            f"| {c.h100_ms_per_read:.0f} | {c.collect_us:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench gpm")
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--interval", type=float, default=1.0, help="collection interval, s")
    parser.add_argument("--scenarios", default="dense,demo")
    args = parser.parse_args(argv)
    simnvml.preload_library()
    costs = []
    for scenario in args.scenarios.split(","):
        for gpm_interval in ("10s", f"{args.interval:g}s"):  # the default, and every cycle
            costs.append(measure(scenario, args.cycles, args.interval, gpm_interval))
    print(table(costs, args.interval), end="")
    return 0
