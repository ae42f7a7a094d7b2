"""The cluster tier's binaries, named by two variables (`make test` unpacks ../shared/k8s
into .venv/k8s and exports them; docs/testing.md says how to point them elsewhere):

- `KDE_E2E_HYPERKUBE`: either one `hyperkube` binary (the shared one: `hyperkube COMPONENT
  FLAGS...`, or a symlink named after the component), or a folder holding the separate
  `kube-apiserver`, `kube-scheduler`, `kube-controller-manager` and `kubelet` of an official
  release (its server tarball's `kubernetes/server/bin/`);
- `KDE_E2E_ETCD`: the shared etcd (`etcd DATA_DIR CLIENT_URL`) or an official etcd (flags).
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

from tests.realnode.binaries import ETCD_ENV, HYPERKUBE_ENV, Missing, binary_from

COMPONENTS = ("kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubelet")


def missing() -> str | None:
    """Why the tier cannot run (one line), or None."""
    try:
        components()
        binary_from(ETCD_ENV)
    except Missing as exc:
        return str(exc)
    return None


def components() -> dict[str, list[str]]:
    """Component -> the argv prefix that runs it."""
    value = os.environ.get(HYPERKUBE_ENV, "")
    folder = Path(value)
    if value and folder.is_dir():
        found = {name: folder.resolve() / name for name in COMPONENTS}
        absent = [str(p) for p in found.values() if not os.access(p, os.X_OK)]
        if absent:
            raise Missing(f"{HYPERKUBE_ENV}={value} lacks {', '.join(absent)}")
        return {name: [str(path)] for name, path in found.items()}
    hyperkube = binary_from(HYPERKUBE_ENV).resolve()  # a link to it must not be relative
    return {name: [str(hyperkube), name] for name in COMPONENTS}


def component_link(folder: Path, component: str) -> Path:
    """An executable that is `component` when run with flags alone: the release's own
    binary, or `folder/COMPONENT`, a symlink to hyperkube (run by that name, hyperkube is
    that component, and `COMPONENT --version` answers as it)."""
    argv = components()[component]
    if len(argv) == 1:
        return Path(argv[0])
    link = folder / component
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        link.symlink_to(argv[0])
    return link


def kubernetes_version() -> str:
    """`Kubernetes v1.36.2` for the shared binaries: what the API server will report."""
    done = subprocess.run([*components()["kube-apiserver"], "--version"],
                          capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    return done.stdout.strip()


@functools.cache
def _official_etcd(binary: Path) -> bool:
    """An official etcd says `etcd Version: 3.x` and takes flags; the shared one says
    `etcd 3.6.13 (server: embed package ...)` and takes `DATA_DIR CLIENT_URL`."""
    done = subprocess.run([str(binary), "--version"], capture_output=True, text=True,
                          timeout=30, check=False)  # fmt: skip
    return "etcd Version:" in done.stdout


def etcd_argv(data_dir: Path, client_url: str, peer_url: str) -> list[str]:
    """The etcd command for one member on `client_url` (peers on `peer_url`)."""
    binary = binary_from(ETCD_ENV).resolve()
    if not _official_etcd(binary):
        return [str(binary), str(data_dir), client_url]  # peers: the client port + 1
    return [
        str(binary), "--name", "default", "--data-dir", str(data_dir),
        "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
        "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
        "--initial-cluster", f"default={peer_url}",
    ]  # fmt: skip
