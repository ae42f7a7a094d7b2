"""What starting the exporter costs before its first cycle: importing it (issue 27 item 7,
nothing expensive at import time), timed in fresh processes, and each module's own share
from `python -X importtime`; every time is the best over the runs (the least disturbed).

    python -m bench startup [--runs N]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass

IMPORT = "import exporter.cli.main, exporter.app"
"""What `kube-device-exporter` imports before it reads its flags and starts."""


@dataclass(frozen=True)
class Startup:
    import_s: float
    """The whole import, best of the runs."""
    slowest: tuple[tuple[str, float], ...]
    """The modules whose own import (children excluded) took longest: (name, seconds)."""


def parse(text: str) -> dict[str, tuple[float, float]]:
    """`-X importtime` lines -> module: (self seconds, cumulative seconds)."""
    found: dict[str, tuple[float, float]] = {}
    for line in text.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, cumulative, name = line.removeprefix("import time:").split("|")
        found[name.strip()] = (int(own) / 1e6, int(cumulative) / 1e6)
    return found


TIMED = f"import time; t = time.perf_counter(); {IMPORT}; print(time.perf_counter() - t)"


def measure(runs: int = 7, top: int = 5) -> Startup:
    best: dict[str, tuple[float, float]] = {}
    whole = min(
        float(
            subprocess.run(
                [sys.executable, "-c", TIMED], check=True, capture_output=True, text=True
            ).stdout
        )
        for _ in range(runs)
    )
    for _ in range(runs):
        err = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", IMPORT],
            check=True,
            capture_output=True,
            text=True,
        ).stderr
        for name, (own, cumulative) in parse(err).items():
            old = best.get(name, (own, cumulative))
            best[name] = (min(old[0], own), min(old[1], cumulative))
    slowest = sorted(((n, own) for n, (own, _) in best.items()), key=lambda kv: -kv[1])
    return Startup(whole, tuple(slowest[:top]))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench startup")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args(argv)
    result = measure(args.runs)
    print(f"`{IMPORT}`: {result.import_s * 1000:.0f} ms (best of {args.runs})")
    for name, seconds in result.slowest:
        print(f"  {name}: {seconds * 1000:.1f} ms of its own")
    return 0
