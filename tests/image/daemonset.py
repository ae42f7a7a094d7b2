"""deploy/base/daemonset.yaml as `docker run` flags: the same user, capabilities,
privilege escalation, read-only root, resource limits, environment and mounts.

Only what Docker can express is translated, and anything in the container spec this does
not know fails loudly (a new DaemonSet field must be carried here or said to be ignored).
Each hostPath volume is mapped to a folder of the simulated node by volume name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

KNOWN_SECURITY = {
    "privileged",
    "allowPrivilegeEscalation",
    "readOnlyRootFilesystem",
    "capabilities",
}


def load(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod spec, the exporter container) of the DaemonSet in `path`."""
    for doc in yaml.safe_load_all(path.read_text()):
        if doc and doc.get("kind") == "DaemonSet":
            pod = doc["spec"]["template"]["spec"]
            (container,) = pod["containers"]
            return pod, container
    raise AssertionError(f"no DaemonSet in {path}")


def _quantity_mib(value: str) -> int:
    units = {"Mi": 1, "Gi": 1024}
    for suffix, factor in units.items():
        if value.endswith(suffix):
            return int(value[: -len(suffix)]) * factor
    raise AssertionError(f"memory quantity {value!r}: only Mi/Gi are translated")


def _cpus(value: str) -> str:
    return str(int(value[:-1]) / 1000) if value.endswith("m") else value


def run_flags(path: Path, host_paths: dict[str, Path], node_name: str) -> list[str]:
    """`docker run` flags for the exporter container; `host_paths`: volume name -> folder."""
    pod, container = load(path)
    pod_sc, sc = pod.get("securityContext", {}), container.get("securityContext", {})
    unknown = set(sc) - KNOWN_SECURITY
    assert not unknown, f"securityContext fields not translated to docker run: {unknown}"
    assert sc.get("privileged") is False, "the base DaemonSet is unprivileged"
    flags = [
        "--user", f"{sc.get('runAsUser', pod_sc['runAsUser'])}:"
                  f"{sc.get('runAsGroup', pod_sc['runAsGroup'])}",
    ]  # fmt: skip
    if sc.get("readOnlyRootFilesystem"):
        flags.append("--read-only")
    if sc.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    for cap in sc.get("capabilities", {}).get("drop", []):
        flags += ["--cap-drop", cap]
    for cap in sc.get("capabilities", {}).get("add", []):
        flags += ["--cap-add", cap]
    limits = container.get("resources", {}).get("limits", {})
    if "memory" in limits:
        flags += ["--memory", f"{_quantity_mib(limits['memory'])}m"]
    if "cpu" in limits:
        flags += ["--cpus", _cpus(limits["cpu"])]
    for env in container.get("env", []):
        if "value" in env:
            flags += ["--env", f"{env['name']}={env['value']}"]
        elif env.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
            flags += ["--env", f"{env['name']}={node_name}"]
        else:
            raise AssertionError(f"env {env['name']}: not translated")
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "emptyDir" in volume:
            size = volume["emptyDir"].get("sizeLimit", "16Mi")
            flags += ["--tmpfs", f"{mount['mountPath']}:size={_quantity_mib(size)}m"]
        elif "hostPath" in volume:
            mode = "ro" if mount.get("readOnly") else "rw"
            flags += ["--volume", f"{host_paths[mount['name']]}:{mount['mountPath']}:{mode}"]
        else:
            raise AssertionError(f"volume {mount['name']}: not translated")
    return flags


def port(path: Path) -> int:
    _, container = load(path)
    (metrics,) = [p for p in container["ports"] if p["name"] == "metrics"]
    return int(metrics["containerPort"])


def grace_seconds(path: Path) -> int:
    pod, _ = load(path)
    return int(pod["terminationGracePeriodSeconds"])
