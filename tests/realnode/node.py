"""One real node: a private mount namespace, containerd with our images, a kubelet, and
the clean-up of all of it (also when a test failed half-way).

`start_runtime()` and `start_kubelet()` bring a node up (docs/real-node.md); `close()` stops by PID the
kubelet, containerd's tasks, containerd and its shims, then anything still in our cgroup
root or our mount namespace, removes the cgroups and our folder, and returns what it
could not remove (tests assert it is nothing).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.realnode import cgroups
from tests.realnode.binaries import Tools, node_tools
from tests.realnode.containerd import Containerd
from tests.realnode.images import build_images
from tests.realnode.kubelet import Kubelet
from tests.realnode.namespace import MountNamespace
from tests.realnode.procs import all_pids, kill_and_wait

DEVICE_PLUGINS = Path("/var/lib/kubelet/device-plugins")
HOST_PATHS = {
    "device-plugins": DEVICE_PLUGINS,
    "log/pods": Path("/var/log/pods"),
    "log/containers": Path("/var/log/containers"),
    "run-containerd": Path("/run/containerd"),
}
"""Fixed paths the kubelet or containerd write, each given a folder of ours inside the
namespace (containerd 1.6 puts shim sockets in /run/containerd/s whatever its config)."""


class RealNode:
    def __init__(
        self,
        kubelet_binary: Path,
        *,
        workdir: Path | None = None,
        kubelet_extra: Mapping[str, Any] | None = None,
        kubelet_flags: Sequence[str] = (),
    ) -> None:
        self.tools: Tools = node_tools()
        self.name = "kde-" + secrets.token_hex(3)
        # Short (unix socket paths must fit 107 bytes), and made by start_runtime: a node
        # that never started leaves nothing.
        self.workdir = workdir or Path(tempfile.gettempdir()) / self.name
        self.folders = {key: self.workdir / key for key in HOST_PATHS}
        self.namespace = MountNamespace(
            self.tools, {HOST_PATHS[key]: folder for key, folder in self.folders.items()}
        )
        self.containerd = Containerd(self.workdir / "containerd", self.tools, self.namespace)
        self.kubelet = Kubelet(
            kubelet_binary, self.workdir / "kubelet", self.namespace,
            runtime_endpoint=self.containerd.endpoint, node=self.name, cgroup_root=self.name,
            extra=kubelet_extra, flags=kubelet_flags,
        )  # fmt: skip
        self._mnt_ns = ""

    @property
    def plugin_folder(self) -> Path:
        """The device-plugin folder, as seen from outside the namespace."""
        return self.folders["device-plugins"]

    @property
    def container_logs(self) -> Path:
        """The kubelet's /var/log/containers, as seen from outside the namespace."""
        return self.folders["log/containers"]

    def start_runtime(self) -> None:
        """Namespace, cgroup root, containerd with the images (no kubelet yet)."""
        self.workdir.mkdir(mode=0o700)
        cgroups.create_root(self.name)
        self.namespace.start()
        self._mnt_ns = os.readlink(f"/proc/{self.namespace.pid}/ns/mnt")
        self.containerd.start()
        for archive in build_images(self.tools, self.workdir / "images"):
            self.containerd.import_image(archive)

    def start_kubelet(self) -> None:
        self.kubelet.start()
        self.kubelet.wait_ready()

    def in_namespace(self) -> list[int]:
        """PIDs of processes in our mount namespace."""
        found = []
        for pid in all_pids():
            with contextlib.suppress(OSError):
                if self._mnt_ns and os.readlink(f"/proc/{pid}/ns/mnt") == self._mnt_ns:
                    found.append(pid)
        return found

    def close(self) -> list[str]:
        """Stop and remove everything; what is left (empty when clean)."""
        left: list[str] = []
        self.kubelet.stop()
        self.containerd.stop()
        self.namespace.stop()
        stragglers = kill_and_wait(self.in_namespace())
        left += [f"process {pid} still in our mount namespace" for pid in stragglers]
        left += cgroups.remove_root(self.name)
        left += [f"mount {m}" for m in host_mounts_under(self.workdir)]
        if not left and self.workdir.exists():
            shutil.rmtree(self.workdir)
        return left


def host_mounts_under(folder: Path) -> list[str]:
    """Mount points under `folder` in the host's (this process's) namespace."""
    text = Path("/proc/self/mountinfo").read_text()
    prefix = str(folder) + "/"
    return [f.split()[4] for f in text.splitlines() if f.split()[4].startswith(prefix)]
