#!/usr/bin/env bash
# The CPU budget of issue 12 on a quieter machine than the 2-core developer box: builds the
# stand-in NVML library, then measures dense and mixed at 1 s and 10 s (bench/cost.py:
# exporters in their own processes against `kde-simulate --node-only`). Deps on PYTHONPATH.
set -eu
export PYTHONPATH=$PWD/.devdeps:$PWD
make -s -C simulator/fakenvml PYTHON="$(command -v python3)"
python3 - <<'PY'
import asyncio, tempfile
from pathlib import Path
from bench.cost import measure
for scenario in ("dense", "mixed", "demo"):
    for cost in asyncio.run(measure(scenario, Path(tempfile.mkdtemp()), warmup=5, window=40)):
        print(f"{scenario:6} {cost.interval:>4}: {cost.series} series, "
              f"{cost.cpu_per_cycle_s * 1e3:.2f} ms per cycle, {cost.core_share * 100:.2f}% of a core, "
              f"RSS {cost.rss_bytes / 2**20:.0f} MiB, ready in {cost.ready_s:.2f}s")
PY
