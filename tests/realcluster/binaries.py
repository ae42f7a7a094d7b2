"""The Kubernetes 1.36 binaries, from the variables that name them.

`KDE_E2E_HYPERKUBE` (kube-apiserver, kube-scheduler, kube-controller-manager and kubelet in
one binary: `hyperkube COMPONENT FLAGS...`) and `KDE_E2E_ETCD`. Either may name the unpacked
binary or its `.xz` archive (as shipped in ../shared/k8s/), which is unpacked once into
`KDE_E2E_CACHE` (default: a folder under the system temp dir) and reused while its size and
modification time match.
"""

from __future__ import annotations

import lzma
import os
import shutil
import tempfile
from pathlib import Path

HYPERKUBE = "KDE_E2E_HYPERKUBE"
ETCD = "KDE_E2E_ETCD"
CACHE = "KDE_E2E_CACHE"


def missing() -> str | None:
    """Why the tier cannot run (one line), or None."""
    for var in (HYPERKUBE, ETCD):
        value = os.environ.get(var)
        if not value:
            return f"{var} is not set (the Kubernetes 1.36 binaries; see docs/testing.md)"
        if not Path(value).is_file():
            return f"{var}={value} does not exist"
    return None


def binary(var: str) -> Path:
    """The executable that `var` names, unpacked first if it names an `.xz` archive."""
    path = Path(os.environ[var])
    if path.suffix != ".xz":
        return path
    cache = Path(os.environ.get(CACHE) or Path(tempfile.gettempdir()) / "kde-e2e-binaries")
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / path.stem
    stamp = cache / f"{path.stem}.source"
    source = f"{path.resolve()} {path.stat().st_size} {path.stat().st_mtime_ns}"
    if target.is_file() and stamp.is_file() and stamp.read_text() == source:
        return target
    partial = cache / f".{path.stem}.{os.getpid()}"
    with lzma.open(path) as packed, partial.open("wb") as out:
        shutil.copyfileobj(packed, out, 1 << 20)
    partial.chmod(0o755)
    partial.replace(target)  # atomic: a concurrent run sees the old file or the whole new one
    stamp.write_text(source)
    return target
