"""deploy/: every kustomization renders, every resource validates offline against the
Kubernetes 1.33 schemas (custom resources against focused CRD schemas), yamllint passes,
and the DaemonSet keeps the security and wiring the exporter relies on."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from exporter.cli import env_name, parse_config
from exporter.config import DEFAULT_LISTEN, DEFAULT_SOCKET
from monitoring.alerts import JOB
from tests import kustomize
from tests.crd_schemas import SCHEMAS

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
KUBERNETES_VERSION = "1.33.0"
KUSTOMIZATIONS = sorted(p.parent for p in DEPLOY.rglob("kustomization.yaml"))
OVERLAYS = sorted(p for p in (DEPLOY / "overlays").iterdir() if p.is_dir())
NAMES = [str(p.relative_to(DEPLOY)) for p in KUSTOMIZATIONS]
KUBELET_ROOTS = {
    "kube-prometheus-stack": "/var/lib/kubelet",
    "podmonitor": "/var/lib/kubelet",
    "otlp": "/var/lib/kubelet",
    "openshift": "/var/lib/kubelet",
    "microk8s": "/var/snap/microk8s/common/var/lib/kubelet",
    "k0s": "/var/lib/k0s/kubelet",
    "web-config": "/var/lib/kubelet",
}


def test_yamllint_passes() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "yamllint", "--strict", "-c", str(ROOT / ".yamllint"),
         "deploy", ".yamllint"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=NAMES)
def test_kustomization_references_exist(directory: Path) -> None:
    refs = kustomize.references(directory)
    assert refs
    for ref in refs:
        assert ref.exists(), f"{directory}: {ref} does not exist"
        if ref.is_dir():
            assert (ref / "kustomization.yaml").is_file(), f"{ref} has no kustomization.yaml"


def test_every_overlay_is_documented_and_known() -> None:
    assert {p.name for p in OVERLAYS} == set(KUBELET_ROOTS)
    docs = (ROOT / "docs" / "deploy.md").read_text()
    for overlay in OVERLAYS:
        assert f"deploy/overlays/{overlay.name}" in docs


def _validate(resource: dict[str, Any]) -> None:
    schema = SCHEMAS.get(resource["kind"])
    if schema is not None:
        jsonschema.validate(resource, schema)
    else:
        kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=NAMES)
def test_resources_validate_offline(directory: Path) -> None:
    resources = kustomize.build(directory)
    assert resources
    for resource in resources:
        try:
            _validate(resource)
        except Exception as exc:
            raise AssertionError(f"{directory}: {kustomize.key(resource)}: {exc}") from exc


def test_validation_rejects_a_bad_field() -> None:
    """The validators above can fail: a misspelt field is an error, in core kinds and CRDs."""
    (daemonset,) = [r for r in _rendered("kube-prometheus-stack") if r["kind"] == "DaemonSet"]
    daemonset["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, KUBERNETES_VERSION, strict=True)
    (monitor,) = [r for r in _rendered("kube-prometheus-stack") if r["kind"] == "ServiceMonitor"]
    monitor["spec"]["endpoints"][0]["honorlabels"] = False
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(monitor, SCHEMAS["ServiceMonitor"])


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="no kubectl to compare with")
@pytest.mark.parametrize("overlay", OVERLAYS, ids=[p.name for p in OVERLAYS])
def test_renderer_matches_kubectl_kustomize(overlay: Path) -> None:
    done = subprocess.run(
        ["kubectl", "kustomize", str(overlay)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0 and "unknown command" in done.stderr:
        pytest.skip("kubectl without kustomize")
    assert done.returncode == 0, done.stderr
    theirs = {kustomize.key(d): d for d in yaml.safe_load_all(done.stdout) if d}
    ours = {kustomize.key(d): d for d in kustomize.build(overlay)}
    assert ours == theirs


# --- what the exporter relies on ---------------------------------------------------------


def _rendered(overlay: str) -> list[dict[str, Any]]:
    return kustomize.build(DEPLOY / "overlays" / overlay)


def _one(resources: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [r for r in resources if r["kind"] == kind]
    return found


@pytest.mark.parametrize("overlay", sorted(KUBELET_ROOTS))
def test_daemonset_is_locked_down_and_wired(overlay: str) -> None:
    resources = _rendered(overlay)
    ds = _one(resources, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["privileged"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["hostPID"] is False and pod["hostNetwork"] is False
    assert pod["automountServiceAccountToken"] is False
    assert pod["tolerations"] and pod["affinity"]["nodeAffinity"]

    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    values = {k: v["value"] for k, v in env.items() if "value" in v}
    web_config = values.pop(env_name("--web.config.file"), None)  # a file only the pod has
    config = parse_config([], env=values | {"NODE_NAME": "n1"})
    assert config.node_name == "n1"
    assert str(config.sysfs) == "/host/sys" and str(config.procfs) == "/host/proc"
    assert config.kubelet_socket == DEFAULT_SOCKET
    assert env_name("--path.sysfs") in env and env_name("--kubelet-socket") in env

    (port,) = container["ports"]
    assert port["containerPort"] == DEFAULT_LISTEN[1] and port["name"] == "metrics"
    scheme = {"scheme": "HTTPS"} if overlay == "web-config" else {}
    for probe, path in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"),
                        ("readinessProbe", "/readyz")):  # fmt: skip
        assert container[probe]["httpGet"] == {"path": path, "port": "metrics", **scheme}
    if overlay == "web-config":
        mounted = {m["mountPath"] for m in container["volumeMounts"]}
        assert web_config is not None and str(Path(web_config).parent) in mounted
    else:
        assert web_config is None
    assert set(container["resources"]) == {"requests", "limits"}

    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for name in ("pod-resources", "sys", "proc", "pod-logs"):
        assert mounts[name]["readOnly"] is True, name
        assert volumes[name]["hostPath"]["type"] == "Directory", name
    assert mounts["pod-resources"]["mountPath"] == str(DEFAULT_SOCKET.parent)
    root = KUBELET_ROOTS[overlay]
    assert volumes["pod-resources"]["hostPath"]["path"] == f"{root}/pod-resources"


@pytest.mark.parametrize("overlay", sorted(KUBELET_ROOTS))
def test_scraping_keeps_target_labels_and_job(overlay: str) -> None:
    resources = _rendered(overlay)
    kinds = {r["kind"] for r in resources}
    monitors = [r for r in resources if r["kind"] in ("ServiceMonitor", "PodMonitor")]
    if overlay == "otlp":
        assert not monitors and "PrometheusRule" not in kinds
        env = {e["name"] for e in _one(resources, "DaemonSet")["spec"]["template"]["spec"][
            "containers"][0]["env"]}  # fmt: skip
        assert "OTEL_EXPORTER_OTLP_ENDPOINT" in env
        return
    (monitor,) = monitors
    pod_labels = _one(resources, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pod_labels[monitor["spec"]["jobLabel"]] == JOB
    endpoints = monitor["spec"].get("endpoints") or monitor["spec"]["podMetricsEndpoints"]
    for endpoint in endpoints:
        assert endpoint["honorLabels"] is False
        assert endpoint["port"] == "metrics"
    if monitor["kind"] == "ServiceMonitor":
        service = _one(resources, "Service")
        assert service["spec"]["selector"].items() <= pod_labels.items()
        assert [p["name"] for p in service["spec"]["ports"]] == ["metrics"]
    assert "PrometheusRule" in kinds


def test_rbac_only_where_a_feature_needs_it() -> None:
    rbac = {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}
    for overlay in KUBELET_ROOTS:
        kinds = {r["kind"] for r in _rendered(overlay)}
        if overlay == "openshift":
            assert {"SecurityContextConstraints", "ClusterRole", "RoleBinding"} <= kinds
        else:
            assert not kinds & rbac, overlay
