"""The monitors scrape at the exporter's collection interval, in the kit and the chart: one
scrape per cycle, so no cycle goes unscraped and a counter's per-scrape delta is one cycle.
The interval is read from the rendered DaemonSet (its flags and KDE_* variables over the
exporter's own default), so changing either side alone fails here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.cli.flags import parse_config
from tests.support.manifests import one, render_chart

ROOT = Path(__file__).resolve().parent.parent


def _seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+)(s|m)", duration)
    assert match, duration
    return int(match.group(1)) * (60 if match.group(2) == "m" else 1)


def _collect_interval(daemonset: dict[str, Any]) -> float:
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    interval: float = parse_config(container.get("args", []), env=env).collect_interval
    return interval


def _kit(path: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((ROOT / path).read_text()) if d]


def test_the_kit_scrapes_once_a_cycle() -> None:
    (daemonset,) = [d for d in _kit("deploy/base/daemonset.yaml") if d["kind"] == "DaemonSet"]
    cycle = _collect_interval(daemonset)
    for path in ("deploy/servicemonitor/servicemonitor.yaml", "deploy/podmonitor/podmonitor.yaml"):
        (monitor,) = _kit(path)
        key = "endpoints" if monitor["kind"] == "ServiceMonitor" else "podMetricsEndpoints"
        for endpoint in monitor["spec"][key]:
            assert _seconds(endpoint["interval"]) == cycle, path
            assert _seconds(endpoint["scrapeTimeout"]) <= cycle, path


@pytest.mark.parametrize("kind", ["ServiceMonitor", "PodMonitor"])
def test_the_chart_scrapes_once_a_cycle(kind: str) -> None:
    rendered = render_chart({"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}})
    cycle = _collect_interval(one(rendered, "DaemonSet"))
    monitor = one(rendered, kind)
    key = "endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"
    assert [_seconds(e["interval"]) for e in monitor["spec"][key]] == [cycle]
