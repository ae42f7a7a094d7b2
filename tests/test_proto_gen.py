"""The committed exporter/_proto/ is exactly what proto/generate.sh writes."""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    out = tmp_path / "_proto"
    done = subprocess.run(
        [str(ROOT / "proto" / "generate.sh"), str(out)],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    committed = ROOT / "exporter" / "_proto"
    generated = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    existing = sorted(
        p.relative_to(committed)
        for p in committed.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    assert generated == existing
    stale = [str(p) for p in generated if not filecmp.cmp(out / p, committed / p, shallow=False)]
    assert not stale, f"regenerate with `make proto`: {stale}"
