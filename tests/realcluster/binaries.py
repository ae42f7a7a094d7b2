"""The cluster tier's binaries: `KDE_E2E_HYPERKUBE` (kube-apiserver, kube-scheduler,
kube-controller-manager and kubelet in one binary, `hyperkube COMPONENT FLAGS...`) and
`KDE_E2E_ETCD`, found by tests/realnode/binaries.py (`make test` unpacks ../shared/k8s into
.venv/k8s and exports them; docs/testing.md says how to point them at other binaries)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.realnode.binaries import ETCD_ENV, HYPERKUBE_ENV, Missing, binary_from


def missing() -> str | None:
    """Why the tier cannot run (one line), or None."""
    try:
        for variable in (HYPERKUBE_ENV, ETCD_ENV):
            binary_from(variable)
    except Missing as exc:
        return str(exc)
    return None


def hyperkube() -> Path:
    return binary_from(HYPERKUBE_ENV)


def etcd() -> Path:
    return binary_from(ETCD_ENV)


def component_link(folder: Path, component: str) -> Path:
    """`folder/COMPONENT`, a symlink to hyperkube: run by that name, hyperkube is that
    component (and `COMPONENT --version` answers as it)."""
    link = folder / component
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        link.symlink_to(hyperkube())
    return link


def kubernetes_version() -> str:
    """`Kubernetes v1.36.2` for the shared binary (`hyperkube kube-apiserver --version`;
    hyperkube alone answers with its usage): what the API server will report."""
    done = subprocess.run([str(hyperkube()), "kube-apiserver", "--version"],
                          capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    return done.stdout.strip()
