"""The docs a newcomer follows say what the code does: the README's flag table is the
parser's, the demo address is the Makefile's, and the commands in docs/ run here."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from exporter.cli.parser import build_parser
from exporter.settings.table import default_of
from monitoring import flagdoc

ROOT = Path(__file__).resolve().parent.parent


def test_readme_flag_table_is_generated_from_the_parser() -> None:
    readme = (ROOT / "README.md").read_text()
    assert flagdoc.rewrite(readme) == readme, "README flag table is stale: run make docs"
    table = readme.split(flagdoc.BEGIN)[1].split(flagdoc.END)[0]
    documented = set(re.findall(r"`(--[a-z][a-z0-9.-]*)`", table))
    parsed = {
        option
        for action in build_parser()._actions
        for option in action.option_strings
        if option.startswith("--") and option not in ("--help", "--version")
    }
    assert parsed == documented


def test_readme_names_the_address_make_demo_serves() -> None:
    makefile = (ROOT / "Makefile").read_text()
    (address,) = re.findall(r"^DEMO_ADDR \?= (\S+)$", makefile, re.M)
    readme = (ROOT / "README.md").read_text()
    assert f"http://{address}/" in readme
    assert address.endswith(
        f":{default_of('listen_address')[1]}"
    )  # the product's own port, not dcgm's 9400


def test_make_demo_installs_no_test_tools() -> None:
    makefile = (ROOT / "Makefile").read_text()
    demo_deps = re.search(r"^demo: (.*)$", makefile, re.M)
    assert demo_deps is not None
    assert "install" not in demo_deps[1].split() and "$(STAMP)" not in demo_deps[1]
    assert "debs" not in demo_deps[1]


@pytest.mark.peer
def test_the_fakenvml_command_in_simulation_md_runs(tmp_path: Path) -> None:
    doc = (ROOT / "docs" / "simulation.md").read_text()
    (command,) = re.findall(r"`(make -C simulator/fakenvml [^`]*)`", doc)
    if not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip("no .venv here (make install makes it)")
    build = tmp_path / "build"
    done = subprocess.run(
        f"{command} BUILD={build}", shell=True, cwd=ROOT, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (build / "libnvidia-ml.so.1").is_file()


@pytest.mark.peer
def test_a_relative_python_for_fakenvml_says_what_to_do(tmp_path: Path) -> None:
    done = subprocess.run(
        ["make", "-s", "-C", "simulator/fakenvml", "PYTHON=.venv/bin/python",
         f"BUILD={tmp_path}"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "give PYTHON an absolute path" in done.stderr
    assert "nvml.h not found" not in done.stderr
