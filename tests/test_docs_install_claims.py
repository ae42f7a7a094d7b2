"""Words that disagreed with the code (issue 31, items 12 and 13; item 10's dcgm row: tests/test_dcgm_schema.py): each claim is read
against what it describes, so the next change of either fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DEPLOY = (ROOT / "docs" / "deploy.md").read_text()


def _install_snippets(text: str) -> list[str]:
    return [
        block for block in re.findall(r"```sh\n(.*?)```", text, re.S) if "helm install" in block
    ]


def test_the_namespace_is_labelled_before_helm_installs_into_it() -> None:
    snippets = _install_snippets(README) + _install_snippets(DEPLOY)
    assert len(snippets) >= 2
    for block in snippets:
        assert "--create-namespace" not in block
        label = block.index("pod-security.kubernetes.io/enforce=privileged")
        assert block.index("kubectl create namespace") < label < block.index("helm install")


def test_deploy_md_says_kubernetes_api_brings_rbac() -> None:
    intro = DEPLOY.split("\n## ", 1)[0]
    assert "never calls\nthe Kubernetes API" not in intro
    assert "`--kubernetes.api`" in intro and "ClusterRole" in intro
    (openshift,) = [s for s in DEPLOY.split("\n## ") if s.startswith("6. OpenShift")]
    assert "This is the kit's only RBAC." not in openshift
    rbac = (ROOT / "deploy" / "components" / "kubernetes-api" / "rbac.yaml").read_text()
    for resource, verbs in (("pods", "list, watch"), ("replicasets", "get"), ("jobs", "get")):
        assert re.search(rf"resources: \[{resource}\]\n\s+verbs: \[{verbs}\]", rbac), resource
