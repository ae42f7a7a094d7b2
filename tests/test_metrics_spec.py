"""The metric-spec table: naming rules, and docs/metrics.md derived from it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from exporter.metrics import (
    ATTRIBUTES,
    SPECS_LIST,
    Kind,
    Scope,
    prometheus_label,
    prometheus_name,
)
from monitoring.metricdoc import markdown

DOC = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"


@pytest.mark.parametrize(
    ("name", "unit", "kind", "expected"),
    [
        # The OpenTelemetry Collector's translation of the semantic-convention metrics.
        ("hw.gpu.utilization", "1", Kind.GAUGE, "hw_gpu_utilization_ratio"),
        ("hw.gpu.memory.usage", "By", Kind.UPDOWN, "hw_gpu_memory_usage_bytes"),
        ("hw.energy", "J", Kind.COUNTER, "hw_energy_joules_total"),
        ("hw.power", "W", Kind.GAUGE, "hw_power_watts"),
        ("hw.temperature", "Cel", Kind.GAUGE, "hw_temperature_celsius"),
        ("hw.errors", "{error}", Kind.COUNTER, "hw_errors_total"),
        ("hw.status", "1", Kind.UPDOWN, "hw_status"),
        ("hw.network.io", "By", Kind.COUNTER, "hw_network_io_bytes_total"),
        (
            "hw.network.bandwidth.limit",
            "By/s",
            Kind.UPDOWN,
            "hw_network_bandwidth_limit_bytes_per_second",
        ),
        ("x.duration", "s", Kind.GAUGE, "x_duration_seconds"),
        ("x.seconds", "s", Kind.GAUGE, "x_seconds"),
    ],
)
def test_prometheus_translation(name: str, unit: str, kind: Kind, expected: str) -> None:
    assert prometheus_name(name, unit, kind) == expected


def test_names_are_unique_and_valid() -> None:
    prom = [s.prom_name for s in SPECS_LIST]
    assert len(set(prom)) == len(prom)
    assert len({s.name for s in SPECS_LIST}) == len(SPECS_LIST)
    for spec in SPECS_LIST:
        assert re.fullmatch(r"[a-z_][a-z0-9_]*", spec.prom_name), spec.name
        assert spec.help.strip()
        assert (spec.kind is Kind.COUNTER) == spec.prom_name.endswith("_total"), spec.name
        if spec.scope is Scope.EXPORTER:
            assert spec.name.startswith("kube_device_exporter."), spec.name
        elif spec.scope is Scope.POD:
            assert spec.name.startswith("k8s.pod."), spec.name
        else:
            assert spec.name.startswith("hw."), spec.name


def test_every_attribute_is_documented() -> None:
    for spec in SPECS_LIST:
        for attr in spec.attributes:
            assert attr in ATTRIBUTES, (spec.name, attr)
    labels = [prometheus_label(a) for a in ATTRIBUTES]
    assert len(set(labels)) == len(labels)
    # Never the labels Prometheus adds to every scraped series.
    assert not set(labels) & {
        "namespace",
        "pod",
        "container",
        "instance",
        "job",
        "service",
        "endpoint",
    }


def test_docs_metrics_md_is_generated_from_the_table() -> None:
    assert DOC.read_text() == markdown(), "run `make docs`"
