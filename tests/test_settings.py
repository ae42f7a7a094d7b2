"""One declaration per setting (exporter/settings): each flag's default is written in its row
of the settings table (or, for a source option, in its source's declared options) and
nowhere else; Config, the parser and every component with a default of its own read it
from there."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from exporter.cli.flags import parse_config
from exporter.settings.config import DEFAULTS, Config, OtlpConfig
from exporter.settings.table import BY_DEST, FLAGS
from exporter.sources import registry

PACKAGE = Path(__file__).resolve().parent.parent / "exporter"
TABLE = PACKAGE / "settings" / "table.py"


def _rows() -> list[tuple[str, str, Any]]:
    """(dest, default as shown, typed default) of every flag and source option."""
    rows = [(row.dest, row.default, row.value) for row in FLAGS]
    for info in registry().values():
        rows += [(o.name.replace("-", "_"), o.default, o.parse(o.default)) for o in info.options]
    return rows


def test_config_takes_every_flag_default_from_its_row() -> None:
    fields = {f.name: f for f in dataclasses.fields(Config)}
    otlp = {f"otlp_{f.name}": f for f in dataclasses.fields(OtlpConfig)}
    for row in FLAGS:
        field = fields.get(row.dest) or otlp[row.dest]
        assert field.default == row.value, row.flag


def test_no_flag_and_no_variable_give_the_rows_defaults() -> None:
    config = parse_config(["--node-name", "n1"], env={})
    for row in FLAGS:
        if row.dest.startswith("otlp_"):
            assert getattr(config.otlp, row.dest.removeprefix("otlp_")) == row.value
        elif row.dest != "node_name":
            assert getattr(config, row.dest) == row.value, row.flag
    assert dataclasses.replace(config, node_name="", collectors=frozenset(), source_options={}) == (
        DEFAULTS
    )


def test_every_source_option_default_parses_with_its_own_type() -> None:
    for info in registry().values():
        for option in info.options:
            option.parse(option.default)  # a bad default fails at import, not at a user


def _default_positions(tree: ast.AST) -> list[tuple[int, str, ast.expr]]:
    """(line, name, value) of every default in a module: parameter defaults, class-level
    field defaults, `.get(key, default)` and `x or default` (name "" when there is none)."""
    out: list[tuple[int, str, ast.expr]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            positional = args.posonlyargs + args.args
            tail = positional[len(positional) - len(args.defaults) :]
            out += [(d.lineno, a.arg, d) for a, d in zip(tail, args.defaults, strict=True)]
            out += [
                (d.lineno, a.arg, d)
                for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
                if d is not None
            ]
        elif isinstance(node, ast.ClassDef):
            out += [
                (s.lineno, s.target.id, s.value)
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.value
            ]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and len(node.args) == 2
        ):
            out.append((node.lineno, "", node.args[1]))
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            out.append((node.lineno, "", node.values[-1]))
    return out


def _same_setting(name: str, value: Any, rows: list[tuple[str, str, Any]]) -> str | None:
    """The row whose default `value` (a literal at a default position named `name`) repeats."""
    for dest, shown, typed in rows:
        if isinstance(value, str) and "/" in value and value in (shown, str(typed)):
            return dest
        if isinstance(value, tuple) and value and value == typed:
            return dest
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        words = set(name.split("_")) & set(dest.split("_")) - {"max", "s"}
        if numeric and value == typed and not isinstance(typed, bool) and words:
            return dest
    return None


def _repeats(package: Path) -> list[str]:
    rows = _rows()
    found = []
    for path in sorted(package.rglob("*.py")):
        if "_proto" in path.parts or path == TABLE:
            continue
        for line, name, node in _default_positions(ast.parse(path.read_text())):
            try:
                value = ast.literal_eval(node)
            except ValueError:
                continue
            if isinstance(node, ast.Call) and node.args:  # Path("/sys")
                value = ast.literal_eval(node.args[0])
            dest = _same_setting(name, value, rows)
            if dest is not None:
                found.append(f"{path.relative_to(package.parent)}:{line}: {value!r} is {dest}'s")
    return found


def test_no_default_is_written_a_second_time_in_the_product() -> None:
    assert _repeats(PACKAGE) == []


@pytest.mark.parametrize(
    "code",
    [
        "def f(timeout: float = 5.0) -> None: ...",
        "class C:\n    sysfs: str = '/sys'\n",
        "x = options.get('pods_api_socket', '/var/lib/kubelet/pods-api/pods-api.sock')",
        "def f(max_message_bytes: int = 8388608) -> None: ...",
        "x = y or ('nvidia.com/*', '*.shared', 'amd.com/*', 'gpu.intel.com/*', 'rdma/*', "
        "'intel.com/*', 'mellanox.com/*', 'openshift.io/*')",
    ],
)
def test_the_scan_finds_a_default_written_again(tmp_path: Path, code: str) -> None:
    (tmp_path / "exporter").mkdir()
    (tmp_path / "exporter" / "m.py").write_text(code)
    assert len(_repeats(tmp_path / "exporter")) == 1


def test_sources_type_their_options_only_through_their_declared_rows() -> None:
    """`option_values(OPTIONS, ctx.options)`: a source never re-states a default with
    `ctx.options.get(name, default)`."""
    offenders = []
    for path in (PACKAGE / "sources").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "get"
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "options"
            ):
                offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []


def test_the_shown_default_is_what_the_typed_default_says() -> None:
    """A row with a typed value of its own only describes it in words; every other row's
    text parses to its value (no second source of truth between the two)."""
    described = {row.dest for row in FLAGS if row.default.startswith(("$", "in-cluster"))}
    for row in FLAGS:
        if row.dest in described or row.default in ("", "none"):
            continue
        assert row.parse(row.default) == row.value, row.flag
    assert BY_DEST["node_name"].value == "" and "node_name" in described
