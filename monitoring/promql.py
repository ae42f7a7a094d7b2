"""PromQL written with OpenTelemetry names, translated through the metric-spec table.

`promql('max by (k8s.node.name, hw.id) (hw.gpu.utilization{hw.gpu.task="general"})')`
gives `max by (k8s_node_name, hw_id) (hw_gpu_utilization_ratio{hw_gpu_task="general"})`.
Every dotted identifier outside a string must be a metric of `exporter.metrics.SPECS` or an
attribute of `exporter.metrics.ATTRIBUTES`, else `UnknownName` is raised, so a typo or a
renamed metric breaks generation instead of shipping an empty panel. A string literal that
is exactly a dotted attribute key (a `label_replace` argument) is translated too.
"""

from __future__ import annotations

import re

from exporter.metrics import ATTRIBUTES, SPECS, prometheus_label

_TOKEN = re.compile(
    r"""(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)"""
    r"|(?P<dotted>(?<![\w$.])[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)+)"
    r"|(?P<space>\s+)"
)


class UnknownName(ValueError):
    """A dotted name that is neither a spec metric nor a known attribute."""


def metric(name: str) -> str:
    """OpenTelemetry metric name -> the Prometheus sample name (`_total` on counters)."""
    return SPECS[name].prom_name


def label(attribute: str) -> str:
    """OpenTelemetry attribute key -> Prometheus label name."""
    if attribute not in ATTRIBUTES:
        raise UnknownName(f"unknown attribute {attribute!r} (not in exporter.metrics.ATTRIBUTES)")
    return prometheus_label(attribute)


def _dotted(name: str) -> str:
    in_specs, in_attrs = name in SPECS, name in ATTRIBUTES
    if in_specs and in_attrs:  # pragma: no cover - guarded by a test on the tables
        raise UnknownName(f"{name!r} is both a metric and an attribute")
    if in_specs:
        return metric(name)
    if in_attrs:
        return prometheus_label(name)
    raise UnknownName(f"unknown metric or attribute {name!r} in PromQL")


def promql(text: str) -> str:
    """Translate OpenTelemetry names in `text` to Prometheus names."""

    def replace(m: re.Match[str]) -> str:
        if m["string"] is not None:
            literal = m["string"]
            inner = literal[1:-1]
            return (
                f"{literal[0]}{prometheus_label(inner)}{literal[-1]}"
                if ("." in inner and inner in ATTRIBUTES)
                else literal
            )
        if m["space"] is not None:
            return " "  # queries are written over several lines; Grafana shows one
        return _dotted(m["dotted"])

    return _TOKEN.sub(replace, text).strip()
