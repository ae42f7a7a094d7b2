"""The exporter's identity and RBAC exactly as users deploy it, and what the authorizer says.

`kit_objects()` is the kustomize output of deploy/base with the component that adds rules
(`components/kubernetes-api`); `chart_objects()` is the Helm chart's render with
`kubernetesApi.enabled` (Helm's own library, helm-python-sdk). `granted()` turns a
SelfSubjectRulesReview into (apiGroup, resource, verb) triples, the form the tests compare.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

from tests import kustomize
from tests.realcluster.api import Api

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "kube-device-exporter"
IDENTITY_KINDS = ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                  "Role", "RoleBinding")  # fmt: skip

Triple = tuple[str, str, str]


DRA_KIT_NS = "kde-dra-kit"


def kit_objects(*, dra: bool = False) -> list[dict[str, Any]]:
    """deploy/base + components/kubernetes-api (+ components/dra), as `kubectl kustomize`
    renders them. With DRA, in a namespace of its own and with a name prefix (kustomize's
    own transformers, as a user's overlay would), so both identities live in one cluster."""
    with tempfile.TemporaryDirectory(prefix="kde-kit-") as tmp:
        mine = Path(tmp)
        components = ["kubernetes-api", *(["dra"] if dra else [])]
        doc: dict[str, Any] = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [os.path.relpath(DEPLOY / "base", mine)],
            "components": [os.path.relpath(DEPLOY / "components" / c, mine) for c in components],
        }
        if dra:
            doc |= {"namespace": DRA_KIT_NS, "namePrefix": "dra-"}
        (mine / "kustomization.yaml").write_text(yaml.safe_dump(doc))
        return kustomize.build(mine)


def chart_objects(release: str, namespace: str, *, dra: bool = False) -> list[dict[str, Any]]:
    """The chart with `kubernetesApi.enabled: true` (and `.dra`), as `helm template` renders it."""
    with helm.Chart.load(CHART) as chart:
        out = chart.render({"kubernetesApi": {"enabled": True, "dra": dra}}, name=release,
                           namespace=namespace, is_install=True)  # fmt: skip
    docs: list[dict[str, Any]] = []
    for path, text in sorted(out.items()):
        if path.endswith(".yaml"):
            docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def cluster_rules(objects: list[dict[str, Any]]) -> set[Triple]:
    """Every rule of every ClusterRole among `objects`."""
    return {t for o in objects if o["kind"] == "ClusterRole" for t in rule_triples(o["rules"])}


def identity(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Namespace, ServiceAccount and RBAC objects, in an order the API accepts."""
    return sorted(
        (o for o in objects if o["kind"] in IDENTITY_KINDS),
        key=lambda o: IDENTITY_KINDS.index(o["kind"]),
    )


def rule_triples(rules: list[dict[str, Any]]) -> set[Triple]:
    """(apiGroup, resource, verb) for every combination a PolicyRule list grants."""
    return {
        (group, resource, verb)
        for rule in rules
        if not rule.get("resourceNames") and not rule.get("nonResourceURLs")
        for group in rule.get("apiGroups") or ()
        for resource in rule.get("resources") or ()
        for verb in rule.get("verbs") or ()
    }


def granted(api: Api, namespace: str) -> tuple[set[Triple], set[tuple[str, str]], bool]:
    """What `api`'s identity may do in `namespace`: resource triples, (URL, verb) pairs of
    non-resource rules, and whether the answer is incomplete (an authorizer that cannot
    list rules says so; RBAC can)."""
    review = api.request(
        "POST",
        "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
        {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview",
         "spec": {"namespace": namespace}},
    )  # fmt: skip
    status = review["status"]
    resources = rule_triples(status.get("resourceRules") or [])
    urls = {
        (url, verb)
        for rule in status.get("nonResourceRules") or []
        for url in rule.get("nonResourceURLs") or ()
        for verb in rule.get("verbs") or ()
    }
    return resources, urls, bool(status.get("incomplete"))


def allowed(api: Api, verb: str, resource: str, group: str = "", namespace: str = "") -> bool:
    """A SelfSubjectAccessReview: may `api`'s identity do it (namespace "" = all)?"""
    attributes = {"verb": verb, "resource": resource, "group": group}
    if namespace:
        attributes["namespace"] = namespace
    review = api.request(
        "POST",
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
         "spec": {"resourceAttributes": attributes}},
    )  # fmt: skip
    return bool(review["status"].get("allowed"))


def token(api: Api, namespace: str, account: str, seconds: int = 3600) -> str:
    """A bound ServiceAccount token from the TokenRequest API (what a pod's projected
    volume holds)."""
    answer = api.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
         "spec": {"expirationSeconds": seconds}},
    )  # fmt: skip
    return str(answer["status"]["token"])


def install_kit(admin: Api, *, dra: bool = False) -> str:
    """Apply the kit's Namespace, ServiceAccount and RBAC; a token of its ServiceAccount."""
    objects = identity(kit_objects(dra=dra))
    for obj in objects:
        admin.apply(obj)
    (account,) = [o["metadata"] for o in objects if o["kind"] == "ServiceAccount"]
    return token(admin, account["namespace"], account["name"])
