"""Reading the committed monitoring kit: dashboard queries, template variables, rules.

Shared by the static kit checks and the real-Prometheus acceptance test, so both look at
the files users import, not at the generator's intermediate objects.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from exporter.metrics import ATTRIBUTES, SPECS_LIST, prometheus_label

ROOT = Path(__file__).resolve().parent.parent
DASHBOARDS = ROOT / "dashboards"
RULES = ROOT / "deploy" / "alerts" / "kube-device-exporter.rules.yaml"
RULE_TESTS = ROOT / "deploy" / "alerts" / "kube-device-exporter.rules.test.yaml"
PROMETHEUS_RULE = ROOT / "deploy" / "prometheusrule" / "prometheusrule.yaml"

PROMETHEUS_SERIES = {"up", "scrape_duration_seconds", "kube_daemonset_status_number_unavailable",
                     "kube_node_status_allocatable", "kube_pod_info"}  # fmt: skip
"""Series Prometheus itself makes per target, and the kube-state-metrics series the rules
read; the only non-spec names the kit may use."""
TARGET_LABELS = {
    "job", "instance", "namespace", "pod", "container", "service", "endpoint", "daemonset",
    "cluster",
    # kube-state-metrics' own labels on the series above.
    "node", "resource", "unit", "created_by_kind", "created_by_name",
}  # fmt: skip
"""Labels Prometheus (and kube-prometheus) put on every target's series; `cluster`: the
external label that tells clusters apart in a Prometheus holding several (Thanos, Mimir)."""
SPEC_SERIES = {s.prom_name for s in SPECS_LIST}
SPEC_LABELS = {prometheus_label(a) for a in ATTRIBUTES}


@dataclass(frozen=True, slots=True)
class PanelQuery:
    dashboard: str
    panel: str
    ref: str
    expr: str
    instant: bool

    @property
    def id(self) -> str:
        return f"{self.dashboard}:{self.panel}:{self.ref}"


@dataclass(frozen=True, slots=True)
class Variable:
    name: str
    kind: str
    query: str
    """label_values(...) for query variables, the comma list for custom ones."""
    multi: bool
    all_value: str


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def panels(board: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def panel_queries() -> list[PanelQuery]:
    out = []
    for stem, board in dashboards().items():
        for panel in panels(board):
            for target in panel.get("targets", []):
                out.append(
                    PanelQuery(
                        stem,
                        panel["title"],
                        target["refId"],
                        target["expr"],
                        bool(target.get("instant")),
                    )
                )
    return out


def variables(board: Mapping[str, Any]) -> list[Variable]:
    out = []
    for v in board.get("templating", {}).get("list", []):
        query = v.get("query", "")
        if isinstance(query, dict):
            query = query.get("query", "")
        out.append(
            Variable(v["name"], v["type"], str(query), bool(v.get("multi")), v.get("allValue", ""))
        )
    return out


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


# --- names in PromQL -------------------------------------------------------------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_LABEL_LIST = re.compile(
    r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", re.IGNORECASE
)
_MATCHERS = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_IDENT = re.compile(r"(?<![\w$.])([A-Za-z_:][A-Za-z0-9_:]*)\b(?!\s*\()")
_KEYWORDS = {
    "and", "or", "unless", "bool", "offset", "inf", "nan", "by", "without", "on",
    "ignoring", "group_left", "group_right", "atan2",
}  # fmt: skip
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$")


def names_in(expr: str) -> tuple[set[str], set[str]]:
    """(series names, label names) a PromQL expression or label_values() query uses."""
    labels: set[str] = set()
    m = _LABEL_VALUES.match(expr)
    if m:
        expr = m[1]
        labels.add(m[2])
    for matchers in _MATCHERS.findall(_STRING.sub('""', expr)):
        labels.update(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", matchers))
    bare = _STRING.sub('""', expr)
    for _, group in _LABEL_LIST.findall(bare):
        labels.update(x.strip() for x in group.split(",") if x.strip())
    bare = _LABEL_LIST.sub(" ", bare)
    bare = _MATCHERS.sub(" ", bare)
    bare = _RANGE.sub(" ", bare)
    bare = re.sub(r"\$\{?\w+\}?", " ", bare)
    series = {t for t in _IDENT.findall(bare) if t.lower() not in _KEYWORDS}
    return series, labels


def label_replace_targets(expr: str) -> set[str]:
    """Labels written by label_replace (string arguments 2 and 4)."""
    found = set()
    for m in re.finditer(r'label_replace\(.*?,\s*"([^"]+)",\s*"[^"]*",\s*"([^"]+)"', expr):
        found.update({m[1], m[2]})
    return found
