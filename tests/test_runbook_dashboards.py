"""Runbooks name dashboards, rows and panels that exist (issue 31, item 11).

docs/runbooks.md pointed six times to a dashboard *Devices / Workloads* that was never
generated. monitoring/runbooks.py now writes every pointer as `dashboard *TITLE*` (optionally
`, row *ROW*` or `, panel *PANEL*`) from the dashboard modules' titles; this test reads the
generated page against the generated dashboards/*.json, so a renamed dashboard, row or panel
fails it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
POINTER = re.compile(
    r"dashboard \*(?P<title>[^*]+)\*(?:, (?P<kind>row|panel) \*(?P<part>[^*]+)\*)?"
)


def dashboards() -> dict[str, dict[str, set[str]]]:
    """title -> {"row": row titles, "panel": panel titles} of every generated dashboard."""
    out = {}
    for path in sorted((ROOT / "dashboards").glob("*.json")):
        model = json.loads(path.read_text())
        panels = model["panels"] + [p for row in model["panels"] for p in row.get("panels", [])]
        out[model["title"]] = {
            "row": {p["title"] for p in panels if p["type"] == "row"},
            "panel": {p["title"] for p in panels if p["type"] != "row"},
        }
    return out


def pointers(text: str) -> list[tuple[str, str, str]]:
    return [(m["title"], m["kind"] or "", m["part"] or "") for m in POINTER.finditer(text)]


def test_every_dashboard_a_runbook_names_exists() -> None:
    boards = dashboards()
    text = (ROOT / "docs" / "runbooks.md").read_text()
    found = pointers(text)
    assert len(found) >= 6
    for title, kind, part in found:
        assert title in boards, f"runbooks.md names dashboard {title!r}; there are {sorted(boards)}"
        if kind:
            assert part in boards[title][kind], f"{title!r} has no {kind} {part!r}"


def test_no_dashboard_is_named_any_other_way() -> None:
    """`the *Workloads* dashboard`: a free-form name the test above would not see."""
    text = (ROOT / "docs" / "runbooks.md").read_text()
    mentions = len(re.findall(r"\bdashboard\b", text, re.I))
    assert mentions == len(pointers(text)), "write dashboard pointers with runbooks.see()"


def test_a_missing_dashboard_or_panel_is_caught() -> None:
    boards = dashboards()
    ((title, kind, part),) = pointers("dashboard *Devices / Workloads*, row *Who uses what*")
    assert title not in boards
    ((title, kind, part),) = pointers("dashboard *Devices / Namespaces and pods*, panel *Nope*")
    assert part not in boards[title][kind]
