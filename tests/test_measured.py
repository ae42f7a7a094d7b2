"""Measured figures in README.md and docs/*.md come from one file, docs/measured.json.

A figure quoted in prose sits between `<!-- measured:KEY -->` markers (bench/measured.py);
these tests fail when a page shows another value than the file, names a key the file lacks,
or quotes a core share or a real-GPU footprint without the markers.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench import measured

FIGURES = measured.load()
DOCS = measured.documents()


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_quoted_figure_is_the_measured_one(path: Path) -> None:
    for key, shown in measured.quoted(path.read_text()):
        assert key in FIGURES, f"{path.name} quotes {key!r}, which docs/measured.json lacks"
        assert shown == FIGURES[key]["value"], f"{path.name}: {key} {shown!r}; run `make docs`"


def test_every_figure_says_where_it_came_from_and_is_quoted() -> None:
    text = "".join(p.read_text() for p in DOCS)
    quoted = {key for key, _ in measured.quoted(text)}
    for key, figure in FIGURES.items():
        assert {"value", "source", "machine", "date"} <= figure.keys(), key
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", figure["date"]), key
        assert key in quoted, f"{key} is quoted nowhere: drop it from docs/measured.json"


OUTSIDE = re.compile(r"\d+(?:\.\d+)? ?% of (?:a|one) core")


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_no_core_share_is_typed_by_hand(path: Path) -> None:
    """docs/performance.md is written whole by `make bench` and docs/gpu-node.md by
    bench/gpu_node.py from bench/real_gpu.sh's output; elsewhere a share of a core is a
    figure someone measured, and it must come from the file."""
    if path.name in ("performance.md", "gpu-node.md"):
        return
    text = measured.MARKER.sub("", path.read_text())
    assert not OUTSIDE.findall(text), f"{path.name}: quote it as <!-- measured:KEY -->"


def test_readme_and_nvml_md_agree_on_the_real_gpu() -> None:
    """The issue-31 case: the README and the page it links said 0.33 % / 77 MiB and 0.90 % /
    74 MiB for the same run."""
    readme, nvml = (
        path.read_text() for path in DOCS[:1] + [p for p in DOCS if p.name == "nvml.md"]
    )
    for key in ("real_gpu.core_share_1s", "real_gpu.rss_1s"):
        assert (key, FIGURES[key]["value"]) in measured.quoted(readme)
        assert (key, FIGURES[key]["value"]) in measured.quoted(nvml)


def test_render_replaces_a_stale_figure_and_record_keeps_the_others(tmp_path: Path) -> None:
    path = tmp_path / "measured.json"
    path.write_text('{"a": {"value": "1 ms", "source": "s", "machine": "m", "date": "2026-01-01"}}')
    measured.record({"b": "2 MiB"}, source="test", machine="here", path=path)
    figures = measured.load(path)
    assert figures["a"]["value"] == "1 ms" and figures["b"]["value"] == "2 MiB"
    text = "x <!-- measured:b -->9 MiB<!-- /measured --> y"
    assert measured.render(text, figures) == "x <!-- measured:b -->2 MiB<!-- /measured --> y"
    with pytest.raises(KeyError, match="no measured figure 'c'"):
        measured.render("<!-- measured:c -->?<!-- /measured -->", figures)
