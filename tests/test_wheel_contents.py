"""The product's wheel, built from the whole checkout as `pip wheel .` builds it: the
exporter and nothing of the simulated node (no simulator module, no C source, no scenario
files, no `kde-simulate` command; tests/test_simulate_runner.py runs the one the
development install makes).

tests/test_dockerfile.py builds the wheel from the Docker build context; this one builds it
from everything the working tree holds, the built stand-in library included."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.peer

ROOT = Path(__file__).resolve().parent.parent
LEFT_OUT = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", "*.egg-info", ".*_cache", ".hypothesis", "build", "dist"
)


def _wheel(tmp_path: Path) -> tuple[set[str], str]:
    """The names in the wheel and its entry_points.txt."""
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT, checkout, ignore=LEFT_OUT, symlinks=True)
    stand_in = ROOT / "simulator" / "fakenvml" / "build"
    if stand_in.is_dir():  # the built libnvidia-ml.so.1 stand-in, as a developer's tree has it
        shutil.copytree(stand_in, checkout / "simulator" / "fakenvml" / "build")
    wheels = tmp_path / "wheels"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(wheels), "."],
        cwd=checkout, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = wheels.glob("kube_device_exporter-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        return names, archive.read(entry_points).decode()


def test_the_wheel_holds_the_exporter_and_nothing_of_the_simulator(tmp_path: Path) -> None:
    names, entry_points = _wheel(tmp_path)
    modules = {n for n in names if n.endswith(".py")}
    assert "exporter/cli/main.py" in modules and "exporter/sources/netdev.py" in modules
    assert "exporter/web/static/index.html" in names and "exporter/py.typed" in names
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"exporter"}, top
    assert not [n for n in names if "simulat" in n or "fakenvml" in n or "scenario" in n]
    assert not [n for n in names if n.endswith((".c", ".h", ".yaml", ".yml", ".so", ".o"))]
    assert not [n for n in names if "/Makefile" in n or ".so." in n]
    assert entry_points.split() == ["[console_scripts]", "kube-device-exporter", "=",
                                    "exporter.cli.main:main"]  # fmt: skip
