"""The Dockerfile's base image, or a stand-in built from Debian packages under its name.

The Dockerfile pins `python:3.11.11-slim-bookworm@sha256:...`. Where a registry is
reachable the pinned base is pulled. Where none is (this machine reaches package
registries only), debootstrap makes a Debian bookworm root with Debian's python3 (3.11),
python3-venv and ca-certificates, imported as `python:3.11.11-slim-bookworm` and labelled
STAND_IN, and the image is built on that tag: the digest names the upstream image, which a
local import cannot carry. Everything the Dockerfile does works on both (it asks Python
where its standard library and site-packages are instead of assuming /usr/local).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.image.engine import Engine

STAND_IN = "io.kube-device-exporter.stand-in"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates")


@dataclass(frozen=True)
class Base:
    ref: str
    """What the build's PYTHON_IMAGE is set to."""
    how: str
    """One line for the test's output: the pinned base, or the stand-in."""


def pinned(dockerfile: Path) -> tuple[str, str]:
    """(`tag@sha256:digest`, `tag`) from the Dockerfile's `ARG PYTHON_IMAGE=`."""
    match = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", dockerfile.read_text(), re.M)
    if match is None:
        raise AssertionError("the Dockerfile has no ARG PYTHON_IMAGE=")
    full = match.group(1)
    return full, full.split("@", 1)[0]


def _exists(engine: Engine, ref: str) -> bool:
    return engine.run("image", "inspect", ref, check=False, timeout=30).returncode == 0


def _label(engine: Engine, ref: str) -> str:
    fmt = '{{index .Config.Labels "' + STAND_IN + '"}}'
    return engine.run("image", "inspect", "--format", fmt, ref, timeout=30).stdout.strip()


def ensure(engine: Engine, dockerfile: Path, workdir: Path) -> Base:
    full, tag = pinned(dockerfile)
    if _exists(engine, full):
        return Base(full, f"the pinned base {full}")
    if engine.run("pull", full, check=False, timeout=300).returncode == 0:
        return Base(full, f"the pinned base {full}, pulled")
    if not _exists(engine, tag) or not _label(engine, tag):
        build_stand_in(engine, tag, workdir)
    return Base(
        tag, f"no registry: a stand-in from Debian packages under {tag} ({_label(engine, tag)})"
    )


def build_stand_in(engine: Engine, tag: str, workdir: Path) -> None:
    """debootstrap (minbase) + `docker import`: about a minute with a reachable mirror."""
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise AssertionError("no registry and no debootstrap: install Debian's debootstrap")
    root = workdir / "rootfs"
    done = subprocess.run(
        [debootstrap, "--variant=minbase", f"--include={','.join(PACKAGES)}", "bookworm",
         str(root), DEBIAN_MIRROR],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise AssertionError(f"debootstrap: {(done.stdout + done.stderr)[-2000:]}")
    for cache in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man"):
        shutil.rmtree(root / cache, ignore_errors=True)
    tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(root), "-c", "."],
                           stdout=subprocess.PIPE)  # fmt: skip
    assert tar.stdout is not None
    try:
        imported = subprocess.run(
            [engine.cli, "import",
             "--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
             "--change", "ENV LANG=C.UTF-8",
             "--change", 'CMD ["python3"]',
             "--change", f"LABEL {STAND_IN}=debian-bookworm",
             "-", tag],
            stdin=tar.stdout, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    finally:
        tar.stdout.close()
        tar.wait(timeout=60)
        shutil.rmtree(root, ignore_errors=True)
    if imported.returncode != 0:
        raise AssertionError(f"docker import: {imported.stderr}")
