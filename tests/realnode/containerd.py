"""A private containerd (Debian's 1.6) for one test node: its own root, state and socket.

The configuration is docs/real-node.md's ("containerd"): no
TCP (`disable_tcp_service`, the stream server on 127.0.0.1, no debug or metrics address),
overlayfs, runc v2 with `SystemdCgroup = false` (the kubelet's cgroupfs driver), CNI
folders of ours, and `restrict_oom_score_adj = true` — without it runc fails every
container here with "can't get final child's PID from pipe: EOF" (the machine lacks
CAP_SYS_RESOURCE, so oom_score_adj -998 cannot be set). It knows nothing of the kubelet:
any kubelet version (the 1.32 standalone tier, the 1.36 cluster tier) talks to it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from tests.realnode.binaries import Tools
from tests.realnode.images import PAUSE_IMAGE
from tests.realnode.namespace import MountNamespace
from tests.realnode.procs import pids_where, stop_pid

CRI = 'plugins."io.containerd.grpc.v1.cri"'
K8S_NAMESPACE = "k8s.io"


def config_toml(workdir: Path, tools: Tools, *, cni_bin: Path, cni_conf: Path) -> str:
    return f"""version = 2
root = "{workdir}/root"
state = "{workdir}/state"
[grpc]
  address = "{workdir}/containerd.sock"
[ttrpc]
  address = ""
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{workdir}/opt"
[{CRI}]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  enable_selinux = false
[{CRI}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{CRI}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{CRI}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = "{tools.runc}"
[{CRI}.cni]
  bin_dir = "{cni_bin}"
  conf_dir = "{cni_conf}"
"""


class Containerd:
    """Started inside `namespace` (its overlay mounts stay there); `ctr()` drives it."""

    def __init__(self, workdir: Path, tools: Tools, namespace: MountNamespace) -> None:
        self.workdir = workdir
        self.tools = tools
        self.namespace = namespace
        self.socket = workdir / "containerd.sock"
        self.cni_bin = workdir / "cni-bin"
        self.cni_conf = workdir / "cni-conf"
        self.config_path = workdir / "config.toml"
        self.log_path = workdir / "containerd.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """What a kubelet's containerRuntimeEndpoint / imageServiceEndpoint says."""
        return f"unix://{self.socket}"

    def start(self, timeout: float = 30.0) -> None:
        for folder in (self.workdir, self.cni_bin, self.cni_conf):
            folder.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(
            config_toml(self.workdir, self.tools, cni_bin=self.cni_bin, cni_conf=self.cni_conf)
        )
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.namespace.command([self.tools.containerd, "--config", str(self.config_path)]),
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"containerd exited: {self.log_tail()}")
            if self.socket.exists() and self.ctr("version", check=False).returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"containerd did not answer within {timeout} s: {self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""

    def ctr(
        self, *args: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """`ctr --address SOCKET -n k8s.io ARGS` (the CRI's namespace)."""
        return subprocess.run(
            [self.tools.ctr, "--address", str(self.socket), "-n", K8S_NAMESPACE, *args],
            capture_output=True, text=True, timeout=timeout, check=check,
        )  # fmt: skip

    def import_image(self, archive: Path) -> None:
        self.ctr("images", "import", "--no-unpack=false", str(archive))

    def images(self) -> list[str]:
        return self.ctr("images", "ls", "-q").stdout.split()

    def shim_pids(self) -> list[int]:
        """Our shims: `containerd-shim-runc-v2 ... -address OUR_SOCKET` (another helper's
        containerd has shims too; they name their own socket)."""
        return pids_where(
            lambda argv: (
                "-address" in argv
                and str(self.socket) in argv
                and any(a.endswith("containerd-shim-runc-v2") for a in argv[:1])
            )
        )

    def remove_all(self) -> None:
        """Kill and delete every task and container of the CRI namespace (what the kubelet
        left running: containers outlive a stopped kubelet)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        tasks = self.ctr("tasks", "ls", "-q", check=False).stdout.split()
        for task in tasks:
            self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
        for task in tasks:
            self.ctr("tasks", "delete", "-f", task, check=False)
        containers = self.ctr("containers", "ls", "-q", check=False).stdout.split()
        if containers:
            self.ctr("containers", "delete", *containers, check=False)

    def stop(self) -> None:
        """Tasks and containers first, then containerd, then any shim still running."""
        self.remove_all()
        if self.proc is not None:
            stop_pid(self.proc, signal.SIGTERM, grace=10)
        for pid in self.shim_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
