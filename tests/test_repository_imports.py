"""No import circle among the modules beside the product (the simulated node, the monitoring
kit's generators, the bench and the tests), and no module importing a test module: what
several test modules share lives in tests/support (tests/test_architecture.py holds the
product, exporter/, to the same rule)."""

from __future__ import annotations

import functools

from tests.support.imports import circles, graph

FOLDERS = ("simulator", "monitoring", "bench", "tests")


@functools.cache
def _edges() -> dict[str, set[str]]:
    return graph(*FOLDERS)


def test_no_import_circles_beside_the_product() -> None:
    assert circles(_edges()) == []


def test_no_module_imports_a_test_module() -> None:
    edges = _edges()
    found = {(a, b) for a, targets in edges.items() for b in targets if b.startswith("tests.test_")}
    assert sorted(found) == [], "move what they share to tests/support"


def test_the_walker_finds_circles_and_only_circles() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"a", "x"}}
    assert circles(edges) == [["a", "b", "c"], ["d", "e"]]
    assert circles({"a": {"b"}, "b": set()}) == []
