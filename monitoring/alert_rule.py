"""An alert rule as the kit writes it, with the promtool unit tests that show it firing and
not firing: what monitoring/alerts.py and monitoring/dra_alerts.py build their rules with."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Case:
    """A promtool unit test of one alert: input series, an evaluation time, and the label
    sets (beyond alertname and severity) of the alerts that must be firing then; none means
    the alert must not fire."""

    title: str
    series: dict[str, str]
    eval_time: str
    fires: tuple[dict[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Alert:
    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str
    cases: tuple[Case, ...] = field(default=())


N1 = 'k8s.node.name="node-1"'
"""The node of every test input."""
