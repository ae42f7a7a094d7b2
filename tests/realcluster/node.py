"""A real Kubernetes 1.36 kubelet joined to the tier's control plane.

tests/realnode's RealNode (private mount namespace, containerd, the pause and busybox images,
a cgroup root of its own) with the kubelet that `hyperkube` is when run as `kubelet`, and the
differences docs/testing.md lists for 1.36 in a cluster: `failCgroupV1: false` (this host is
cgroup v1), no feature gates, TLS serving with a `system:node:NODE` certificate that is also
its client certificate, webhook authentication and authorization, `--node-ip=127.0.0.1`, and
a CNI folder holding only Debian's `loopback` plugin (without any CNI config the node is never
Ready; pods must use `hostNetwork`). A device plugin of tests/realnode serves RESOURCE.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.realcluster import binaries
from tests.realcluster.api import ApiStatus
from tests.realcluster.controlplane import ControlPlane, kubeconfig
from tests.realcluster.daemons import wait_for
from tests.realnode.deviceplugin import DevicePlugin
from tests.realnode.images import BUSYBOX_IMAGE
from tests.realnode.kubelet import merge
from tests.realnode.node import RealNode

RESOURCE = "nvidia.com/gpu"
DEVICES = tuple(f"GPU-5d0a7c2e-6b1f-4e8a-9c3d-{i:012x}" for i in range(8))
CNI_LOOPBACK = Path("/usr/lib/cni/loopback")
"""Debian's containernetworking-plugins."""


class ClusterNode:
    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        kubelet = binaries.component_link(plane.dir / "bin", "kubelet")
        self.node = RealNode(kubelet)
        self.name = self.node.name
        self.kubelet = self.node.kubelet
        pair = plane.pki.pair(
            f"kubelet-{self.name}",
            f"/CN=system:node:{self.name}/O=system:nodes",
            ("IP:127.0.0.1", f"DNS:{self.name}"),
        )
        # In the control plane's folder: the node's own is made by start_runtime.
        client = kubeconfig(plane.dir / f"kubelet-{self.name}.kubeconfig", plane.server,
                            plane.pki.ca, pair)  # fmt: skip
        self.kubelet.config = merge(self.kubelet.config, {
            "failCgroupV1": False,
            "featureGates": {"PodsAPI": True},  # the Pods API (test_real_cluster_podsapi.py)
            "tlsCertFile": str(pair.cert),
            "tlsPrivateKeyFile": str(pair.key),
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(plane.pki.ca)}},
            "authorization": {"mode": "Webhook"},
        })  # fmt: skip
        # The read-only port stays on (loopback): tests/realnode waits on its /pods.
        self.kubelet.flags += [f"--kubeconfig={client}", "--node-ip=127.0.0.1"]
        self.plugin = DevicePlugin(RESOURCE, DEVICES, self.node.plugin_folder)

    @property
    def socket(self) -> Path:
        return self.kubelet.pod_resources_socket

    def start(self) -> ClusterNode:
        self.node.start_runtime()
        # containerd watches its CNI folder: the loopback network is picked up at once.
        cni = self.node.containerd
        os.symlink(CNI_LOOPBACK, cni.cni_bin / "loopback")
        (cni.cni_conf / "10-loopback.conflist").write_text(json.dumps(
            {"cniVersion": "1.0.0", "name": "kde-loopback", "plugins": [{"type": "loopback"}]}
        ))  # fmt: skip
        self.node.start_kubelet()
        # The device manager empties the folder, then makes its kubelet.sock: a plugin
        # serving before that loses its socket (seen here: the 1.36 kubelet's PodResources
        # socket and read-only port answer before its device manager has started).
        registration = self.node.plugin_folder / "kubelet.sock"
        wait_for("the kubelet's device-plugin registration socket", registration.exists, 30,
                 interval=0.05)  # fmt: skip
        self.plugin.start()
        admin = self.plane.admin()
        wait_for(f"node {self.name} Ready with {RESOURCE}", lambda: self._ready(admin), 60,
                 interval=0.2)  # fmt: skip
        return self

    def _ready(self, admin: Any) -> bool:
        if not self.kubelet.running():
            raise RuntimeError(f"the kubelet exited:\n{self.kubelet.log_tail()}")
        try:
            node = admin.get(f"/api/v1/nodes/{self.name}")
        except ApiStatus as exc:
            if exc.code == 404:
                return False
            raise
        ready = [c for c in node["status"].get("conditions", []) if c["type"] == "Ready"]
        allocatable = node["status"].get("allocatable", {}).get(RESOURCE)
        return bool(ready and ready[0]["status"] == "True" and allocatable == str(len(DEVICES)))

    def close(self) -> list[str]:
        """Everything stopped and removed; what was left behind (empty when clean)."""
        self.plugin.stop()
        return self.node.close()


def pod_spec(devices: int = 1, command: tuple[str, ...] = ("sleep", "3600"),
             restart: str = "Always") -> dict[str, Any]:  # fmt: skip
    """A pod spec that runs here: host network (no pod network), no cluster DNS, the
    imported busybox never pulled, one container `c` holding `devices` of RESOURCE."""
    container: dict[str, Any] = {"name": "c", "image": BUSYBOX_IMAGE,
                                 "imagePullPolicy": "Never", "command": list(command)}  # fmt: skip
    if devices:
        container["resources"] = {"limits": {RESOURCE: str(devices)}}
    return {
        "hostNetwork": True,
        "dnsPolicy": "Default",
        "restartPolicy": restart,
        "terminationGracePeriodSeconds": 1,
        "automountServiceAccountToken": False,
        "containers": [container],
    }
