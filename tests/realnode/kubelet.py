"""A real kubelet for a test node: its configuration, start/stop/restart, and `/pods`.

The configuration is docs/real-node.md's ("The kubelet"): standalone (no API server),
loopback ports of our own, the cgroupfs driver under a `cgroupRoot` of ours, static pods
from a folder, anonymous read-only access, low eviction thresholds and image GC at
100/99 so a small disk evicts nothing. `extra` merges into the KubeletConfiguration (the
cluster tier adds its TLS, authentication and `failCgroupV1: false`), and `flags` adds
command-line flags (`--kubeconfig`, `--node-ip`).

Feature gates: the 1.32 binary built from kubeedge's fork needs its own
`KubeletPodResources` gate or no PodResources socket appears; an official release
(>= 1.28) has no such gate (GA and locked in 1.28, removed in 1.30: naming it is an
error there), so it is set only for the fork. `KubeletPodResourcesGet` and
`KubeletPodResourcesDynamicResources` are alpha in 1.32 and beta from 1.34.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from simulator.ports import free_port
from tests.realnode.binaries import minor_version, version
from tests.realnode.namespace import MountNamespace
from tests.realnode.procs import stop_pid

POD_RESOURCES_SOCKET = Path("pod-resources") / "kubelet.sock"


def version_config(kubelet_version: str) -> dict[str, Any]:
    """What only some versions take: `failCgroupV1` exists from 1.31 (and 1.35 refuses a
    cgroup v1 host without it: docs/real-node.md)."""
    if minor_version(kubelet_version) >= (1, 31):
        return {"failCgroupV1": False}
    return {}


def feature_gates(kubelet_version: str) -> dict[str, bool]:
    gates = {}
    if "kubeedge" in kubelet_version:
        gates["KubeletPodResources"] = True
    if minor_version(kubelet_version) < (1, 34):
        gates |= {"KubeletPodResourcesGet": True, "KubeletPodResourcesDynamicResources": True}
    return gates


def merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """`extra` over `base`, nested mappings merged key by key."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


class Kubelet:
    """A kubelet in `namespace`, talking to the containerd at `runtime_endpoint`."""

    def __init__(
        self,
        binary: Path,
        workdir: Path,
        namespace: MountNamespace,
        *,
        runtime_endpoint: str,
        node: str,
        cgroup_root: str,
        extra: Mapping[str, Any] | None = None,
        flags: Sequence[str] = (),
    ) -> None:
        self.binary = binary
        self.workdir = workdir
        self.namespace = namespace
        self.node = node
        self.version = version(binary)
        self.root_dir = workdir / "root"
        self.manifests = workdir / "manifests"
        self.config_path = workdir / "kubelet-config.json"
        self.log_path = workdir / "kubelet.log"
        self.read_only_port = free_port()
        self.flags = list(flags)
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        base = {
            "kind": "KubeletConfiguration",
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "address": "127.0.0.1",
            "port": free_port(),
            "readOnlyPort": self.read_only_port,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "failSwapOn": False,
            "cgroupDriver": "cgroupfs",
            "cgroupsPerQOS": True,
            "cgroupRoot": f"/{cgroup_root}",
            "enforceNodeAllocatable": [],
            "staticPodPath": str(self.manifests),
            "fileCheckFrequency": "1s",
            "syncFrequency": "10s",
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "featureGates": feature_gates(self.version),
            "containerRuntimeEndpoint": runtime_endpoint,
            "imageServiceEndpoint": runtime_endpoint,
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "makeIPTablesUtilChains": False,
            "podLogsDir": "/var/log/pods",
        }
        self.config = merge(base | version_config(self.version), extra or {})

    @property
    def pod_resources_socket(self) -> Path:
        return self.root_dir / POD_RESOURCES_SOCKET

    def start(self) -> None:
        """Start (a stopped kubelet may be started again); returns at once (`wait_ready`)."""
        for folder in (self.root_dir, self.manifests):
            folder.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(json.dumps(self.config, indent=1))
        argv = [
            str(self.binary), f"--config={self.config_path}", f"--root-dir={self.root_dir}",
            f"--hostname-override={self.node}", "--v=2", *self.flags,
        ]  # fmt: skip
        with self.log_path.open("ab") as log:
            log.write(f"\n=== start {self.starts + 1} at {time.time():.3f}\n".encode())
            self.proc = subprocess.Popen(
                self.namespace.command(argv), stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.starts += 1

    def stop(self) -> None:
        if self.proc is not None:
            stop_pid(self.proc, signal.SIGTERM, grace=10)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, chars: int = 4000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""

    def pods(self) -> list[dict[str, Any]]:
        """The read-only port's `/pods` (a PodList); [] while it does not answer."""
        url = f"http://127.0.0.1:{self.read_only_port}/pods"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                items: list[dict[str, Any]] = json.load(response).get("items") or []
                return items
        except OSError:
            return []

    def wait_ready(self, timeout: float = 30.0) -> None:
        """The PodResources socket answers connections and `/pods` answers."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running():
                raise RuntimeError(f"the kubelet exited:\n{self.log_tail()}")
            if self.pod_resources_socket.exists() and self._read_only_port_up():
                return
            time.sleep(0.05)
        raise RuntimeError(f"the kubelet was not ready within {timeout} s:\n{self.log_tail()}")

    def _read_only_port_up(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.read_only_port}/healthz", timeout=1
            ):
                return True
        except OSError:
            return False

    def pod(self, name: str) -> dict[str, Any] | None:
        """The static pod called `name` (its mirror name is `<name>-<node>`)."""
        for pod in self.pods():
            if pod["metadata"]["name"] in (name, f"{name}-{self.node}"):
                return pod
        return None

    def wait_pod(self, name: str, phase: str = "Running", timeout: float = 60.0) -> dict[str, Any]:
        """The pod once its phase is `phase` and, for Running, every container runs."""
        deadline = time.monotonic() + timeout
        pod = None
        while time.monotonic() < deadline:
            pod = self.pod(name)
            if pod is not None and pod_phase(pod) == phase:
                return pod
            time.sleep(0.2)
        raise AssertionError(
            f"pod {name} not {phase} in {timeout} s: {json.dumps(pod)[:3000]}\n{self.log_tail(2000)}"
        )


def pod_phase(pod: dict[str, Any]) -> str:
    """The phase; "Running" only when every container runs (what `kubectl get` shows)."""
    status = pod.get("status", {})
    phase = str(status.get("phase", ""))
    if phase == "Running":
        statuses = status.get("containerStatuses") or []
        if not statuses or not all("running" in s.get("state", {}) for s in statuses):
            return "Starting"
    return phase


def container_ids(pod: dict[str, Any]) -> dict[str, str]:
    """Container name -> bare containerd ID, for containers (init ones too) that have one."""
    status = pod.get("status", {})
    out = {}
    for key in ("initContainerStatuses", "containerStatuses"):
        for s in status.get(key) or []:
            cid = str(s.get("containerID", ""))
            if cid:
                out[s["name"]] = cid.split("://", 1)[-1]
    return out
