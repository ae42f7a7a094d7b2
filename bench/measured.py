"""Measured figures quoted in prose: one file holds them, the docs show them between markers.

`docs/measured.json` maps a key to the figure as the docs print it, with where it came from
(the command, the machine, the date). `make bench` (bench/report.py) writes the simulated-node
keys from the run that writes docs/performance.md; `bench/real_gpu.sh` writes the real-GPU
keys on a GPU node. README.md and docs/*.md quote a figure as

    <!-- measured:KEY -->0.90 %<!-- /measured -->

and `python -m bench.measured` (run by `make docs`) rewrites what stands between the markers;
tests/test_measured.py fails when any of them disagrees with the file.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "docs" / "measured.json"
MARKER = re.compile(r"<!-- measured:(?P<key>[\w.-]+) -->(?P<shown>.*?)<!-- /measured -->", re.S)


def documents(root: Path = ROOT) -> list[Path]:
    """Where figures may be quoted: the README and every page under docs/."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def load(path: Path = FIGURES) -> dict[str, dict[str, Any]]:
    figures: dict[str, dict[str, Any]] = json.loads(path.read_text())
    return figures


def value(figures: Mapping[str, Mapping[str, Any]], key: str) -> str:
    if key not in figures:
        raise KeyError(f"no measured figure {key!r} in {FIGURES.name}")
    return str(figures[key]["value"])


def render(text: str, figures: Mapping[str, Mapping[str, Any]]) -> str:
    """`text` with every marker showing the current figure."""
    return MARKER.sub(
        lambda m: f"<!-- measured:{m['key']} -->{value(figures, m['key'])}<!-- /measured -->",
        text,
    )


def quoted(text: str) -> list[tuple[str, str]]:
    """(key, what the text shows) for every marker in `text`."""
    return [(m["key"], m["shown"]) for m in MARKER.finditer(text)]


def record(values: Mapping[str, str], *, source: str, machine: str, path: Path = FIGURES) -> None:
    """Store freshly measured figures (others are kept), each with where it came from."""
    figures = load(path) if path.exists() else {}
    day = datetime.now(UTC).date().isoformat()
    for key, shown in values.items():
        figures[key] = {"value": shown, "source": source, "machine": machine, "date": day}
    path.write_text(json.dumps(dict(sorted(figures.items())), indent=2) + "\n")


def rewrite(paths: Iterable[Path], figures: Mapping[str, Mapping[str, Any]]) -> list[Path]:
    """Render every document in place; the ones that changed."""
    changed = []
    for path in paths:
        text = path.read_text()
        new = render(text, figures)
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed


def _record_real_gpu(cpu_txt: Path, machine: str) -> None:
    """`bench/real_gpu.sh`'s cpu.txt -> the real-GPU keys."""
    text = cpu_txt.read_text()
    share = float(re.search(r"share_of_core=([0-9.]+)%", text)[1])  # type: ignore[index]
    rss_kib = int(re.search(r"rss_kib=([0-9]+)", text)[1])  # type: ignore[index]
    sigterm = float(re.search(r"sigterm_exit_s ([0-9.]+)", text)[1])  # type: ignore[index]
    record(
        {
            "real_gpu.core_share_1s": f"{share:.2f} %",
            "real_gpu.rss_1s": f"{rss_kib / 1024:.0f} MiB",
            "real_gpu.sigterm_exit": f"{sigterm:.2f} s",
        },
        source="bench/real_gpu.sh: the exporter alone at a 1 s interval for 60 s, no kubelet",
        machine=machine,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.measured", description=__doc__)
    parser.add_argument(
        "--real-gpu",
        type=Path,
        metavar="CPU_TXT",
        help="record bench/real_gpu.sh's cpu.txt first (with --machine)",
    )
    parser.add_argument("--machine", default="", help="the GPU, driver and CUDA of --real-gpu")
    args = parser.parse_args(argv)
    if args.real_gpu:
        if not args.machine:
            parser.error("--real-gpu needs --machine (the GPU, its driver and CUDA version)")
        _record_real_gpu(args.real_gpu, args.machine)
    for path in rewrite(documents(), load()):
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
