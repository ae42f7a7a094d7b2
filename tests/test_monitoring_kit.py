"""The monitoring kit as files: generated and up to date, only spec-table names, importable
dashboards, alert rules that promtool accepts and whose unit tests cover every alert."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from monitoring.__main__ import stale
from monitoring.alerts import RUNBOOK_BASE, XID_CLASSES
from monitoring.promql import UnknownName, promql
from monitoring.render import files, flow
from tests import kit, kustomize
from tests.peers import promtool


def test_generated_files_are_up_to_date() -> None:
    assert stale() == [], "run `python -m monitoring` and commit the result"


def test_promql_translates_spec_names_and_rejects_unknown_ones() -> None:
    assert (
        promql('sum by (k8s.node.name) (rate(hw.energy{hw.vendor="nvidia.com"}[5m]))')
        == 'sum by (k8s_node_name) (rate(hw_energy_joules_total{hw_vendor="nvidia.com"}[5m]))'
    )
    assert promql('label_replace(x, "hw.id", "$1", "hw.parent", "(.+)")') == (
        'label_replace(x, "hw_id", "$1", "hw_parent", "(.+)")'
    )
    with pytest.raises(UnknownName, match=r"hw\.gpu\.utilisation"):
        promql("hw.gpu.utilisation")


def _every_expr() -> list[tuple[str, str]]:
    exprs = [(q.id, q.expr) for q in kit.panel_queries()]
    for stem, board in kit.dashboards().items():
        exprs += [(f"{stem}:${v.name}", v.query) for v in kit.variables(board) if v.kind == "query"]
    exprs += [(rule["alert"], rule["expr"]) for rule in kit.rules()]
    return exprs


def test_every_metric_and_label_used_exists() -> None:
    """Every series a dashboard or rule names is a row of the metric-spec table (or one
    Prometheus makes per target); every label is a spec attribute or a target label."""
    exprs = _every_expr()
    assert len(exprs) > 100
    for where, expr in exprs:
        series, labels = kit.names_in(expr)
        unknown = series - kit.SPEC_SERIES - kit.PROMETHEUS_SERIES
        assert not unknown, f"{where}: not in exporter/metrics.py: {unknown}\n{expr}"
        known = kit.SPEC_LABELS | kit.TARGET_LABELS | kit.label_replace_targets(expr)
        assert not labels - known, f"{where}: unknown labels {labels - known}\n{expr}"


def test_names_in_sees_series_and_labels() -> None:
    """The checker above can fail: it finds the names in a query."""
    series, labels = kit.names_in(
        'sum by (k8s_node_name) (rate(hw_energy_joules_total{hw_vendor=~"$vendor"}'
        "[$__rate_interval]))"
        " / on(hw_id) group_left(k8s_pod_name) nonsense_metric offset 5m > bool 0.5"
    )
    assert series == {"hw_energy_joules_total", "nonsense_metric"}
    assert labels == {"k8s_node_name", "hw_vendor", "hw_id", "k8s_pod_name"}


def _datasources(node: Any) -> list[Any]:
    found = []
    if isinstance(node, dict):
        if "datasource" in node:
            found.append(node["datasource"])
        for value in node.values():
            found += _datasources(value)
    elif isinstance(node, list):
        for value in node:
            found += _datasources(value)
    return found


@pytest.mark.parametrize("stem", sorted(kit.dashboards()))
def test_dashboard_is_importable_anywhere(stem: str) -> None:
    board = kit.dashboards()[stem]
    variables = {v.name: v for v in kit.variables(board)}
    assert variables["datasource"].kind == "datasource"
    assert variables["datasource"].query == "prometheus"
    refs = _datasources(board)
    assert refs, "no panel names a datasource"
    for ref in refs:
        assert ref == {"type": "prometheus", "uid": "${datasource}"}, ref
    assert board["id"] is None and board["uid"].startswith("kde-")
    ids = [p["id"] for p in kit.panels(board)]
    assert len(ids) == len(set(ids))
    for panel in kit.panels(board):
        if panel["type"] not in ("row", "text"):
            assert panel.get("description"), f"{panel['title']}: no description"
            assert panel["targets"], panel["title"]
            refs_ids = [t["refId"] for t in panel["targets"]]
            assert len(set(refs_ids)) == len(refs_ids) and all(refs_ids)


@pytest.mark.peer
def test_dashboard_uids_are_unique_and_configmaps_carry_them() -> None:
    """The kit's ConfigMaps are made by kustomize from the one stored copy, dashboards/:
    the rendered text is each file's text, byte for byte, under the sidecar's label."""
    boards = kit.dashboards()
    assert len({b["uid"] for b in boards.values()}) == len(boards) == 5
    maps = {cm["metadata"]["name"]: cm for cm in kustomize.build(kit.ROOT / "deploy" / "grafana")}
    assert len(maps) == len(boards)
    for stem, board in boards.items():
        cm = maps[f"kube-device-exporter-dashboard-{stem}"]
        assert cm["kind"] == "ConfigMap"
        assert cm["metadata"]["namespace"] == "kube-device-exporter"
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "Devices"}
        (text,) = cm["data"].values()
        assert text == (kit.DASHBOARDS / f"{stem}.json").read_text()
        assert json.loads(text) == board
        # kubectl's client-side apply keeps a copy in an annotation limited to 256 KiB.
        assert len(text.encode()) < 200 * 1024


# --- alert rules -----------------------------------------------------------------------


@pytest.mark.peer
def test_rules_pass_promtool_check(tmp_path: Path) -> None:
    done = promtool("check", "rules", str(kit.RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    operator = yaml.safe_load(kit.PROMETHEUS_RULE.read_text())
    plain = yaml.safe_load(kit.RULES.read_text())
    assert operator["spec"]["groups"] == plain["groups"], "PrometheusRule and rule file differ"
    extracted = tmp_path / "from-prometheusrule.yaml"
    extracted.write_text(yaml.safe_dump({"groups": operator["spec"]["groups"]}))
    done = promtool("check", "rules", str(extracted))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.peer
def test_rule_unit_tests_pass() -> None:
    done = promtool("test", "rules", str(kit.RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_firing_and_quiet_cases() -> None:
    tests = yaml.safe_load(kit.RULE_TESTS.read_text())["tests"]
    fires: dict[str, int] = {}
    quiet: dict[str, int] = {}
    for test in tests:
        for check in test["alert_rule_test"]:
            counts = fires if check["exp_alerts"] else quiet
            counts[check["alertname"]] = counts.get(check["alertname"], 0) + 1
    alerts = {rule["alert"] for rule in kit.rules()}
    assert alerts == set(fires), f"alerts never shown firing: {alerts - set(fires)}"
    assert alerts == set(quiet), f"alerts never shown quiet: {alerts - set(quiet)}"


@pytest.mark.peer
def test_unit_tests_fail_when_an_alert_never_fires(tmp_path: Path) -> None:
    """Replace each alert's expression with one that never fires: promtool must fail, so
    each firing case really exercises its alert."""
    rules = yaml.safe_load(kit.RULES.read_text())
    tests = yaml.safe_load(kit.RULE_TESTS.read_text())
    for name in sorted(rule["alert"] for rule in kit.rules()):
        broken = copy.deepcopy(rules)
        for group in broken["groups"]:
            for rule in group["rules"]:
                if rule["alert"] == name:
                    rule["expr"] = "vector(1) > 2"
        own = [t for t in tests["tests"] if t["alert_rule_test"][0]["alertname"] == name]
        (tmp_path / "rules.yaml").write_text(yaml.safe_dump(broken))
        (tmp_path / "tests.yaml").write_text(
            yaml.safe_dump({**tests, "rule_files": ["rules.yaml"], "tests": own})
        )
        done = promtool("test", "rules", str(tmp_path / "tests.yaml"))
        assert done.returncode != 0, f"{name}: unit tests pass with an alert that never fires"
        assert name in done.stdout + done.stderr


def test_generator_writes_only_what_it_declares() -> None:
    paths = set(files())
    assert {p for p in paths if p.startswith("dashboards/")} == {
        f"dashboards/{p.name}" for p in kit.DASHBOARDS.glob("*.json")
    } | {"dashboards/kustomization.yaml"}


def test_generated_artefacts_are_stored_once() -> None:
    """The generator writes each dashboard and the rule groups once; the kit's ConfigMaps
    and the chart's files are made from those at render time, not stored beside them. The
    PrometheusRule is the one stored second form of the groups (kustomize cannot make a
    custom resource from a rule file); the rule tests above compare the two."""
    paths = set(files())
    assert not {p for p in paths if p.startswith(("deploy/helm/", "deploy/grafana/dashboard"))}
    assert sorted(p.name for p in (kit.ROOT / "deploy" / "grafana").iterdir()) == [
        "kustomization.yaml"
    ]
    stored = [
        p
        for top in ("dashboards", "deploy", "docs", "monitoring")
        for p in sorted((kit.ROOT / top).rglob("*"))
        if p.is_file() and not p.is_symlink() and "__pycache__" not in p.parts
    ]
    texts = {str(p.relative_to(kit.ROOT)): p.read_text() for p in stored}
    for stem, board in kit.dashboards().items():
        marker = f'"uid": "{board["uid"]}"'
        assert [p for p, text in texts.items() if marker in text] == [f"dashboards/{stem}.json"]
    first = f"- alert: {kit.rules()[0]['alert']}\n"
    assert [p for p, text in texts.items() if first in text] == [
        "deploy/alerts/kube-device-exporter.rules.yaml",
        "deploy/prometheusrule/prometheusrule.yaml",
    ]


def _cells(panel: dict[str, Any]) -> set[tuple[int, int]]:
    grid = panel["gridPos"]
    return {
        (x, y)
        for x in range(grid["x"], grid["x"] + grid["w"])
        for y in range(grid["y"], grid["y"] + grid["h"])
    }


@pytest.mark.parametrize("stem", sorted(kit.dashboards()))
def test_panels_fit_the_grid_without_overlapping(stem: str) -> None:
    taken: set[tuple[int, int]] = set()
    for panel in kit.panels(kit.dashboards()[stem]):
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, (panel["title"], grid)
        cells = _cells(panel)
        assert not cells & taken, f"{panel['title']} overlaps another panel: {grid}"
        taken |= cells


def test_flow_wraps_a_panel_that_does_not_fit() -> None:
    """The check above can fail: the SDK's placement put a 24-wide table at x=16."""
    panels: list[dict[str, Any]] = [
        {"type": "stat", "gridPos": {"x": 0, "y": 0, "w": 16, "h": 4}},
        {"type": "table", "gridPos": {"x": 16, "y": 0, "w": 24, "h": 10}},
        {"type": "row", "gridPos": {"x": 0, "y": 0, "w": 24, "h": 1}},
    ]
    assert max(p["gridPos"]["x"] + p["gridPos"]["w"] for p in panels) > 24
    flow(panels)
    assert [(p["gridPos"]["x"], p["gridPos"]["y"]) for p in panels] == [(0, 0), (0, 4), (0, 14)]


# --- alerts that do not lie ----------------------------------------------------------------


def test_every_alert_links_its_runbook_section() -> None:
    runbooks = (kit.ROOT / "docs" / "runbooks.md").read_text()
    headings = {
        line[3:].strip().lower() for line in runbooks.splitlines() if line.startswith("## ")
    }
    for rule in kit.rules():
        url = rule["annotations"]["runbook_url"]
        base, _, anchor = url.partition("#")
        assert base == RUNBOOK_BASE and base.endswith("docs/runbooks.md"), url
        assert anchor == rule["alert"].lower() and anchor in headings, url


def test_xid_classes_page_by_meaning() -> None:
    severity = {rule["alert"]: rule["labels"]["severity"] for rule in kit.rules()}
    assert severity["KubeDeviceXidHardware"] == "critical"
    assert severity["KubeDeviceXidDriver"] == "warning"
    assert severity["KubeDeviceXidApplication"] == "info"
    classes = [set(codes) for codes in XID_CLASSES.values()]
    assert not set.intersection(*classes), "an XID in two classes would alert twice"
    assert {"13", "31", "43"} <= set(XID_CLASSES["application"])
    power = next(r for r in kit.rules() if r["alert"] == "KubeDevicePowerThrottling")
    assert "brake" not in power["expr"] and "power.*" not in power["expr"]


NO_HISTORY = ("Prometheus restarted", "new HA replica", "scrape gap")
FIRST_SEEN = ("KubeDeviceXidHardware", "KubeDeviceXidDriver", "KubeDeviceXidApplication",
              "KubeDeviceXidError", "KubeDeviceUncorrectableEccErrors")  # fmt: skip


def _tests_of(alert: str) -> list[dict[str, Any]]:
    tests = yaml.safe_load(kit.RULE_TESTS.read_text())["tests"]
    return [t for t in tests if t["alert_rule_test"][0]["alertname"] == alert]


@pytest.mark.parametrize("alert", FIRST_SEEN)
def test_first_seen_rules_have_no_history_cases(alert: str) -> None:
    """Each "first seen" rule has quiet cases with no history and a firing new event."""
    tests = _tests_of(alert)
    for title in NO_HISTORY:
        (case,) = [t for t in tests if title in t["name"]]
        assert case["alert_rule_test"][0]["exp_alerts"] == [], case["name"]
    assert any("first" in t["name"] or "a new XID" in t["name"] for t in tests
               if t["alert_rule_test"][0]["exp_alerts"])  # fmt: skip


@pytest.mark.peer
def test_old_first_seen_rule_fires_after_a_restart(tmp_path: Path) -> None:
    """The no-history cases can fail: `max(x) unless max(x offset 10m)`, the rule before,
    fires on them under the same promtool tests."""
    groups = yaml.safe_load(kit.RULES.read_text())["groups"]
    for group in groups:
        for rule in group["rules"]:
            if rule.get("alert") == "KubeDeviceXidHardware":
                rule["expr"] = rule["expr"].split(" and on(")[0].replace(" or ((", " or (", 1)
                assert "offset 10m" in rule["expr"] and "hw_info" not in rule["expr"]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    tests = [t for t in _tests_of("KubeDeviceXidHardware") if "Prometheus restarted" in t["name"]]
    assert len(tests) == 1
    (tmp_path / "tests.yaml").write_text(
        yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests})
    )
    done = promtool("test", "rules", str(tmp_path / "tests.yaml"))
    assert done.returncode != 0, done.stdout
    assert "KubeDeviceXidHardware" in done.stdout + done.stderr


STEMS = sorted(kit.dashboards())
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("stem", STEMS)
def test_every_query_of_a_dashboard_filters_by_cluster(stem: str) -> None:
    """Issue 31, item 14: the first variable after the data source is `cluster`, and every
    variable and panel query is filtered by it (a multi-cluster Prometheus would mix them)."""
    board = kit.dashboards()[stem]
    variables = kit.variables(board)
    assert [v.name for v in variables][:2] == ["datasource", "cluster"]
    for v in variables[2:]:
        assert v.kind != "query" or 'cluster=~"$cluster"' in v.query, v.name
    queries = [q for q in kit.panel_queries() if q.dashboard == stem]
    assert queries
    for q in queries:
        assert 'cluster=~"$cluster"' in q.expr, f"{q.panel}: {q.expr}"


def test_docs_state_the_minimum_grafana_version() -> None:
    """schemaVersion 41 is what Grafana 11.6 and later write (its migration, grafana/grafana
    #100135 and #100554, came with 11.6); older Grafana may not read the JSON as intended."""
    versions = {kit.dashboards()[stem]["schemaVersion"] for stem in STEMS}
    assert versions == {41}
    text = (ROOT / "docs" / "dashboards.md").read_text()
    assert "Grafana 11.6 or later" in text and "schemaVersion 41" in text
