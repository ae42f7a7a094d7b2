"""The house rules a reader relies on: the product's rooms stand on floors and every import
runs down (so there is no circle), the settings are a leaf and the command line the top, at
most MAX_TOP_MODULES modules at the top of exporter/, no module over MAX_LINES but the data
tables, and the layout docs/architecture.md describes is the one on disk."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

from tests.support.imports import circles

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


def test_no_import_circles_among_exporter_modules() -> None:
    assert circles(_graph()) == []


def test_the_walker_finds_a_circle_when_there_is_one() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]


_FOLDER = re.compile(r"^(\w+)/$")
_MODULE = re.compile(r"^\w+\.py$")


def _layout_text() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    layout = text[text.index("## Layout") :]
    start = layout.index("```") + 3
    return layout[start : layout.index("```", start)]


def _named_in_layout(layout: str) -> set[str]:
    """The modules and folders a layout block names, as paths under exporter/
    (`sources/nvml/xid.py`, `sources/nvml/`).

    A `name/` as a line's first word opens a folder inside the one whose line is less
    indented; a line indented no deeper than a folder's leaves it (continuation lines sit in
    the names column, deeper than any folder, and start with a module). Every `*.py` word
    belongs to the folder open on its line, and so does a `name/` word after the first.
    Folders at the left margin other than exporter/ are beside the package."""
    named: set[str] = set()
    open_folders: list[tuple[int, str]] = []  # (indent, path under exporter/; None: outside)
    outside = False
    for line in layout.splitlines():
        words = line.split()
        if not words:
            continue
        indent = len(line) - len(line.lstrip())
        while open_folders and open_folders[-1][0] >= indent:
            open_folders.pop()
        folder = _FOLDER.match(words[0])
        if indent == 0:
            outside = not (folder and folder[1] == "exporter")
            words = words[1:] if folder else words
        elif folder:
            parent = open_folders[-1][1] if open_folders else ""
            open_folders.append((indent, f"{parent}{folder[1]}/"))
        if outside:
            continue
        here = open_folders[-1][1] if open_folders else ""
        named |= {here + word for word in words if _MODULE.match(word)}
        if folder and indent:
            words = words[1:]
            named.add(here)
        named |= {f"{here}{word}" for word in words if _FOLDER.match(word)}
    return named


def _modules_on_disk() -> set[str]:
    return {
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if "_proto" not in path.relative_to(PACKAGE).parts
    }


def test_the_layout_names_every_module_and_only_modules_that_exist() -> None:
    """A folder's `__init__.py` is named by the folder."""
    named, on_disk = _named_in_layout(_layout_text()), _modules_on_disk()
    assert len(on_disk) > 60, on_disk
    unnamed = sorted(
        m for m in on_disk if m not in named and m.removesuffix("__init__.py") not in named
    )
    assert unnamed == [], f"docs/architecture.md's layout does not name {unnamed}"
    gone = sorted(n for n in named if not (PACKAGE / n).exists())
    assert gone == [], f"docs/architecture.md's layout names modules that are gone: {gone}"


def test_the_layout_reader_places_names_in_their_folders() -> None:
    layout = """
exporter/
  app.py join.py                 the composition root
  sources/       counters.py     the counter rule
                 rdma.py nvml/   vendors
    nvml/        xid.py
                 calls.py        continuation in the names column
  poller.py                      back at the top
monitoring/      metricdoc.py    beside the package: not exporter's
"""
    assert _named_in_layout(layout) == {
        "app.py",
        "join.py",
        "sources/",
        "sources/counters.py",
        "sources/rdma.py",
        "sources/nvml/",
        "sources/nvml/xid.py",
        "sources/nvml/calls.py",
        "poller.py",
    }


@functools.cache
def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_no_source_imports_the_join() -> None:
    """Sources name their devices with exporter.ids; the join is downstream of them."""
    graph = _graph()
    reaching = sorted(
        n for n in graph if _under(n, "exporter.sources") and "exporter.join" in graph[n]
    )
    assert reaching == []


def test_no_sink_nor_the_web_side_imports_a_source() -> None:
    """Sinks and the HTTP side read snapshots and the metric table, never a source (data
    flows one way; the dcgm sink's throttle bits come from the metric table)."""
    graph = _graph()
    reaching = sorted(
        f"{n} -> {target}"
        for n in graph
        if _under(n, "exporter.sinks") or _under(n, "exporter.web")
        for target in graph[n]
        if _under(target, "exporter.sources")
    )
    assert reaching == []


def test_only_the_cycle_and_the_checks_import_the_join() -> None:
    """The cycle's join step runs the join (its pipeline carries the result); the checks
    (doctor, landing page) explain it."""
    graph = _graph()
    importers = sorted(n for n, targets in graph.items() if "exporter.join" in targets)
    assert importers == ["exporter.checks", "exporter.cycle.pipeline", "exporter.cycle.steps"]


FLOORS: dict[str, int] = {
    "exporter.settings": 0,
    "exporter.reading": 0,
    "exporter.model": 1,
    "exporter.ids": 2,
    "exporter.metrics": 2,
    "exporter.runtime": 2,
    "exporter.points": 3,
    "exporter.attribution": 3,
    "exporter.kubeapi": 3,
    "exporter.podresources": 3,
    "exporter._proto": 3,
    "exporter.derive": 4,
    "exporter.sources": 4,
    "exporter.dra": 4,
    "exporter.join": 5,
    "exporter.sinks": 5,
    "exporter.checks": 6,
    "exporter.web": 7,
    "exporter.cycle": 7,
    "exporter.app": 8,
    "exporter.cli": 9,
    "exporter.__main__": 10,
}
"""Each room of exporter/ (a top-level module or package) and its floor: a module imports
only from its own room or from a room on a lower floor. The settings are the ground (they
import nothing else of the product), the command line is the top (nothing but
`python -m exporter` imports it)."""


def _room(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import that does not run down to a lower floor (or stay in its room)."""
    out = []
    for name, targets in graph.items():
        for target in targets:
            a, b = _room(name), _room(target)
            if a != b and "exporter" not in (a, b) and FLOORS[b] >= FLOORS[a]:
                out.append(f"{name} -> {target} ({a} floor {FLOORS[a]}, {b} floor {FLOORS[b]})")
    return sorted(out)


def test_every_room_has_a_floor() -> None:
    rooms = {_room(n) for n in _modules()} - {"exporter"}
    assert sorted(rooms - set(FLOORS)) == []
    assert sorted(set(FLOORS) - rooms - {"exporter._proto"}) == []


def test_every_import_runs_down() -> None:
    """No import runs upward (so no circle between rooms): the settings import nothing else
    of the product, and no module below cli/ imports it."""
    assert _upward(_graph()) == []


def test_the_floor_check_finds_an_import_that_runs_up() -> None:
    graph = {"exporter.settings.table": {"exporter.cli.flags"}, "exporter.cli.flags": set()}
    assert _upward(graph) == [
        "exporter.settings.table -> exporter.cli.flags (exporter.settings floor 0, "
        "exporter.cli floor 9)"
    ]


MAX_TOP_MODULES = 12
"""Modules at the top of exporter/ besides __init__ and __main__: the rest lives in rooms."""


def test_the_top_of_the_package_holds_few_modules() -> None:
    top = sorted(
        p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")
    )
    assert len(top) <= MAX_TOP_MODULES, top


def test_the_import_rules_see_imports_inside_functions_too(tmp_path: Path) -> None:
    package = tmp_path / "exporter"
    (package / "sinks").mkdir(parents=True)
    (package / "sources").mkdir()
    for name in ("__init__.py", "sinks/__init__.py", "sources/__init__.py", "sources/nvml.py"):
        (package / name).write_text("")
    (package / "sinks" / "dcgm.py").write_text("def f():\n    from exporter.sources import nvml\n")
    modules = _modules(package)
    dcgm = _imports("exporter.sinks.dcgm", modules["exporter.sinks.dcgm"], modules)
    assert dcgm == {"exporter.sources.nvml"}


def test_the_layout_names_every_simulator_module() -> None:
    layout = _layout_text()
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
    "exporter/settings/table.py": "the settings table: one row per flag with its typed "
    "default and help, and the metric groups",
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
