"""`python -m monitoring [--check]`: write the generated dashboards and rules, or check them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from monitoring.render import files

ROOT = Path(__file__).resolve().parent.parent


def stale(root: Path = ROOT) -> list[str]:
    """Generated files whose committed text differs from what the generator makes now."""
    return [
        path
        for path, text in files().items()
        if not (root / path).is_file() or (root / path).read_text() != text
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m monitoring", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if a file is out of date")
    args = parser.parse_args(argv)
    if args.check:
        out_of_date = stale()
        for path in out_of_date:
            print(f"out of date: {path} (run: python -m monitoring)", file=sys.stderr)
        return 1 if out_of_date else 0
    for path, text in files().items():
        target = ROOT / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.is_file() or target.read_text() != text:
            target.write_text(text)
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
