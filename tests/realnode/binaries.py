"""Where the real Kubernetes binaries are, and why a tier that needs them skips.

Paths come from the environment (`make test` exports them when it has unpacked
`../shared/k8s/*.xz` into `.venv/k8s/`, see the Makefile's `k8s` target); a user points
them at any official release (README, "The real-kubelet tier"):
- `KDE_E2E_KUBELET`: a kubelet (>= 1.28), for the standalone-kubelet tier;
- `KDE_E2E_HYPERKUBE`, `KDE_E2E_ETCD`: for the cluster tier.
The Debian tools the node needs (containerd, runc, ctr, busybox-static, gcc) are found
on PATH; the tier also needs root (mount namespaces, cgroups).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

KUBELET_ENV = "KDE_E2E_KUBELET"
HYPERKUBE_ENV = "KDE_E2E_HYPERKUBE"
ETCD_ENV = "KDE_E2E_ETCD"

NODE_TOOLS = {
    "containerd": "containerd",
    "containerd-shim-runc-v2": "containerd",
    "ctr": "containerd",
    "runc": "runc",
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "gcc": "gcc",
}
BUSYBOX_STATIC = Path("/bin/busybox")
"""Debian's busybox-static installs a static /bin/busybox (busybox, the dynamic one, too)."""


class Missing(Exception):
    """What the tier lacks, in one line (the skip reason)."""


@dataclass(frozen=True)
class Tools:
    """Absolute paths of the node's Debian tools."""

    containerd: str
    shim: str
    ctr: str
    runc: str
    unshare: str
    nsenter: str
    gcc: str
    busybox: Path


def binary_from(variable: str) -> Path:
    """The executable that `variable` names; Missing says why there is none."""
    value = os.environ.get(variable, "")
    if not value:
        raise Missing(f"{variable} is not set (make test sets it from ../shared/k8s; see README)")
    path = Path(value).resolve()  # nsenter runs it from another working directory
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise Missing(f"{variable}={value} is not an executable file")
    return path


def node_tools() -> Tools:
    """The Debian tools a node needs, and root; Missing names the first one absent."""
    if os.geteuid() != 0:
        raise Missing("the real-node tier needs root (mount namespaces, cgroups, containerd)")
    found = {}
    for name, package in NODE_TOOLS.items():
        path = shutil.which(name)
        if path is None:
            raise Missing(f"{name} not found: install the Debian package {package!r} (make test)")
        found[name] = path
    if not _static(BUSYBOX_STATIC):
        raise Missing(f"{BUSYBOX_STATIC} is not a static busybox: install busybox-static")
    return Tools(
        containerd=found["containerd"],
        shim=found["containerd-shim-runc-v2"],
        ctr=found["ctr"],
        runc=found["runc"],
        unshare=found["unshare"],
        nsenter=found["nsenter"],
        gcc=found["gcc"],
        busybox=BUSYBOX_STATIC,
    )


def _static(path: Path) -> bool:
    """An ELF file without a program interpreter (PT_INTERP): it runs in an empty image."""
    try:
        head = path.read_bytes()[:4096]
    except OSError:
        return False
    return (
        head.startswith(b"\x7fELF") and b"/lib64/ld-linux" not in head and b"ld-linux" not in head
    )


def version(binary: Path) -> str:
    """`BINARY --version`'s first line (e.g. `Kubernetes v1.32.10-kubeedge1`)."""
    done = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, timeout=30, check=False
    )
    return (
        (done.stdout or done.stderr).strip().splitlines()[0] if done.stdout or done.stderr else ""
    )


def minor_version(text: str) -> tuple[int, int]:
    """(1, 32) from `Kubernetes v1.32.10-kubeedge1`; (0, 0) when it has no version."""
    for word in text.split():
        if word.startswith("v") and word.count(".") >= 2:
            major, minor = word[1:].split(".")[:2]
            if major.isdigit() and minor.isdigit():
                return int(major), int(minor)
    return 0, 0
