"""The committed exporter/_proto/ and tests/_proto/ are exactly what proto/generate.sh
writes (the product's protos, and the test peers' protos such as the device plugin's)."""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.peer

ROOT = Path(__file__).resolve().parent.parent


def files(tree: Path) -> list[Path]:
    return sorted(
        p.relative_to(tree) for p in tree.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    )


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gen")
    done = subprocess.run(
        [str(ROOT / "proto" / "generate.sh"), str(out / "exporter"), str(out / "tests")],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return out


@pytest.mark.parametrize("tree", ["exporter", "tests"])
def test_generated_code_is_up_to_date(generated: Path, tree: str) -> None:
    out = generated / tree
    committed = ROOT / tree / "_proto"
    assert files(out) == files(committed)
    stale = [str(p) for p in files(out) if not filecmp.cmp(out / p, committed / p, shallow=False)]
    assert not stale, f"regenerate with `make proto`: {stale}"
