"""The import graph of the repository's Python folders, read with `ast` (nothing is
imported): which of their modules each one imports, at the top or inside a function, and the
circles in it. A circle makes the import order matter and hides which module is the
lower one; the fix is a third module that both import."""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = "_proto"
"""Folders of generated code (protoc's), left out."""


def modules(*folders: str) -> dict[str, Path]:
    """Dotted name -> file of every module under the named top-level folders."""
    found: dict[str, Path] = {}
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if GENERATED in parts:
                continue
            found[".".join(parts).removesuffix(".__init__")] = path
    return found


def _targets(node: ast.AST, package: str) -> Iterator[tuple[str, tuple[str, ...]]]:
    """(module named, names taken from it) for one import statement; relative imports are
    resolved against `package`."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name, ()
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join([*anchor, base] if base else anchor)
        yield base, tuple(alias.name for alias in node.names)


def imported(name: str, path: Path, known: Mapping[str, Path]) -> set[str]:
    """The modules of `known` that module `name` (at `path`) imports. `from pkg import x`
    imports the module pkg.x where there is one, else pkg."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        for module, names in _targets(node, package):
            submodules = {f"{module}.{n}" for n in names} & known.keys()
            found |= submodules or ({module} & known.keys())
    found.discard(name)
    return found


def graph(*folders: str) -> dict[str, set[str]]:
    known = modules(*folders)
    return {name: imported(name, path, known) for name, path in known.items()}


def circles(edges: Mapping[str, Collection[str]]) -> list[list[str]]:
    """Every group of modules that reach each other through imports (a strongly connected
    component of more than one module), each sorted; Tarjan's algorithm, without recursion."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in order:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(edges[start])))]
        order[start] = low[start] = len(order)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, pending = work[-1]
            step = next(pending, None)
            if step is not None and step in edges:
                if step not in order:
                    order[step] = low[step] = len(order)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(edges[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], order[step])
                continue
            if step is not None:
                continue  # a module outside the graph
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == order[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return sorted(found)
