"""deploy/helm/kube-device-exporter with the real Helm: `helm-python-sdk` embeds Helm v4's Go
library, so lint (strict), values-schema checks and rendering are Helm's own. Every rendered
core object validates for Kubernetes 1.30 and the newest schemas, custom resources against
the focused CRD schemas, and the DaemonSet equals the kustomize kit's for the same choices
(one source of truth, checked both ways)."""

from __future__ import annotations

import copy
import functools
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import pytest
import yaml

from monitoring.alerts import JOB, RUNBOOK_BASE
from tests import kit, kustomize
from tests.crd_schemas import SCHEMAS
from tests.support.manifests import (
    CHART,
    DEPLOY,
    NAMESPACE,
    RELEASE,
    ROOT,
    kit_with,
    one,
    render_chart,
    validate_all,
)

WEB_SECRET = "kube-device-exporter-web"

EVERYTHING = {
    "image": {"repository": "registry.example.com/gpu/kube-device-exporter", "tag": "0.1.0-rc1"},
    "imagePullSecrets": [{"name": "registry"}],
    "runtimeClassName": "nvidia",
    "priorityClassName": "gpu-monitoring",
    "kubernetesApi": {"enabled": True, "podLabels": "team"},
    "kubeletRootDir": "/var/lib/k0s/kubelet/",
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "nodeSelector": {"node-role.kubernetes.io/gpu": ""},
    "affinity": None,  # Helm drops a default map set to null
    "resources": {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"cpu": "1", "memory": "512Mi"},
    },
    "podAnnotations": {"example.com/team": "ml-platform"},
    "podLabels": {"team": "ml-platform"},
    "extraArgs": ["--collect-interval=5s"],
    "extraEnv": [{"name": "KDE_LOG_LEVEL", "value": "debug"}],
    "otlp": {"endpoint": "http://otel-collector.otel.svc:4317"},
    "webConfig": {"secretName": WEB_SECRET, "tls": True},
    "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "podMonitor": {"enabled": True, "metricRelabelings": [{"action": "labeldrop", "regex": "x"}]},
    "prometheusRule": {"enabled": True, "runbookBaseURL": "https://wiki.example.com/runbooks"},
    "dashboards": {"enabled": True, "namespace": "grafana"},
    "hostPID": True,
    "hostNetwork": True,
}
"""Every value away from its default."""


def test_chart_lints_clean_in_strict_mode() -> None:
    for values in ({}, EVERYTHING, {"gke": {"enabled": True}}):
        result = helm.lint(CHART, values, strict=True, kube_version="v1.30.0")
        assert result["errors"] == []
        # Severity 1 is Helm's INFO (only "icon is recommended"); 2 and up fail strict lint.
        assert [m for m in result["messages"] if m["severity"] > 1] == [], result["messages"]


def test_lint_rejects_values_the_schema_does_not_know() -> None:
    """The lint above can fail: a misspelt value and a bad type are schema errors."""
    for bad in ({"runtimeclassname": "nvidia"}, {"webConfig": {"tls": "yes"}},
                {"extraArgs": ["-v"]}):  # fmt: skip
        result = helm.lint(CHART, bad, strict=True, kube_version="v1.30.0")
        assert result["errors"] or any(m["severity"] > 1 for m in result["messages"]), bad


@functools.cache
def _rendered(key: str) -> list[dict[str, Any]]:
    return render_chart({"default": {}, "everything": EVERYTHING}[key])


@pytest.mark.parametrize("key", ["default", "everything"])
def test_every_rendered_object_validates(key: str) -> None:
    resources = copy.deepcopy(_rendered(key))
    validate_all(resources, key)
    kinds = sorted(r["kind"] for r in resources)
    if key == "default":
        assert kinds == ["DaemonSet", "Service", "ServiceAccount"]
    else:
        assert {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap"} <= set(kinds)


def test_validation_of_the_render_can_fail() -> None:
    daemonset = copy.deepcopy(one(_rendered("default"), "DaemonSet"))
    daemonset["spec"]["template"]["spec"]["priorityclassname"] = "x"
    with pytest.raises(AssertionError, match="priorityclassname"):
        validate_all([daemonset], "planted")


def test_daemonset_has_priority_and_gpu_tolerations() -> None:
    pod = one(_rendered("default"), "DaemonSet")["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert {"operator": "Exists"} in pod["tolerations"]
    assert "runtimeClassName" not in pod


def test_non_default_values_reach_the_objects() -> None:
    resources = _rendered("everything")
    ds = one(resources, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "registry.example.com/gpu/kube-device-exporter:0.1.0-rc1"
    assert pod["runtimeClassName"] == "nvidia" and pod["priorityClassName"] == "gpu-monitoring"
    assert pod["imagePullSecrets"] == [{"name": "registry"}]
    assert pod["nodeSelector"] == {"node-role.kubernetes.io/gpu": ""} and "affinity" not in pod
    assert pod["hostPID"] is True
    assert pod["tolerations"] == EVERYTHING["tolerations"]
    assert container["resources"] == EVERYTHING["resources"]
    assert ds["spec"]["template"]["metadata"]["annotations"] == EVERYTHING["podAnnotations"]
    assert ds["spec"]["template"]["metadata"]["labels"]["team"] == "ml-platform"
    assert container["args"] == [
        "--web.config.file=/etc/kube-device-exporter/web/web-config.yml",
        "--collect-interval=5s",
    ]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.otel.svc:4317"
    assert env["KDE_LOG_LEVEL"] == "debug"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["pod-resources"]["hostPath"]["path"] == "/var/lib/k0s/kubelet/pod-resources"
    assert volumes["web-config"]["secret"]["secretName"] == WEB_SECRET
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["scheme"] == "HTTPS"

    monitor = one(resources, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == {
        "ca": {"secret": {"name": WEB_SECRET, "key": "ca.crt"}},
        "serverName": f"{RELEASE}.{NAMESPACE}.svc",
    }
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert pod_labels[monitor["spec"]["jobLabel"]] == JOB
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (pod_endpoint,) = one(resources, "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert pod_endpoint["metricRelabelings"] == [{"action": "labeldrop", "regex": "x"}]


def test_rules_and_dashboards_are_the_kits() -> None:
    resources = _rendered("everything")
    rule = one(resources, "PrometheusRule")
    plain = yaml.safe_load(kit.RULES.read_text())["groups"]
    expected = yaml.safe_load(
        yaml.safe_dump(plain).replace(RUNBOOK_BASE, "https://wiki.example.com/runbooks")
    )
    assert rule["spec"]["groups"] == expected
    urls = [r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert urls and all(u.startswith("https://wiki.example.com/runbooks#") for u in urls)
    assert RUNBOOK_BASE in (CHART / "templates" / "prometheusrule.yaml").read_text()
    maps = [r for r in resources if r["kind"] == "ConfigMap"]
    boards = {stem: board for stem, board in kit.dashboards().items()}
    assert len(maps) == len(boards)
    for cm in maps:
        assert cm["metadata"]["namespace"] == "grafana"
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        ((key, text),) = cm["data"].items()
        stem = key.removeprefix("kube-device-exporter-").removesuffix(".json")
        assert yaml.safe_load(text) == boards[stem]


def test_packaged_chart_carries_the_stored_dashboards_and_rules(tmp_path: Path) -> None:
    """The chart's files/ are links to dashboards/ and deploy/alerts (the one stored copy);
    Helm follows them when it packages, so the archive holds the files themselves, and the
    packaged chart renders the same objects as the chart directory."""
    files = CHART / "files"
    assert (files / "dashboards").resolve() == kit.DASHBOARDS
    assert (files / "rules.yaml").resolve() == kit.RULES
    archive = Path(helm.package(CHART, destination=tmp_path))
    with tarfile.open(archive) as tar:
        packed = {
            m.name.removeprefix("kube-device-exporter/files/"): tar.extractfile(m)
            for m in tar.getmembers()
            if m.name.startswith("kube-device-exporter/files/")
        }
        texts = {name: f.read().decode() for name, f in packed.items() if f is not None}
    expected = {f"dashboards/{p.name}": p.read_text() for p in kit.DASHBOARDS.glob("*.json")}
    assert texts == {**expected, "rules.yaml": kit.RULES.read_text()}
    with helm.Chart.load(archive) as chart:
        out = chart.render(EVERYTHING, name=RELEASE, namespace=NAMESPACE, is_install=True)
    from_archive = [
        d for path, text in out.items() if path.endswith(".yaml")
        for d in yaml.safe_load_all(text) if d
    ]  # fmt: skip
    assert sorted(from_archive, key=kustomize.key) == sorted(
        _rendered("everything"), key=kustomize.key
    )


def test_chart_version_is_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["appVersion"] == version
    pod = one(_rendered("default"), "DaemonSet")["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == f"kube-device-exporter:{version}"


# --- one source of truth: the chart's DaemonSet is the kit's -------------------------------


def _pod_spec(resources: list[dict[str, Any]]) -> dict[str, Any]:
    """The DaemonSet's pod spec with named lists in name order (kustomize's patches put
    added items first, the chart last; order means nothing to Kubernetes here)."""
    spec: dict[str, Any] = copy.deepcopy(one(resources, "DaemonSet")["spec"]["template"]["spec"])
    spec["volumes"].sort(key=lambda v: v["name"])
    for container in spec["containers"]:
        for field in ("env", "volumeMounts"):
            container[field].sort(key=lambda v: v["name"])
    return spec


SAME_CHOICES: dict[str, tuple[dict[str, Any], str, tuple[str, ...]]] = {
    "toolkit as default runtime": ({}, "kube-prometheus-stack", ()),
    "GPU Operator with CDI": (
        {"runtimeClassName": "nvidia", "nodeSelector": {"nvidia.com/gpu.deploy.client": "true"}},
        "gpu-operator",
        (),
    ),
    "GKE": ({"gke": {"enabled": True}}, "gke", ()),
    "k0s": ({"kubeletRootDir": "/var/lib/k0s/kubelet"}, "k0s", ()),
    "TLS": (
        {"webConfig": {"secretName": WEB_SECRET, "tls": True}},
        "kube-prometheus-stack",
        ("web-config",),
    ),
    "OTLP": ({"otlp": {"endpoint": "http://opentelemetry-collector.opentelemetry.svc:4317"}},
             "otlp", ()),
    "Kubernetes API": ({"kubernetesApi": {"enabled": True}}, "kube-prometheus-stack",
                       ("kubernetes-api",)),
    "Pods API": ({"kubernetesApi": {"enabled": True, "podsApi": True}},
                 "kube-prometheus-stack", ("kubernetes-api", "pods-api")),
    "Kubernetes Events": ({"kubernetesEvents": {"enabled": True}}, "kube-prometheus-stack",
                          ("kubernetes-events",)),
    "hostPID": ({"hostPID": True}, "kube-prometheus-stack", ("host-pid",)),
    "hostNetwork": ({"hostNetwork": True}, "kube-prometheus-stack", ("host-network",)),
    "dcgm schema": ({"metricsSchema": "native,dcgm"}, "kube-prometheus-stack",
                    ("dcgm-schema",)),
}  # fmt: skip


@pytest.mark.peer
@pytest.mark.parametrize("choice", sorted(SAME_CHOICES))
def test_chart_and_kit_render_the_same_daemonset(tmp_path: Path, choice: str) -> None:
    values, overlay, components = SAME_CHOICES[choice]
    ours = render_chart(values)
    theirs = kit_with(tmp_path, overlay, *components)
    assert _pod_spec(ours) == _pod_spec(theirs)
    assert (
        one(ours, "DaemonSet")["spec"]["updateStrategy"]
        == one(theirs, "DaemonSet")["spec"]["updateStrategy"]
    )
    if choice == "GKE":
        quotas = [one(x, "ResourceQuota")["spec"] for x in (ours, theirs)]
        assert quotas[0] == quotas[1]
    env = {e["name"]: e.get("value") for e in _pod_spec(ours)["containers"][0]["env"]}
    assert env.get("KDE_METRICS_SCHEMA") == ("native,dcgm" if choice == "dcgm schema" else None)
    rbac = ("ClusterRole", "ClusterRoleBinding")
    if choice in ("Kubernetes API", "Pods API", "Kubernetes Events"):
        assert one(ours, "ClusterRole")["rules"] == one(theirs, "ClusterRole")["rules"]
        binding = [one(x, "ClusterRoleBinding") for x in (ours, theirs)]
        assert binding[0]["subjects"] == binding[1]["subjects"]
        assert binding[0]["roleRef"] == binding[1]["roleRef"]
        assert _pod_spec(ours)["automountServiceAccountToken"] is True
    else:  # no token, no RBAC unless asked for
        assert not [r for r in ours + theirs if r["kind"] in rbac]
        assert _pod_spec(ours)["automountServiceAccountToken"] is False


@pytest.mark.peer
def test_dcgm_schema_monitors_honor_labels(tmp_path: Path) -> None:
    """The dcgm schema's holder labels are pod/namespace/container: both monitors must
    honor them (otherwise exported_pod...); the native schema keeps honorLabels false."""
    sm = {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}

    def honor(resources: list[dict[str, Any]]) -> list[bool]:
        service = one(resources, "ServiceMonitor")["spec"]["endpoints"]
        pod = [r for r in resources if r["kind"] == "PodMonitor"]
        pods = pod[0]["spec"]["podMetricsEndpoints"] if pod else []
        return [e["honorLabels"] for e in (*service, *pods)]

    assert honor(render_chart({**sm, "metricsSchema": "native,dcgm"})) == [True, True]
    assert honor(render_chart({**sm, "metricsSchema": "dcgm"})) == [True, True]
    assert honor(render_chart(sm)) == [False, False]
    assert honor(kit_with(tmp_path, "kube-prometheus-stack", "dcgm-schema")) == [True]
    plain = tmp_path / "plain"
    plain.mkdir()
    assert honor(kit_with(plain, "kube-prometheus-stack")) == [False]


def test_kubernetes_api_pod_labels_value() -> None:
    values = {"kubernetesApi": {"enabled": True, "podLabels": r"team|app\.kubernetes\.io/name"}}
    env = {
        e["name"]: e.get("value") for e in _pod_spec(render_chart(values))["containers"][0]["env"]
    }
    assert env["KDE_KUBERNETES_API"] == "true"
    assert env["KDE_KUBERNETES_POD_LABELS"] == r"team|app\.kubernetes\.io/name"


def test_kubernetes_events_grant_create_on_events_only() -> None:
    ours = render_chart({"kubernetesEvents": {"enabled": True}})
    assert one(ours, "ClusterRole")["rules"] == [
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}
    ]
    env = {e["name"]: e.get("value") for e in _pod_spec(ours)["containers"][0]["env"]}
    assert env["KDE_KUBERNETES_EVENTS"] == "true"
    both = render_chart({"kubernetesEvents": {"enabled": True}, "kubernetesApi": {"enabled": True}})
    roles = sorted(r["metadata"]["name"] for r in both if r["kind"] == "ClusterRole")
    assert roles == [f"{RELEASE}-kubernetes-api", f"{RELEASE}-kubernetes-events"]


@pytest.mark.peer
def test_drift_is_caught() -> None:
    """The comparison above can fail: a chart value that changes the pod shows up."""
    base = _pod_spec(kustomize.build(DEPLOY / "overlays" / "kube-prometheus-stack"))
    assert _pod_spec(render_chart({"resources": {"limits": {"memory": "1Gi"}}})) != base
    assert _pod_spec(render_chart()) == base


def test_values_schema_is_a_valid_schema() -> None:
    schema = yaml.safe_load((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.validate(yaml.safe_load((CHART / "values.yaml").read_text()), schema)
    assert SCHEMAS  # the CRD schemas validate the chart's custom resources too
