"""`KDE_*` variables that match no flag: a typo would otherwise be ignored without a word."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

NOT_FLAGS = ("KDE_E2E_", "KDE_SIMULATE_", "KDE_FAKENVML_", "KDE_TEST_")
"""Prefixes of the project's own non-flag variables (test rigs, the simulated node)."""


def unknown_variables(env: Mapping[str, str], prefix: str, known: Iterable[str]) -> list[str]:
    """One warning line per `prefix*` variable that is no flag's, with the likeliest meant."""
    names = sorted(set(known))
    lines = []
    for name in sorted(env):
        if not name.startswith(prefix) or name in names or name.startswith(NOT_FLAGS):
            continue
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.8)
        hint = f" (did you mean {close[0]}?)" if close else ""
        lines.append(f"environment variable {name} is not a flag's and is ignored{hint}")
    return lines
