"""What an operator bends on day two, in the chart: the security contexts (SELinux spc_t on
RHEL), the update strategy, more volumes and environment, the node's network; each merged
over the shipped DaemonSet without losing what it keeps (root without capabilities, seccomp,
read-only root). And the chart's selector equals the kit's for the default release name,
so an install moves between them without deleting the DaemonSet (a selector cannot change)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

from tests.support.manifests import CHART, NAMESPACE, RELEASE, one, render_chart, validate_all

ROOT = Path(__file__).resolve().parent.parent
SPC = {"seLinuxOptions": {"type": "spc_t"}}


def _kit(name: str) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all((ROOT / "deploy/base" / name).read_text()) if d]
    assert isinstance(doc, dict)
    return doc


def _pod(resources: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(resources, "DaemonSet")["spec"]["template"]["spec"]
    return spec


def test_the_default_release_has_the_kits_name_and_selectors() -> None:
    assert RELEASE == NAMESPACE == "kube-device-exporter"
    ours, theirs = render_chart(), _kit("daemonset.yaml")
    daemonset = one(ours, "DaemonSet")
    assert daemonset["metadata"]["name"] == theirs["metadata"]["name"]
    assert daemonset["metadata"]["namespace"] == theirs["metadata"]["namespace"]
    assert daemonset["spec"]["selector"] == theirs["spec"]["selector"]
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert theirs["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert one(ours, "Service")["spec"]["selector"] == _kit("service.yaml")["spec"]["selector"]


def test_security_contexts_merge_over_the_shipped_ones() -> None:
    shipped = _pod(render_chart())
    bent = render_chart({"podSecurityContext": SPC, "securityContext": SPC})
    pod = _pod(bent)
    assert pod["securityContext"] == {**shipped["securityContext"], **SPC}
    (container,) = pod["containers"]
    (before,) = shipped["containers"]
    assert container["securityContext"] == {**before["securityContext"], **SPC}
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    validate_all(bent, "spc_t")
    # A key set by the user wins (here: a non-root UID, for a kubelet socket made readable).
    assert (
        _pod(render_chart({"podSecurityContext": {"runAsUser": 1000}}))["securityContext"][
            "runAsUser"
        ]
        == 1000
    )


def test_update_strategy_volumes_env_and_host_network() -> None:
    assert (
        one(render_chart(), "DaemonSet")["spec"]["updateStrategy"]
        == _kit("daemonset.yaml")["spec"]["updateStrategy"]
    )
    values: dict[str, Any] = {
        "updateStrategy": {"type": "OnDelete"},
        "extraVolumes": [{"name": "ca", "configMap": {"name": "corp-ca"}}],
        "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/corp-ca", "readOnly": True}],
        "extraEnv": [{"name": "SSL_CERT_DIR", "value": "/etc/corp-ca"}],
        "hostNetwork": True,
    }
    bent = render_chart(values)
    assert one(bent, "DaemonSet")["spec"]["updateStrategy"] == {"type": "OnDelete"}
    pod = _pod(bent)
    assert pod["volumes"][-1] == values["extraVolumes"][0]
    (container,) = pod["containers"]
    assert container["volumeMounts"][-1] == values["extraVolumeMounts"][0]
    assert {"name": "SSL_CERT_DIR", "value": "/etc/corp-ca"} in container["env"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    validate_all(bent, "bent")
    result = helm.lint(CHART, values, strict=True, kube_version="v1.30.0")
    assert result["errors"] == []


def test_the_schema_rejects_a_mount_without_a_path_and_an_unknown_strategy() -> None:
    for bad in ({"extraVolumeMounts": [{"name": "ca"}]}, {"updateStrategy": {"type": "Rolling"}}):
        result = helm.lint(CHART, bad, strict=True, kube_version="v1.30.0")
        assert result["errors"] or any(m["severity"] > 1 for m in result["messages"]), bad
