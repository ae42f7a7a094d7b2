"""deploy/: every kustomization and component renders with the real kustomize (`kubectl
kustomize`, kustomize v5), every resource validates offline against the Kubernetes 1.30 and
newest schemas (custom resources against focused CRD schemas), yamllint passes, and the
DaemonSet keeps the security, scheduling and NVML wiring the exporter relies on."""

from __future__ import annotations

import copy
import functools
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from exporter.cli.flags import parse_config
from exporter.cli.parser import env_name
from exporter.settings.config import DEFAULTS
from exporter.settings.table import default_of
from monitoring.alerts import JOB
from tests import kustomize
from tests.crd_schemas import SCHEMAS
from tests.support.manifests import DEPLOY, KUBERNETES_VERSIONS, ROOT, kit_with, one, validate_all

pytestmark = pytest.mark.peer


def _kind(directory: Path) -> str:
    return str(yaml.safe_load((directory / "kustomization.yaml").read_text())["kind"])


_ALL = sorted(p.parent for p in DEPLOY.rglob("kustomization.yaml") if "helm" not in p.parts)
KUSTOMIZATIONS = [d for d in _ALL if _kind(d) == "Kustomization"]
COMPONENTS = [d for d in _ALL if _kind(d) == "Component"]
OVERLAYS = sorted(p for p in (DEPLOY / "overlays").iterdir() if p.is_dir())
NAMES = [str(p.relative_to(DEPLOY)) for p in KUSTOMIZATIONS]
KUBELET_ROOTS = {
    "kube-prometheus-stack": "/var/lib/kubelet",
    "gpu-operator": "/var/lib/kubelet",
    "gpu-operator-exporter-only": "/var/lib/kubelet",
    "gke": "/var/lib/kubelet",
    "podmonitor": "/var/lib/kubelet",
    "otlp": "/var/lib/kubelet",
    "openshift": "/var/lib/kubelet",
    "microk8s": "/var/snap/microk8s/common/var/lib/kubelet",
    "k0s": "/var/lib/k0s/kubelet",
    "web-config": "/var/lib/kubelet",
}
GKE_DRIVER = "/home/kubernetes/bin/nvidia"


def test_yamllint_passes() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "yamllint", "--strict", "-c", str(ROOT / ".yamllint"),
         "deploy", "dashboards", ".yamllint"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_real_kustomize_is_v5() -> None:
    """kubectl 1.20's kustomize (v2) cannot build the overlays; the docs say which is needed."""
    assert kustomize.version().startswith("v5.")
    assert "kubectl 1.27" in (ROOT / "docs" / "deploy.md").read_text()


def test_every_overlay_and_component_is_documented_and_known() -> None:
    assert {p.name for p in OVERLAYS} == set(KUBELET_ROOTS)
    docs = (ROOT / "docs" / "deploy.md").read_text()
    for directory in OVERLAYS + COMPONENTS:
        assert str(directory.relative_to(ROOT)) in docs, directory


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=NAMES)
def test_resources_validate_offline(directory: Path) -> None:
    if directory.parent.name == "overlays":
        validate_all(_rendered(directory.name), directory)
    else:
        validate_all(kustomize.build(directory), directory)


@pytest.mark.parametrize("base", ["kube-prometheus-stack", "podmonitor"])
def test_components_render_and_validate_together(tmp_path: Path, base: str) -> None:
    resources = kit_with(tmp_path, base, *COMPONENTS)
    validate_all(resources, COMPONENTS)


def test_kustomize_errors_are_errors(tmp_path: Path) -> None:
    """A broken kustomization fails the build instead of rendering less."""
    with pytest.raises(kustomize.KustomizeError, match="missing"):
        kit_with(tmp_path, "kube-prometheus-stack", DEPLOY / "components" / "missing")


def test_validation_rejects_a_bad_field() -> None:
    """The validators above can fail: a misspelt field is an error, in core kinds and CRDs,
    and the SCC without `priority` is rejected as OpenShift's schema does."""
    (daemonset,) = [r for r in _rendered("kube-prometheus-stack") if r["kind"] == "DaemonSet"]
    daemonset["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, KUBERNETES_VERSIONS[0], strict=True)
    (monitor,) = [r for r in _rendered("kube-prometheus-stack") if r["kind"] == "ServiceMonitor"]
    monitor["spec"]["endpoints"][0]["honorlabels"] = False
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(monitor, SCHEMAS["ServiceMonitor"])
    scc = one(_rendered("openshift"), "SecurityContextConstraints")
    del scc["priority"]
    with pytest.raises(jsonschema.ValidationError, match="priority"):
        jsonschema.validate(scc, SCHEMAS["SecurityContextConstraints"])


# --- what the exporter relies on ---------------------------------------------------------


@functools.cache
def _build(overlay: str) -> list[dict[str, Any]]:
    return kustomize.build(DEPLOY / "overlays" / overlay)


def _rendered(overlay: str) -> list[dict[str, Any]]:
    """The overlay as `kubectl kustomize` renders it (run once; each caller gets a copy)."""
    return copy.deepcopy(_build(overlay))


@pytest.mark.parametrize("overlay", sorted(KUBELET_ROOTS))
def test_daemonset_is_locked_down_and_wired(overlay: str) -> None:
    resources = _rendered(overlay)
    ds = one(resources, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    # Only GKE, which has no container toolkit, needs the host's device nodes.
    assert security["privileged"] is (overlay == "gke")
    assert security["allowPrivilegeEscalation"] is (overlay == "gke")
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["hostPID"] is False and pod["hostNetwork"] is False
    assert pod["automountServiceAccountToken"] is False

    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    values = {k: v["value"] for k, v in env.items() if "value" in v}
    web_config = values.pop(env_name("--web.config.file"), None)  # a file only the pod has
    config = parse_config([], env=values | {"NODE_NAME": "n1"})
    assert config.node_name == "n1"
    assert str(config.sysfs) == "/host/sys" and str(config.procfs) == "/host/proc"
    assert str(config.container_logs) == "/host/var/log/containers"
    assert config.kubelet_socket == DEFAULTS.kubelet_socket
    assert env_name("--path.sysfs") in env and env_name("--kubelet-socket") in env

    (port,) = container["ports"]
    assert port["containerPort"] == default_of("listen_address")[1] and port["name"] == "metrics"
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
    for name, mount in mounts.items():
        assert mount.get("readOnly") is True or "emptyDir" in volumes[name], name
        assert not mount["mountPath"].startswith("/var/log"), "no code reads host logs yet"
    for name in ("sys", "proc"):
        assert volumes[name]["hostPath"]["type"] == "Directory", name
    # A wrong kubelet root must not keep the pod from starting (docs/deploy.md, section 5).
    assert volumes["pod-resources"]["hostPath"]["type"] == "DirectoryOrCreate"
    assert mounts["pod-resources"]["mountPath"] == str(DEFAULTS.kubelet_socket.parent)
    root = KUBELET_ROOTS[overlay]
    assert volumes["pod-resources"]["hostPath"]["path"] == f"{root}/pod-resources"


@pytest.mark.parametrize("overlay", sorted(KUBELET_ROOTS))
def test_daemonset_schedules_on_busy_tainted_gpu_nodes(overlay: str) -> None:
    pod = one(_rendered(overlay), "DaemonSet")["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert {"operator": "Exists"} in pod["tolerations"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    keys = {expr["key"] for term in terms for expr in term["matchExpressions"]}
    assert all(len(term["matchExpressions"]) == 1 for term in terms), "terms are ORed"
    # Vendor-only NFD labels (the GPU Operator's NFD) and managed clouds without NFD.
    assert {
        "feature.node.kubernetes.io/pci-10de.present",
        "feature.node.kubernetes.io/pci-1002.present",
        "cloud.google.com/gke-accelerator",
        "kube-device-exporter.io/enabled",
    } <= keys


def _nvml_view(overlay: str) -> tuple[dict[str, Any], dict[str, str], dict[str, str]]:
    """The pod spec, its env and where its host paths are mounted (mountPath -> host)."""
    pod = one(_rendered(overlay), "DaemonSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value", "") for e in container["env"]}
    hosts = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {
        m["mountPath"]: hosts[m["name"]] for m in container["volumeMounts"] if m["name"] in hosts
    }
    return pod, env, mounts


def test_nvml_with_the_toolkit_as_default_runtime() -> None:
    pod, env, _ = _nvml_view("kube-prometheus-stack")
    assert "runtimeClassName" not in pod, "a missing RuntimeClass would reject the pod"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"


@pytest.mark.parametrize("overlay", ["gpu-operator", "gpu-operator-exporter-only"])
def test_nvml_under_the_gpu_operator_with_cdi(overlay: str) -> None:
    pod, env, _ = _nvml_view(overlay)
    assert pod["runtimeClassName"] == "nvidia"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    # Evicted for the operator's driver upgrades as its own clients are
    # (tests/test_real_cluster_driver_upgrade.py, docs/deploy.md).
    assert pod["nodeSelector"] == {"nvidia.com/gpu.deploy.client": "true"}


@pytest.mark.parametrize("overlay", ["kube-prometheus-stack", "podmonitor", "web-config"])
def test_kube_prometheus_stack_installs_ship_the_dashboards(overlay: str) -> None:
    dashboards = {
        name
        for r in _rendered(overlay)
        if r["kind"] == "ConfigMap"
        for name in r.get("data", {})
        if name.endswith(".json")
    }
    shipped = {f"kube-device-exporter-{p.stem}.json" for p in (ROOT / "dashboards").glob("*.json")}
    assert dashboards == shipped


def test_nvml_on_gke_from_the_host_driver() -> None:
    resources = _rendered("gke")
    pod, env, mounts = _nvml_view("gke")
    assert "runtimeClassName" not in pod
    assert mounts["/usr/local/nvidia"] == GKE_DRIVER
    assert "/usr/local/nvidia/lib64" in env["LD_LIBRARY_PATH"].split(":")
    assert "NVIDIA_VISIBLE_DEVICES" not in env
    (quota,) = [r for r in resources if r["kind"] == "ResourceQuota"]
    (scope,) = quota["spec"]["scopeSelector"]["matchExpressions"]
    assert scope["scopeName"] == "PriorityClass"
    assert pod["priorityClassName"] in scope["values"]
    assert quota["metadata"]["namespace"] == one(resources, "DaemonSet")["metadata"]["namespace"]


def test_web_config_component_switches_to_https(tmp_path: Path) -> None:
    resources = kit_with(tmp_path, "kube-prometheus-stack", DEPLOY / "components" / "web-config")
    pod = one(resources, "DaemonSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == ["--web.config.file=/etc/kube-device-exporter/web/web-config.yml"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["web-config"] == {
        "name": "web-config",
        "mountPath": "/etc/kube-device-exporter/web",
        "readOnly": True,
    }
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["scheme"] == "HTTPS", probe
    (endpoint,) = one(resources, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["ca"]["secret"]["name"] == "kube-device-exporter-web"


def test_image_is_the_package_version() -> None:
    """The one image setting carries the version being built; docs say how to replace it."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    for overlay in KUBELET_ROOTS:
        (container,) = one(_rendered(overlay), "DaemonSet")["spec"]["template"]["spec"][
            "containers"
        ]
        assert container["image"] == f"kube-device-exporter:{version}", overlay
    docs = (ROOT / "docs" / "deploy.md").read_text()
    assert "newName:" in docs and "image.repository" in docs


def test_openshift_scc_carries_priority() -> None:
    scc = one(_rendered("openshift"), "SecurityContextConstraints")
    assert "priority" in scc


@pytest.mark.parametrize("overlay", sorted(KUBELET_ROOTS))
def test_scraping_keeps_target_labels_and_job(overlay: str) -> None:
    resources = _rendered(overlay)
    kinds = {r["kind"] for r in resources}
    monitors = [r for r in resources if r["kind"] in ("ServiceMonitor", "PodMonitor")]
    if overlay == "gpu-operator-exporter-only":  # needs no Prometheus Operator CRD
        assert not monitors and not kinds & {"PrometheusRule", "ConfigMap"}
        return
    if overlay == "otlp":
        assert not monitors and "PrometheusRule" not in kinds
        env = {e["name"] for e in one(resources, "DaemonSet")["spec"]["template"]["spec"][
            "containers"][0]["env"]}  # fmt: skip
        assert "OTEL_EXPORTER_OTLP_ENDPOINT" in env
        return
    (monitor,) = monitors
    pod_labels = one(resources, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pod_labels[monitor["spec"]["jobLabel"]] == JOB
    endpoints = monitor["spec"].get("endpoints") or monitor["spec"]["podMetricsEndpoints"]
    for endpoint in endpoints:
        assert endpoint["honorLabels"] is False
        assert endpoint["port"] == "metrics"
    if monitor["kind"] == "ServiceMonitor":
        service = one(resources, "Service")
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
