"""The runbook base URL is one setting in the kit (components/runbook-base-url plus the URL
your overlay generates) and in the chart (prometheusRule.runbookBaseURL), and both give the
same PrometheusRule: every alert's link to its own section at the URL you publish
docs/runbooks.md."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from monitoring.alerts import RUNBOOK_BASE
from tests import kustomize
from tests.support.manifests import one, render_chart

ROOT = Path(__file__).resolve().parent.parent
URL = "https://wiki.example.com/kube-device-exporter/runbooks"


def _overlay(tmp_path: Path) -> list[dict[str, Any]]:
    mine = tmp_path / "overlay"
    mine.mkdir()
    doc = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(ROOT / "deploy/overlays/kube-prometheus-stack", mine)],
        "components": [os.path.relpath(ROOT / "deploy/components/runbook-base-url", mine)],
        "configMapGenerator": [{
            "name": "kube-device-exporter-runbook-base-url",
            "literals": [f"url={URL}"],
            "options": {"disableNameSuffixHash": True,
                        "annotations": {"config.kubernetes.io/local-config": "true"}},
        }],
    }  # fmt: skip
    (mine / "kustomization.yaml").write_text(yaml.safe_dump(doc))
    return kustomize.build(mine)


def _urls(rule: dict[str, Any]) -> list[str]:
    return [
        r["annotations"]["runbook_url"]
        for g in rule["spec"]["groups"]
        for r in g["rules"]
        if "alert" in r
    ]


@pytest.mark.peer
def test_one_url_moves_every_link_in_the_kit_and_the_chart(tmp_path: Path) -> None:
    resources = _overlay(tmp_path)
    assert not [r for r in resources if r["kind"] == "ConfigMap" and "runbook" in str(r)]
    kit_rule = one(resources, "PrometheusRule")
    urls = _urls(kit_rule)
    assert len(urls) >= 20
    for rule in (r for g in kit_rule["spec"]["groups"] for r in g["rules"] if "alert" in r):
        assert rule["annotations"]["runbook_url"] == f"{URL}#{rule['alert'].lower()}"
    chart_rule = one(
        render_chart({"prometheusRule": {"enabled": True, "runbookBaseURL": URL}}), "PrometheusRule"
    )
    assert chart_rule["spec"]["groups"] == kit_rule["spec"]["groups"]


def test_without_the_setting_the_links_are_the_generated_default() -> None:
    rule = yaml.safe_load((ROOT / "deploy/prometheusrule/prometheusrule.yaml").read_text())
    assert {u.partition("#")[0] for u in _urls(rule)} == {RUNBOOK_BASE}
