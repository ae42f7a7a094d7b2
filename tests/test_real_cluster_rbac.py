"""The kit's RBAC under the real authorizer (Kubernetes 1.36, `--authorization-mode=Node,RBAC`).

The ServiceAccount, ClusterRole and ClusterRoleBinding are applied exactly as the kit renders
them (kustomize: deploy/base + components/kubernetes-api) and as the Helm chart renders them
(`kubernetesApi.enabled`); the exporter's identity is a token from the TokenRequest API. The
authorizer's own answers (SelfSubjectRulesReview, SelfSubjectAccessReview) must match what
docs/kubernetes-api.md documents, nothing more; and each rule is needed: without it, the one
request of exporter/kubeapi that uses it is refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.kubeapi.client import ApiError, KubeApi, http_client, load_config
from tests.realcluster import rbac
from tests.realcluster.api import Api
from tests.realcluster.controlplane import NODE, ControlPlane
from tests.realcluster.daemons import wait_for

ROOT = Path(__file__).resolve().parent.parent
KIT_NS = "kube-device-exporter"
CHART_NS = "kde-chart"
WORK_NS = "kde-rbac"
DOCUMENTED = {
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("apps", "replicasets", "get"),
    ("batch", "jobs", "get"),
}
"""docs/kubernetes-api.md: "`list`, `watch` on pods, `get` on `apps/replicasets` and
`batch/jobs`. No `get` on pods and nothing written." (checked below against the file)."""
CALL_OF = {
    ("", "pods", "list"): "list pods",
    ("", "pods", "watch"): "watch pods",
    ("apps", "replicasets", "get"): "get ReplicaSet",
    ("batch", "jobs", "get"): "get Job",
}
"""The request of exporter/kubeapi/client.py that each rule lets through."""


class Setup:
    def __init__(self, plane: ControlPlane, tmp: Path) -> None:
        self.plane = plane
        self.admin = plane.admin()
        self.tmp = tmp
        self.kit = rbac.kit_objects()
        self.chart = rbac.chart_objects(CHART_NS, CHART_NS)
        for obj in rbac.identity(self.kit):
            self.admin.apply(obj)
        self.admin.apply(_namespace(CHART_NS))  # helm install --create-namespace
        for obj in rbac.identity(self.chart):
            self.admin.apply(obj)
        self.admin.apply(_namespace(WORK_NS))
        self.admin.apply({"apiVersion": "v1", "kind": "ServiceAccount",
                          "metadata": {"name": "baseline", "namespace": WORK_NS}})  # fmt: skip
        self.kit_api = self.admin.as_token(rbac.token(self.admin, KIT_NS, "kube-device-exporter"))
        chart_sa = _one(self.chart, "ServiceAccount")["metadata"]["name"]
        self.chart_api = self.admin.as_token(rbac.token(self.admin, CHART_NS, chart_sa))
        self.baseline = self.admin.as_token(rbac.token(self.admin, WORK_NS, "baseline"))
        self._owners()

    def _owners(self) -> None:
        """A Deployment (its ReplicaSet made by the real controller) and a Job of a CronJob."""
        self.admin.apply({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "train", "namespace": WORK_NS},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "train"}},
                     "template": {"metadata": {"labels": {"app": "train"}},
                                  "spec": {"containers": [{"name": "c", "image": "busybox"}]}}},
        })  # fmt: skip
        cronjob = self.admin.apply({
            "apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": "nightly", "namespace": WORK_NS},
            "spec": {"schedule": "0 3 * * *", "suspend": True, "jobTemplate": {"spec": {
                "template": {"spec": {"restartPolicy": "Never",
                                      "containers": [{"name": "c", "image": "busybox"}]}}}}},
        })  # fmt: skip
        self.job = self.admin.apply({  # what `kubectl create job --from=cronjob/nightly` makes
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "nightly-manual", "namespace": WORK_NS,
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob",
                                              "name": "nightly", "uid": cronjob["metadata"]["uid"],
                                              "controller": True}]},
            "spec": {"suspend": True, "template": {"spec": {
                "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}},
        })  # fmt: skip
        rs_path = f"/apis/apps/v1/namespaces/{WORK_NS}/replicasets"
        wait_for("the Deployment's ReplicaSet", lambda: bool(self.admin.get(rs_path)["items"]), 20)
        self.replicaset = self.admin.get(rs_path)["items"][0]

    def kubeconfig(self, api: Api, name: str) -> Path:
        assert api.token is not None
        return self.plane.token_kubeconfig(self.tmp / f"{name}.kubeconfig", api.token)

    def exporter_calls(self, kubeconfig: Path) -> dict[str, str]:
        """Each request the exporter's client makes, as "ok" or the HTTP code refusing it."""
        return asyncio.run(_calls(kubeconfig, self.replicaset["metadata"]["name"],
                                  self.job["metadata"]["name"]))  # fmt: skip


async def _calls(kubeconfig: Path, replicaset: str, job: str) -> dict[str, str]:
    api = KubeApi(http_client(load_config(kubeconfig), 5.0))
    out: dict[str, str] = {}

    async def attempt(name: str, call: Any) -> None:
        try:
            await call()
            out[name] = "ok"
        except ApiError as exc:
            out[name] = str(exc.code)

    async def watch() -> None:
        async for _ in api.watch_pods(NODE, "0", 1):
            break

    try:
        await attempt("list pods", lambda: api.list_pods(NODE))
        await attempt("watch pods", watch)
        await attempt(
            "get ReplicaSet", lambda: api.controller_of(WORK_NS, "ReplicaSet", replicaset)
        )
        await attempt("get Job", lambda: api.controller_of(WORK_NS, "Job", job))
    finally:
        await api.close()
    return out


def _namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def _one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


@pytest.fixture(scope="module")
def setup(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    yield Setup(control_plane, tmp_path_factory.mktemp("rbac"))


def test_docs_state_the_rules_the_test_expects() -> None:
    text = (ROOT / "docs" / "kubernetes-api.md").read_text()
    assert "`list`, `watch` on pods, `get` on `apps/replicasets` and `batch/jobs`. No `get` on pods and nothing written." in " ".join(text.split())  # fmt: skip


@pytest.mark.parametrize("source", ["kit", "chart"])
def test_rules_review_is_exactly_the_documented_rules(setup: Setup, source: str) -> None:
    api = setup.kit_api if source == "kit" else setup.chart_api
    base_rules, base_urls, _ = rbac.granted(setup.baseline, WORK_NS)
    for namespace in (WORK_NS, "kube-system", KIT_NS):
        rules, urls, incomplete = rbac.granted(api, namespace)
        assert not incomplete
        # Beyond what every authenticated identity may do (system:basic-user, discovery):
        assert rules - base_rules == DOCUMENTED, namespace
        assert urls == base_urls, namespace
    # The ServiceAccount itself mounts no token unless the pod asks (the DaemonSet does).
    sa = _one(setup.kit if source == "kit" else setup.chart, "ServiceAccount")
    assert sa["automountServiceAccountToken"] is False


@pytest.mark.parametrize("source", ["kit", "chart"])
def test_access_reviews_allow_what_it_needs_and_nothing_near_it(setup: Setup, source: str) -> None:
    api = setup.kit_api if source == "kit" else setup.chart_api
    for verb, resource, group in [("list", "pods", ""), ("watch", "pods", ""),
                                  ("get", "replicasets", "apps"), ("get", "jobs", "batch")]:  # fmt: skip
        assert rbac.allowed(api, verb, resource, group), (verb, resource)  # every namespace
        assert rbac.allowed(api, verb, resource, group, namespace=WORK_NS)
    refused = [
        ("get", "pods", ""), ("create", "pods", ""), ("delete", "pods", ""),
        ("patch", "pods", ""), ("get", "pods/log", ""), ("create", "pods/exec", ""),
        ("list", "nodes", ""), ("get", "nodes", ""), ("get", "nodes/proxy", ""),
        ("list", "secrets", ""), ("get", "secrets", ""), ("list", "configmaps", ""),
        ("list", "replicasets", "apps"), ("watch", "replicasets", "apps"),
        ("get", "deployments", "apps"), ("get", "statefulsets", "apps"),
        ("get", "daemonsets", "apps"), ("list", "jobs", "batch"), ("get", "cronjobs", "batch"),
        ("create", "serviceaccounts/token", ""), ("list", "resourceclaims", "resource.k8s.io"),
        ("list", "resourceslices", "resource.k8s.io"), ("create", "tokenreviews",
                                                         "authentication.k8s.io"),
    ]  # fmt: skip
    allowed = [r for r in refused if rbac.allowed(api, *r)]
    assert allowed == []


def test_the_exporters_requests_pass_under_the_kit(setup: Setup) -> None:
    for source, api in (("kit", setup.kit_api), ("chart", setup.chart_api)):
        assert setup.exporter_calls(setup.kubeconfig(api, source)) == dict.fromkeys(
            CALL_OF.values(), "ok"
        ), source
    # ...and the identity with no binding is refused each of them.
    assert setup.exporter_calls(setup.kubeconfig(setup.baseline, "baseline")) == dict.fromkeys(
        CALL_OF.values(), "403"
    )


def test_kit_and_chart_grant_the_same_rules() -> None:
    kit = rbac.rule_triples(_one(rbac.kit_objects(), "ClusterRole")["rules"])
    chart = rbac.rule_triples(_one(rbac.chart_objects(CHART_NS, CHART_NS), "ClusterRole")["rules"])
    assert kit == chart == DOCUMENTED


def test_every_rule_is_needed(setup: Setup) -> None:
    """Each (group, resource, verb) the kit grants, taken away alone: exactly the one request
    of the exporter that uses it is refused (403), every other still passes."""
    kit_rules = _one(setup.kit, "ClusterRole")["rules"]
    triples = sorted(rbac.rule_triples(kit_rules))
    assert set(triples) == set(CALL_OF), "a rule the exporter's requests do not use"
    for index, (group, resource, verb) in enumerate(triples):
        name = f"kde-minus-{index}"
        rest = sorted(set(triples) - {(group, resource, verb)})
        setup.admin.apply({"apiVersion": "v1", "kind": "ServiceAccount",
                           "metadata": {"name": name, "namespace": WORK_NS}})  # fmt: skip
        setup.admin.apply({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": [{"apiGroups": [g], "resources": [r], "verbs": [v]} for g, r, v in rest],
        })  # fmt: skip
        setup.admin.apply({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": WORK_NS}],
        })  # fmt: skip
        api = setup.admin.as_token(rbac.token(setup.admin, WORK_NS, name))
        calls = setup.exporter_calls(setup.kubeconfig(api, name))
        expected = dict.fromkeys(CALL_OF.values(), "ok") | {CALL_OF[(group, resource, verb)]: "403"}
        assert calls == expected, (group, resource, verb)
