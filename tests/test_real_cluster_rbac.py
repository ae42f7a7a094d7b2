"""The kit's RBAC under the real authorizer (Kubernetes 1.36, `--authorization-mode=Node,RBAC`).

The ServiceAccount, ClusterRole and ClusterRoleBinding are applied exactly as the kit renders
them (kustomize: deploy/base + components/kubernetes-api, and + components/dra) and as the Helm
chart renders them (`kubernetesApi.enabled`, and `.dra`); the exporter's identity is a token
from the TokenRequest API. The
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

from exporter.dra.claimread import CLAIMS_PATH
from exporter.dra.slicewatch import RULES_PATH, SLICES_PATH
from exporter.kubeapi.client import ApiError, KubeApi, http_client, load_config
from tests.realcluster import rbac
from tests.realcluster.api import Api
from tests.realcluster.controlplane import NODE, ControlPlane
from tests.realcluster.daemons import wait_for

pytestmark = pytest.mark.peer

ROOT = Path(__file__).resolve().parent.parent
KIT_NS = "kube-device-exporter"
CHART_NS = "kde-chart"
CHART_DRA_NS = "kde-chart-dra"
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
DRA_RULES = {
    ("resource.k8s.io", "resourceslices", "list"),
    ("resource.k8s.io", "resourceslices", "watch"),
    ("resource.k8s.io", "devicetaintrules", "list"),
    ("resource.k8s.io", "resourceclaims", "get"),
}
"""docs/dra.md: the dra component's rules, on top of DOCUMENTED."""
DRA_CALL_OF = {
    ("resource.k8s.io", "resourceslices", "list"): "list ResourceSlices",
    ("resource.k8s.io", "resourceslices", "watch"): "watch ResourceSlices",
    ("resource.k8s.io", "devicetaintrules", "list"): "list DeviceTaintRules",
    ("resource.k8s.io", "resourceclaims", "get"): "get ResourceClaim",
}
"""The request of exporter/dra/slicewatch.py and claimread.py that each DRA rule lets through
(the claims' health comes from the pod watch, with the kubernetes-api component's rules)."""
SOURCES = ["kit", "chart", "kit-dra", "chart-dra"]


class Setup:
    def __init__(self, plane: ControlPlane, tmp: Path) -> None:
        self.plane = plane
        self.admin = plane.admin()
        self.tmp = tmp
        self.kit = rbac.kit_objects()
        self.chart = rbac.chart_objects(CHART_NS, CHART_NS)
        self.kit_dra = rbac.kit_objects(dra=True)
        self.chart_dra = rbac.chart_objects(CHART_DRA_NS, CHART_DRA_NS, dra=True)
        for obj in rbac.identity(self.kit) + rbac.identity(self.kit_dra):
            self.admin.apply(obj)
        for namespace, objects in ((CHART_NS, self.chart), (CHART_DRA_NS, self.chart_dra)):
            self.admin.apply(_namespace(namespace))  # helm install --create-namespace
            for obj in rbac.identity(objects):
                self.admin.apply(obj)
        self.admin.apply(_namespace(WORK_NS))
        self.admin.apply({"apiVersion": "v1", "kind": "ServiceAccount",
                          "metadata": {"name": "baseline", "namespace": WORK_NS}})  # fmt: skip
        self.kit_api = self.admin.as_token(rbac.token(self.admin, KIT_NS, "kube-device-exporter"))
        chart_sa = _one(self.chart, "ServiceAccount")["metadata"]["name"]
        self.chart_api = self.admin.as_token(rbac.token(self.admin, CHART_NS, chart_sa))
        self.baseline = self.admin.as_token(rbac.token(self.admin, WORK_NS, "baseline"))
        kit_dra_sa = _one(self.kit_dra, "ServiceAccount")["metadata"]
        self.kit_dra_api = self.admin.as_token(
            rbac.token(self.admin, kit_dra_sa["namespace"], kit_dra_sa["name"])
        )
        chart_dra_sa = _one(self.chart_dra, "ServiceAccount")["metadata"]["name"]
        self.chart_dra_api = self.admin.as_token(rbac.token(self.admin, CHART_DRA_NS, chart_dra_sa))
        self._owners()

    def api_of(self, source: str) -> Api:
        return {"kit": self.kit_api, "chart": self.chart_api, "kit-dra": self.kit_dra_api,
                "chart-dra": self.chart_dra_api}[source]  # fmt: skip

    def objects_of(self, source: str) -> list[dict[str, Any]]:
        return {"kit": self.kit, "chart": self.chart, "kit-dra": self.kit_dra,
                "chart-dra": self.chart_dra}[source]  # fmt: skip

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

    def exporter_calls(self, kubeconfig: Path, *, dra: bool = False) -> dict[str, str]:
        """Each request the exporter's client makes, as "ok" or the HTTP code refusing it."""
        return asyncio.run(_calls(kubeconfig, self.replicaset["metadata"]["name"],
                                  self.job["metadata"]["name"], dra=dra))  # fmt: skip


async def _calls(kubeconfig: Path, replicaset: str, job: str, *, dra: bool) -> dict[str, str]:
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
        if dra:
            await _dra_calls(api, attempt)
    finally:
        await api.close()
    return out


async def _dra_calls(api: KubeApi, attempt: Any) -> None:
    """The requests of exporter/dra/slicewatch.py and claimread.py, as they make them."""
    selector = {"fieldSelector": f"spec.nodeName={NODE}"}

    async def watch_slices() -> None:
        async for _ in api.watch_objects("resourceslices", SLICES_PATH, selector, 1):
            break

    async def list_rules() -> None:
        try:
            await api.list_objects("devicetaintrules", RULES_PATH, {})
        except ApiError as exc:
            # Not served without --runtime-config=resource.k8s.io/v1beta2=true (control-plane.md
            # DRA item 8): a 404 comes only after the authorizer let the request through.
            if exc.code != 404:
                raise

    await attempt("list ResourceSlices",
                  lambda: api.list_objects("resourceslices", SLICES_PATH, selector))  # fmt: skip
    await attempt("watch ResourceSlices", watch_slices)
    await attempt("list DeviceTaintRules", list_rules)

    async def get_claim() -> None:
        try:
            await api.get_object("resourceclaims", CLAIMS_PATH.format(namespace=WORK_NS,
                                                                      name="absent"))  # fmt: skip
        except ApiError as exc:
            if exc.code != 404:  # none by that name: the authorizer let it through
                raise

    await attempt("get ResourceClaim", get_claim)


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


def test_docs_state_the_dra_rules() -> None:
    text = " ".join((ROOT / "docs" / "dra.md").read_text().split())
    assert "`list`, `watch` on `resource.k8s.io/resourceslices`, `list` on `resource.k8s.io/devicetaintrules`, `get` on `resource.k8s.io/resourceclaims`. Nothing written." in text  # fmt: skip


def _expected(source: str) -> set[tuple[str, str, str]]:
    return DOCUMENTED | (DRA_RULES if source.endswith("-dra") else set())


@pytest.mark.parametrize("source", SOURCES)
def test_rules_review_is_exactly_the_documented_rules(setup: Setup, source: str) -> None:
    api = setup.api_of(source)
    base_rules, base_urls, _ = rbac.granted(setup.baseline, WORK_NS)
    for namespace in (WORK_NS, "kube-system", KIT_NS):
        rules, urls, incomplete = rbac.granted(api, namespace)
        assert not incomplete
        # Beyond what every authenticated identity may do (system:basic-user, discovery):
        assert rules - base_rules == _expected(source), namespace
        assert urls == base_urls, namespace
    # The ServiceAccount itself mounts no token unless the pod asks (the DaemonSet does).
    sa = _one(setup.objects_of(source), "ServiceAccount")
    assert sa["automountServiceAccountToken"] is False


@pytest.mark.parametrize("source", SOURCES)
def test_access_reviews_allow_what_it_needs_and_nothing_near_it(setup: Setup, source: str) -> None:
    api = setup.api_of(source)
    for group, resource, verb in sorted(_expected(source)):
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
        ("get", "resourceslices", "resource.k8s.io"), ("create", "resourceslices", "resource.k8s.io"),
        ("update", "resourceslices", "resource.k8s.io"), ("delete", "resourceslices", "resource.k8s.io"),
        ("watch", "devicetaintrules", "resource.k8s.io"), ("create", "devicetaintrules", "resource.k8s.io"),
        ("get", "resourceclaims", "resource.k8s.io"), ("update", "resourceclaims/status", "resource.k8s.io"),
        ("list", "deviceclasses", "resource.k8s.io"), ("update", "pods/status", ""),
    ]  # fmt: skip
    granted = {(v, r, g) for g, r, v in _expected(source)}
    allowed = [r for r in refused if r not in granted and rbac.allowed(api, *r)]
    assert [r for r in refused if r in granted] == (
        [("list", "resourceslices", "resource.k8s.io"), ("get", "resourceclaims", "resource.k8s.io")]
        if source.endswith("-dra") else []
    )  # fmt: skip
    assert allowed == []


def test_the_exporters_requests_pass_under_the_kit(setup: Setup) -> None:
    every = list(CALL_OF.values()) + list(DRA_CALL_OF.values())
    for source in SOURCES:
        dra = source.endswith("-dra")
        calls = setup.exporter_calls(setup.kubeconfig(setup.api_of(source), source), dra=True)
        expected = dict.fromkeys(every, "ok")
        if not dra:  # without the component, each DRA request is refused
            expected |= dict.fromkeys(DRA_CALL_OF.values(), "403")
        assert calls == expected, source
    # ...and the identity with no binding is refused each of them.
    baseline = setup.exporter_calls(setup.kubeconfig(setup.baseline, "baseline"), dra=True)
    assert baseline == dict.fromkeys(every, "403")


def test_kit_and_chart_grant_the_same_rules() -> None:
    kit = rbac.cluster_rules(rbac.kit_objects())
    chart = rbac.cluster_rules(rbac.chart_objects(CHART_NS, CHART_NS))
    assert kit == chart == DOCUMENTED
    kit_dra = rbac.cluster_rules(rbac.kit_objects(dra=True))
    chart_dra = rbac.cluster_rules(rbac.chart_objects(CHART_DRA_NS, CHART_DRA_NS, dra=True))
    assert kit_dra == chart_dra == DOCUMENTED | DRA_RULES


def test_every_rule_is_needed(setup: Setup) -> None:
    """Each (group, resource, verb) the kit grants (with the dra component), taken away alone:
    exactly the one request of the exporter that uses it is refused (403), every other still
    passes."""
    triples = sorted(rbac.cluster_rules(setup.kit_dra))
    call_of = CALL_OF | DRA_CALL_OF
    assert set(triples) == set(call_of), "a rule the exporter's requests do not use"
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
        calls = setup.exporter_calls(setup.kubeconfig(api, name), dra=True)
        expected = dict.fromkeys(call_of.values(), "ok") | {call_of[(group, resource, verb)]: "403"}
        assert calls == expected, (group, resource, verb)
