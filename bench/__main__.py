"""`make bench`: cycle cost and scrape cost on the simulated node -> docs/performance.md.

Machines here are noisy, so every figure in the table is a ratio of two things measured
side by side, interleaved, in the same run (medians over the repetitions); absolute times
are printed to the terminal for context but not written as results.

    python -m bench [--reps N] [--scenarios demo,dense,...] [--out docs/performance.md]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from exporter.app import Exporter, build_sources
from exporter.cli import parse_config
from exporter.join import ResourceMatcher, join
from exporter.model import PodResourcesState, SourceResult
from exporter.simulate.node import SimulatedNode
from exporter.simulate.scenario import bundled_names, load_scenario
from exporter.sinks.prometheus import render

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Row:
    scenario: str
    devices: int
    pods: int
    series: int
    text_bytes: int
    gzip_ratio: float
    cycle_over_scrape: float
    shares: dict[str, float]
    absolute_ms: dict[str, float]


async def _median(fn: Callable[[], Awaitable[object]], reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        started = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - started)
    return out


async def bench_scenario(name: str, reps: int, workdir: Path) -> Row:
    scenario = load_scenario(name)
    node = SimulatedNode(scenario, workdir / name)
    await node.start()
    config = parse_config(
        [*node.exporter_args(), "--web.listen-address", "127.0.0.1:0", "--collect-interval", "1h"]
    )
    sources = build_sources(config)
    exporter = Exporter(config, sources=sources)
    await exporter.start()
    try:
        await exporter.wait_ready(60)
        client = exporter.client
        poller = exporter.poller
        url = f"{exporter.url}metrics"
        timings: dict[str, list[float]] = {
            k: [] for k in ("kubelet", "sources", "join", "render", "cycle", "scrape")
        }
        async with aiohttp.ClientSession() as http:

            async def scrape() -> None:
                async with http.get(url, headers={"Accept-Encoding": "gzip"}) as r:
                    await r.read()

            for _ in range(reps):
                # Interleave everything so drift in machine load hits all columns alike.
                t0 = time.perf_counter()
                state = await client.poll()
                t1 = time.perf_counter()
                results: list[SourceResult] = [
                    await asyncio.to_thread(src.collect) for src in sources.values()
                ]
                t2 = time.perf_counter()
                joined = join(results, state, ResourceMatcher(config.resource_patterns))
                t3 = time.perf_counter()
                snapshot = await poller.run_once()
                t4 = time.perf_counter()
                rendered = render(snapshot)
                t5 = time.perf_counter()
                await scrape()
                t6 = time.perf_counter()
                timings["kubelet"].append(t1 - t0)
                timings["sources"].append(t2 - t1)
                timings["join"].append(t3 - t2)
                timings["cycle"].append(t4 - t3)
                timings["render"].append(t5 - t4)
                timings["scrape"].append(t6 - t5)
        med = {k: statistics.median(v) for k, v in timings.items()}
        parts = ("kubelet", "sources", "join", "render")
        total = sum(med[p] for p in parts)
        return Row(
            scenario=name,
            devices=len(joined.devices),
            pods=len(state.pods) if isinstance(state, PodResourcesState) else 0,
            series=rendered.series,
            text_bytes=len(rendered.text),
            gzip_ratio=len(rendered.text_gzip) / len(rendered.text),
            cycle_over_scrape=med["cycle"] / med["scrape"],
            shares={p: med[p] / total for p in parts},
            absolute_ms={k: v * 1000 for k, v in med.items()},
        )
    finally:
        await exporter.stop()
        await node.stop()


def table(rows: list[Row], reps: int) -> str:
    out = [
        "# Performance\n\n",
        "Written by `make bench` (`python -m bench`). Every figure is a ratio of two costs\n"
        f"measured side by side in one run, interleaved, median of {reps} repetitions, on the\n"
        "simulated node "
        "(simulated kubelet over a real unix socket, the compiled stand-in NVML library through\n"
        "nvidia-ml-py, fixture sysfs trees). Absolute times depend on the machine and are not\n"
        "results; the command prints them for context.\n\n",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}.\n\n",
        "## Scrape vs cycle\n\n",
        "A scrape serves bytes rendered once per cycle. `cycle / scrape` is how many times more\n"
        "an exporter that collects on every scrape (as dcgm-exporter does with its kubelet\n"
        "mapping) would spend per scrape than this one does.\n\n",
        "| scenario | devices | pods | series | /metrics bytes | gzip / plain | cycle / scrape |\n",
        "|---|---|---|---|---|---|---|\n",
    ]
    for r in rows:
        out.append(
            f"| {r.scenario} | {r.devices} | {r.pods} | {r.series} | {r.text_bytes} | "
            f"{r.gzip_ratio:.2f} | {r.cycle_over_scrape:.1f}x |\n"
        )
    out += [
        "\n## Where a cycle's time goes\n\n",
        "Share of (kubelet List + source reads + join + render), each measured in the same "
        "loop.\n\n",
        "| scenario | kubelet List | sources (NVML, sysfs) | join "
        "| render (text + OpenMetrics + gzip) |\n",
        "|---|---|---|---|---|\n",
    ]
    for r in rows:
        s = r.shares
        out.append(
            f"| {r.scenario} | {s['kubelet']:.0%} | {s['sources']:.0%} | {s['join']:.0%} | "
            f"{s['render']:.0%} |\n"
        )
    return "".join(out)


def _reexec_with_node_env(scenarios: list[str]) -> None:
    """The NVML binding dlopens libnvidia-ml.so.1 by name: LD_LIBRARY_PATH must be set
    before the process starts, as `simulate` does."""
    with tempfile.TemporaryDirectory() as tmp:
        needed: dict[str, str] = {}
        for name in scenarios:
            needed.update(SimulatedNode(load_scenario(name), Path(tmp) / name).env())
    needed.pop("KDE_FAKENVML_STATE", None)  # per node; the node sets it in-process
    path = needed.get("LD_LIBRARY_PATH")
    if path and os.environ.get("LD_LIBRARY_PATH") != path:
        os.execve(sys.executable, [sys.executable, "-m", "bench", *sys.argv[1:]],
                  {**os.environ, "LD_LIBRARY_PATH": path})  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--scenarios", default=",".join(n for n in ("demo", "dense", "mixed")
                                                           if n in bundled_names()))  # fmt: skip
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "performance.md")
    args = parser.parse_args()
    scenarios = [s for s in args.scenarios.split(",") if s]
    _reexec_with_node_env(scenarios)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in scenarios:
            row = asyncio.run(bench_scenario(name, args.reps, Path(tmp)))
            print(f"{name}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in row.absolute_ms.items()))
            rows.append(row)
    args.out.write_text(table(rows, args.reps))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
