"""Our render path against the reference (prometheus_client) and its per-cycle caching."""

from __future__ import annotations

import gzip
import math
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families as parse_text

from exporter.model import (
    Attributes,
)
from exporter.sinks import prometheus as prometheus_sink
from exporter.sinks.prometheus import Layout, PrometheusSink, Renderer, reference, render
from tests.support.snapshots import snapshot

Samples = set[tuple[str, frozenset[tuple[str, str]], float | str]]


def samples(body: bytes, *, om: bool) -> Samples:
    parse = parse_openmetrics if om else parse_text
    out: Samples = set()
    for family in parse(body.decode()):
        for s in family.samples:
            value: float | str = "NaN" if math.isnan(s.value) else s.value
            out.add((s.name, frozenset(s.labels.items()), value))
    return out


@pytest.mark.parametrize("om", [False, True], ids=["text", "openmetrics"])
def test_our_bytes_parse_to_the_reference_samples(om: bool) -> None:
    snap = snapshot(pods=('odd "pod"\\x\ny', "plain", "ünïcode"))
    ours = render(snap)
    text, openmetrics = reference(snap)
    expected = openmetrics if om else text
    body = ours.openmetrics if om else ours.text
    assert samples(body, om=om) == samples(expected, om=om)
    assert len(samples(body, om=om)) == ours.series
    # Byte-identical, in fact: same ordering, escaping and float formatting.
    assert body == expected


def test_gzip_bodies_decompress_to_the_plain_ones() -> None:
    rendered = render(snapshot())
    assert gzip.decompress(rendered.text_gzip) == rendered.text
    assert gzip.decompress(rendered.openmetrics_gzip) == rendered.openmetrics


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many series each Layout.build formatted label sets for (one entry per build)."""
    counts: list[int] = []
    real_build = Layout.build.__func__  # type: ignore[attr-defined]
    real_labels = prometheus_sink._labels

    def counting_labels(attributes: Attributes) -> str:
        counts[-1] += 1
        return real_labels(attributes)

    def counting_build(cls: type[Layout], *args: Any) -> Layout:
        counts.append(0)
        return real_build(cls, *args)  # type: ignore[no-any-return]

    monkeypatch.setattr(prometheus_sink, "_labels", counting_labels)
    monkeypatch.setattr(Layout, "build", classmethod(counting_build))
    return counts


def test_layout_is_reused_while_the_series_are_the_same(builds: list[int]) -> None:
    renderer = Renderer()
    first = renderer.render(snapshot(util=0.25))
    second = renderer.render(snapshot(util=0.75))
    assert len(builds) == 1
    assert second.layout is first.layout
    assert b'hw_gpu_task="general",hw_id="GPU-0"' in second.text
    assert samples(second.text, om=False) == samples(reference(snapshot(util=0.75))[0], om=False)
    assert samples(second.text, om=False) != samples(first.text, om=False)


def test_layout_is_rebuilt_when_a_series_comes_or_goes(builds: list[int]) -> None:
    renderer = Renderer()
    renderer.render(snapshot(pods=("a",)))
    grown = renderer.render(snapshot(pods=("a", "b")))
    shrunk = renderer.render(snapshot(pods=("b",)))
    assert len(builds) == 3
    # A rebuild formats only the label sets the last layout did not have.
    assert builds[1] < builds[0] and builds[2] < builds[0]
    assert b'k8s_pod_name="a"' not in shrunk.text
    assert samples(grown.text, om=False) == samples(
        reference(snapshot(pods=("a", "b")))[0], om=False
    )
    # Lines reused from the last layout make the very bytes a fresh layout makes.
    for rebuilt, pods in ((grown, ("a", "b")), (shrunk, ("b",))):
        fresh = render(snapshot(pods=pods))
        assert (rebuilt.text, rebuilt.openmetrics) == (fresh.text, fresh.openmetrics)


def test_a_format_is_built_once_per_cycle() -> None:
    rendered = render(snapshot())
    body = rendered.body(openmetrics=True, gzipped=True)[0]
    assert rendered.body(openmetrics=True, gzipped=True)[0] is body


@pytest.mark.parametrize("om", [False, True], ids=["text", "openmetrics"])
def test_the_sink_adds_process_metrics(om: bool) -> None:
    sink = PrometheusSink()
    sink.update(snapshot())
    assert sink.rendered is not None
    body = sink.rendered.openmetrics if om else sink.rendered.text
    names = {name for name, _, _ in samples(body, om=om)}
    assert {
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
    } <= names
    if om:
        assert body.count(b"# EOF") == 1 and body.endswith(b"\n# EOF\n")


def test_the_sink_renders_only_when_asked_and_once_per_cycle(builds: list[int]) -> None:
    sink = PrometheusSink(process_metrics=False)
    assert not sink.ready and sink.rendered is None
    for util in (0.1, 0.2, 0.3):  # three cycles nobody scraped
        sink.update(snapshot(util=util))
    assert sink.ready and not sink.cached
    assert builds == []
    rendered = sink.rendered
    assert rendered is not None and sink.cached
    assert sink.rendered is rendered
    assert b"} 0.3\n" in rendered.text  # the latest cycle's values
    sink.update(snapshot(util=0.4))
    assert not sink.cached
