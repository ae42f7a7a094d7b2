"""`python -m bench ab REV [--window S] [--rounds N]`: this tree's exporter against another
revision's, side by side on one simulated node.

The other revision's `exporter` package is taken with `git archive` into a temporary
folder and run from there (same interpreter, same dependencies, same node, same scrapes
every 15 s); both collect every second. Each round prints CPU per cycle and share of a core
of each: on a shared or virtual machine only a difference that holds round after round,
measured side by side, says a change made the exporter cheaper.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import subprocess
import tarfile
import tempfile
from functools import partial
from pathlib import Path

import aiohttp

from bench.cost import _side_by_side, learn_cadence
from bench.procs import ExporterProcess, NodeProcess

ROOT = Path(__file__).resolve().parent.parent


def export(rev: str, into: Path) -> None:
    """`rev`'s exporter package under `into` (git archive, nothing built)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "exporter"], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")


async def compare(rev: str, scenario: str, window: float, rounds: int) -> list[str]:
    lines = []
    with tempfile.TemporaryDirectory(prefix="kde-ab-") as tmp:
        other = Path(tmp) / "tree"
        export(rev, other)
        node = NodeProcess.start(scenario, Path(tmp) / "node")
        path = os.pathsep.join(p for p in (str(other), os.environ.get("PYTHONPATH", "")) if p)
        exporters = [
            ExporterProcess(node, "1s", env={"PYTHONPATH": path}, cwd=other),
            ExporterProcess(node, "1s"),
        ]
        try:
            async with aiohttp.ClientSession() as http:
                for e in exporters:
                    await e.wait_ready(http)
                await asyncio.sleep(5.0)
                await learn_cadence([partial(e.scrape, http) for e in exporters])
                measured = await _side_by_side(exporters, http, window, rounds)
                for n, windows in enumerate(measured):
                    for name, w in zip((rev, "this tree"), windows, strict=True):
                        lines.append(
                            f"| {n + 1} | {name} | {w.per_cycle_s * 1e3:.2f} ms | "
                            f"{w.cpu_s / w.elapsed_s:.3%} | {w.series} |"
                        )
                        print(lines[-1], flush=True)
        finally:
            for e in exporters:
                e.stop()
            node.stop()
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench ab")
    parser.add_argument("rev", help="the revision to compare with (a commit, a branch)")
    parser.add_argument("--scenario", default="dense")
    parser.add_argument("--window", type=float, default=45.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    print("| round | exporter | CPU per cycle | share of a core | series |\n|---|---|---|---|---|")
    asyncio.run(compare(args.rev, args.scenario, args.window, args.rounds))
    return 0
