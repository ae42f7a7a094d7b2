"""`make bench`: what the exporter costs a node, a scraper and a fleet -> docs/performance.md.

Every exporter measured runs in its own process against a simulated node in another
(`kde-simulate SCENARIO --node-only`); CPU and memory come from /proc. Costs compared with
each other (1 s vs 10 s, ours vs a static handler vs node_exporter) are measured side by
side in the same run, interleaved, so machine load hits them alike.

    python -m bench [--window S] [--churn-cycles N] [--fleet-nodes N] [--out FILE]
    python -m bench nvml-calls [--cycles N]     NVML call costs against the loaded library
    python -m bench gpm [--cycles N]            GPM (profiling) cost per cycle, its cadence
    python -m bench podresources [--scenario S]  List change check and parse costs, shuffled
    python -m bench scrape [--baseline DIR]      scrape latency at Prometheus's cadences
    python -m bench fleet [--nodes N]            the fleet alone, per schema and group set
    python -m bench grpc-idle [--spacings 1,2,5]  a gRPC channel kept open vs closed between calls
    python -m bench startup [--runs N]           what importing the exporter costs
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import aiohttp

from bench import (
    ab,
    churn,
    cost,
    fleet,
    floor,
    generate,
    gpm,
    grpc_idle,
    labels,
    nvml_calls,
    podresources,
    scrape,
    startup,
    threads,
)
from bench.procs import ExporterProcess, NodeProcess
from bench.report import Results, fleet_section, floor_rounds, write

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ("demo", "dense", "mixed")
GENERATED = (16, 32, 64)


def _run_churn(cycles: int, big_pods: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-m", "bench", "churn", str(cycles), str(big_pods)],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


async def _dense_scrape_and_nvml(workdir: Path) -> tuple[str, str]:
    """A dense /metrics (plain text) and the stand-in's NVML call table."""
    node = NodeProcess.start("dense", workdir)
    exporter = ExporterProcess(node, "1s")
    try:
        async with aiohttp.ClientSession() as http:
            await exporter.wait_ready(http)
            async with http.get(f"{exporter.url}metrics") as r:
                text = await r.text()
        calls = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "bench", "nvml-calls", "--cycles", "100"],
            env={**os.environ, **node.env},
            check=True,
            capture_output=True,
            text=True,
        )
    finally:
        exporter.stop()
        node.stop()
    return text, calls.stdout


def run_all(args: argparse.Namespace) -> Results:
    results = Results(
        machine=f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    with tempfile.TemporaryDirectory(prefix="kde-bench-") as tmp:
        work = Path(tmp)
        names = [*SCENARIOS, *(str(generate.write(g, work)) for g in GENERATED)]
        names.append(str(generate.write_held(generate.HELD_PODS, work)))
        if args.scenarios:
            wanted = args.scenarios.split(",")
            names = [n for n in names if Path(n).stem in wanted or n in wanted]
        for name in names:
            label = cost.label(name)
            rows = asyncio.run(
                cost.measure(name, work / label, warmup=args.warmup, window=args.window)
            )
            results.costs[label] = rows
            summary = "; ".join(
                f"{c.interval}: {c.cpu_per_cycle_s * 1000:.1f} ms/cycle, {c.core_share:.2%}, "
                f"{c.rss_bytes / 2**20:.0f} MiB, ready {c.ready_s:.2f}s"
                for c in rows
            )
            print(f"{label}: {summary}", flush=True)
        growing = (generate.generated_name(64), generate.held_name())
        bigger = [n for n in names if cost.label(n) in growing]
        if "dense" in names and bigger:
            results.growth = asyncio.run(
                cost.growth(
                    "dense",
                    bigger,
                    work / "growth",
                    warmup=args.warmup,
                    window=max(args.window, 45.0),
                    rounds=args.growth_rounds,
                )
            )
            for g in results.growth:
                print(f"growth {g.scenario}/dense: {g.ratio:.2f}x, rounds {g.ratios}", flush=True)
        if not args.scenarios or "dense" in args.scenarios.split(","):
            results.breakdown = asyncio.run(
                cost.breakdown("dense", work / "breakdown", warmup=args.warmup, window=args.window)
            )
            print(f"breakdown: {results.breakdown}", flush=True)
            results.wakeups = asyncio.run(
                cost.wakeups(
                    "dense", work / "wakeups", warmup=args.warmup, window=args.wakeup_window
                )
            )
            print(f"wake-ups: {results.wakeups}", flush=True)
            results.floor = asyncio.run(
                cost.floor_ratios(
                    "dense",
                    work / "floor",
                    warmup=args.warmup,
                    window=max(args.window, 90.0),
                    rounds=args.floor_rounds,
                )
            )
            print(f"floor: {results.floor}", flush=True)
            results.threads = asyncio.run(
                threads.measure(
                    "dense",
                    work / "threads",
                    interval="1s",
                    warmup=args.warmup,
                    window=args.window,
                )
            )
            print(threads.table(results.threads), flush=True)
            results.grpc_idle = grpc_idle.measure((1.0, 10.0), args.grpc_idle_window)
            print(f"grpc idle: {results.grpc_idle}", flush=True)
        results.startup = startup.measure()
        print(f"startup: {results.startup}", flush=True)
        results.latency = asyncio.run(
            scrape.measure(
                "dense", work / "scrape", per_cycle_s=args.scrape_seconds, rounds=args.rounds
            )
        )
        for lat in results.latency:
            print(
                f"scrape {lat.target}, {lat.cadence}: p50 {lat.p50_ms:.2f} ms, "
                f"p99 {lat.p99_ms:.2f} ms, {lat.scrapes} scrapes",
                flush=True,
            )
        text, results.nvml_calls = asyncio.run(_dense_scrape_and_nvml(work / "labels"))
        results.placements = labels.placements(text)
        results.gpm = subprocess.run(
            [sys.executable, "-m", "bench", "gpm"], check=True, capture_output=True, text=True
        ).stdout
        print(results.gpm, flush=True)
        results.churn = _run_churn(args.churn_cycles, args.big_pods)
        print(f"churn: {results.churn}", flush=True)
        if args.fleet_nodes:
            results.fleet = asyncio.run(
                fleet.measure_sets(
                    work / "fleet",
                    nodes=args.fleet_nodes,
                    interval=5.0,
                    duration=args.fleet_duration,
                )
            )
            print(f"fleet: {results.fleet}", flush=True)
        results.otlp = asyncio.run(
            fleet.otlp_volume(work / "otlp", export_every="10s", duration=args.otlp_duration)
        )
        print(f"otlp: {results.otlp}", flush=True)
    return results


def _floor_only(argv: list[str]) -> int:
    """`python -m bench floor-ratios [--window S]`: only the exporter-against-floor rows (on
    a GPU node's CPU, say), printed, not written to the docs."""
    parser = argparse.ArgumentParser(prog="python -m bench floor-ratios")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=1, help="windows; the median one's")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kde-floor-") as tmp:
        rows = asyncio.run(
            cost.floor_ratios(
                "dense", Path(tmp), warmup=args.warmup, window=args.window, rounds=args.rounds
            )
        )
    print("| interval | exporter | floor | ratio | a process that only wakes |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r.interval} | {r.exporter_share:.3%} | {r.floor_share:.3%} | "
            f"{r.ratio:.2f}x{floor_rounds(r.rounds)} | {r.wake_share:.3%} |"
        )
    return 0


def _fleet_only(argv: list[str]) -> int:
    """Measure the fleet alone and rewrite only its Prometheus part of the report."""
    parser = argparse.ArgumentParser(prog="python -m bench fleet")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--duration", type=float, default=40.0)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "performance.md")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kde-fleet-") as tmp:
        fleets = asyncio.run(
            fleet.measure_sets(Path(tmp), nodes=args.nodes, interval=5.0, duration=args.duration)
        )
    for f in fleets:
        print(f"fleet: {f}", flush=True)
    text = args.out.read_text()
    head, rest = text.split("## The fleet\n\n", 1)
    tail = rest[rest.index("OTLP/HTTP (gzip)") :]
    args.out.write_text(head + "## The fleet\n\n" + "".join(fleet_section(fleets)) + tail)
    print(f"wrote {args.out}")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["nvml-calls"]:
        return nvml_calls.main(argv[1:])
    if argv[:1] == ["gpm"]:
        return gpm.main(argv[1:])
    if argv[:1] == ["podresources"]:
        return podresources.main(argv[1:])
    if argv[:1] == ["startup"]:
        return startup.main(argv[1:])
    if argv[:1] == ["floor"]:
        return floor.main(argv[1:])
    if argv[:1] == ["ab"]:
        return ab.main(argv[1:])
    if argv[:1] == ["threads"]:
        return threads.main(argv[1:])
    if argv[:1] == ["floor-ratios"]:
        return _floor_only(argv[1:])
    if argv[:1] == ["grpc-idle"]:
        return grpc_idle.main(argv[1:])
    if argv[:1] == ["scrape"]:
        return scrape.main(argv[1:])
    if argv[:1] == ["static"]:
        scrape.serve_static(Path(argv[1]), argv[2], int(argv[3]))
        return 0
    if argv[:1] == ["fleet"]:
        return _fleet_only(argv[1:])
    if argv[:1] == ["churn"]:
        churn.main(int(argv[1]), int(argv[2]))
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--window", type=float, default=30.0, help="seconds of CPU measured")
    parser.add_argument(
        "--scrape-seconds", type=float, default=90.0, help="scraped once per 1 s cycle"
    )
    parser.add_argument("--rounds", type=int, default=8, help="15 s scrape rounds")
    parser.add_argument(
        "--wakeup-window", type=float, default=90.0, help="seconds of context switches counted"
    )
    parser.add_argument(
        "--grpc-idle-window", type=float, default=30.0, help="seconds per gRPC idle pair"
    )
    parser.add_argument(
        "--growth-rounds",
        type=int,
        default=3,
        help="side-by-side windows of the 64-GPU and 1,000-pod nodes against dense",
    )
    parser.add_argument(
        "--floor-rounds",
        type=int,
        default=3,
        help="side-by-side windows of the exporters against the floor of the same work",
    )
    parser.add_argument("--churn-cycles", type=int, default=10_000)
    parser.add_argument("--big-pods", type=int, default=1_000)
    parser.add_argument("--fleet-nodes", type=int, default=4)
    parser.add_argument("--fleet-duration", type=float, default=40.0)
    parser.add_argument("--otlp-duration", type=float, default=60.0)
    parser.add_argument("--scenarios", default="", help="comma-separated subset (quick runs)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "performance.md")
    args = parser.parse_args(argv)
    write(run_all(args), args)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
