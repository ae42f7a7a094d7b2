"""Static pod manifests with busybox containers, for the real-node tiers.

Every pod is `hostNetwork: true` (no CNI here, docs/real-node.md "containerd"),
`dnsPolicy: Default` (no cluster DNS), and its images are never pulled
(`imagePullPolicy: Never`: the images are imported, images.py). Static pods are named
`<name>-<node>` by the kubelet; their namespace is the manifest's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.realnode.images import BUSYBOX_IMAGE

SLEEP = ("sleep", "3600")


@dataclass(frozen=True)
class Container:
    name: str
    devices: Mapping[str, int] = field(default_factory=dict)
    """Extended resource -> count (limits; requests follow)."""
    command: Sequence[str] = SLEEP
    restart_policy: str = ""
    """"Always" on an init container makes it a sidecar (KEP-753)."""

    def spec(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "image": BUSYBOX_IMAGE,
            "imagePullPolicy": "Never",
            "command": list(self.command),
        }
        if self.devices:
            out["resources"] = {"limits": {k: str(v) for k, v in self.devices.items()}}
        if self.restart_policy:
            out["restartPolicy"] = self.restart_policy
        return out


@dataclass(frozen=True)
class Pod:
    name: str
    containers: Sequence[Container]
    init_containers: Sequence[Container] = ()
    namespace: str = "kde-e2e"
    restart_policy: str = "Always"
    grace_seconds: int = 1

    def manifest(self) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "hostNetwork": True,
            "dnsPolicy": "Default",
            "restartPolicy": self.restart_policy,
            "terminationGracePeriodSeconds": self.grace_seconds,
            "containers": [c.spec() for c in self.containers],
        }
        if self.init_containers:
            spec["initContainers"] = [c.spec() for c in self.init_containers]
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": spec,
        }

    def place(self, manifests: Path) -> Path:
        """Write the manifest where the kubelet's staticPodPath is (atomically: the kubelet
        must never read half a file)."""
        path = manifests / f"{self.name}.json"
        tmp = manifests / f".{self.name}.tmp"
        tmp.write_text(json.dumps(self.manifest()))
        tmp.replace(path)
        return path

    def remove(self, manifests: Path) -> None:
        (manifests / f"{self.name}.json").unlink()

    def static_name(self, node: str) -> str:
        return f"{self.name}-{node}"
