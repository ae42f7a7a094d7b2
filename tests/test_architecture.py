"""The house rules a reader relies on: no import circles among exporter/ modules, no module
over MAX_LINES but the data tables, and the layout docs/architecture.md describes is the one
on disk."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "exporter"
SIMULATOR = ROOT / "simulator"
"""The simulated node: beside the product, never imported by it."""


def _modules(package: Path = PACKAGE) -> dict[str, Path]:
    found = {}
    for path in package.rglob("*.py"):
        if "_proto" in path.relative_to(package).parts:
            continue  # generated
        name = ".".join(path.relative_to(package.parent).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every exporter module `name` imports, at the top or inside a function."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            targets = [base, *(f"{base}.{a.name}" for a in node.names)]
            # `from pkg import submodule` imports the submodule, not (only) the package
            if any(t in modules for t in targets[1:]):
                targets = targets[1:]
        else:
            continue
        out |= {t for t in targets if t in modules and t != name}
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_circles_among_exporter_modules() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _cycles(graph) == []


def test_the_walker_finds_a_circle_when_there_is_one() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]


def test_every_module_the_layout_names_exists() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    layout = text[text.index("## Layout") :]
    layout = layout[: layout.index("```", layout.index("```") + 3)]
    for name in ("poller.py", "join.py", "checks.py", "flags.py", "threads.py", "numa.py"):
        assert name in layout, f"docs/architecture.md's layout misses {name}"
    named = set(re.findall(r"[\w.]+\.py\b", layout))
    assert len(named) > 40, named
    missing = sorted(
        name for name in named if not list(PACKAGE.rglob(name)) + list(SIMULATOR.rglob(name))
    )
    assert missing == [], f"docs/architecture.md's layout names modules that are gone: {missing}"
    simulated = layout[layout.index("\nsimulator/") :]
    unnamed = sorted(
        p.name for p in SIMULATOR.glob("*.py") if p.name not in simulated + "__init__.py"
    )
    assert unnamed == [], f"docs/architecture.md's simulator/ layout misses {unnamed}"


def test_the_product_never_imports_the_simulator_or_the_tests() -> None:
    """The wheel and the image carry exporter/ alone: an import of the simulated node or a
    test harness from it would fail on a node, or drag test tooling into the product."""
    reaching = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                targets = [node.module or ""]
            else:
                continue
            reaching += [
                f"{name}: {t}" for t in targets if t.split(".")[0] in ("simulator", "tests")
            ]
    assert reaching == []


MAX_LINES = 400
"""A module a reader can hold in their head; split a longer one along its concerns."""

LONG_TABLES = {
    "exporter/metrics.py": "the metric-spec table: one row per metric and attribute, the "
    "row type and the name translation every row uses",
}
"""Modules allowed over MAX_LINES, each with why. Generated code (`exporter/_proto`) is out."""


def _long_modules(limit: int, package: Path = PACKAGE) -> dict[str, int]:
    """Every module under `package` over `limit` lines -> its line count, by its path."""
    counts = {}
    for path in _modules(package).values():
        lines = len(path.read_text().splitlines())
        if lines > limit:
            counts[path.relative_to(package.parent).as_posix()] = lines
    return counts


def test_no_module_is_longer_than_the_limit_but_the_tables() -> None:
    over = _long_modules(MAX_LINES)
    offenders = [f"{n}: {lines} lines" for n, lines in sorted(over.items()) if n not in LONG_TABLES]
    assert offenders == [], f"over {MAX_LINES} lines (split along its concerns): {offenders}"
    stale = sorted(set(LONG_TABLES) - set(over))
    assert stale == [], f"allowed over {MAX_LINES} lines but no longer are: drop {stale}"


def test_the_length_check_counts_lines_and_skips_generated_code(tmp_path: Path) -> None:
    package = tmp_path / "exporter"
    (package / "sinks").mkdir(parents=True)
    (package / "_proto").mkdir()
    (package / "short.py").write_text("x = 1\n" * 400)
    (package / "sinks" / "long.py").write_text("x = 1\n" * 401)
    (package / "_proto" / "api_pb2.py").write_text("x = 1\n" * 5000)
    assert _long_modules(400, package) == {"exporter/sinks/long.py": 401}
