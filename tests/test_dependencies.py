"""Install-time truths: the declared lower bounds are what the code needs, and every join
example names the node (PCI addresses and `mlx5_0/1` repeat across nodes)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def requirement(name: str) -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (found,) = [d for d in deps if re.match(rf"{re.escape(name)}\b", d)]
    return str(found)


def test_protobuf_lower_bound_is_the_generated_codes_gencode_version() -> None:
    versions = set()
    for path in (ROOT / "exporter" / "_proto").rglob("*_pb2.py"):
        m = re.search(
            r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*"
            r"(\d+),\s*(\d+),\s*(\d+),",
            path.read_text(),
        )
        assert m, path
        versions.add(tuple(int(x) for x in m.groups()))
    assert versions
    newest = max(versions)
    spec = requirement("protobuf")
    lower = re.search(r">=([\d.]+)", spec)
    upper = re.search(r"<(\d+)", spec)
    assert lower and upper, spec
    assert tuple(int(x) for x in lower.group(1).split(".")) == newest, spec
    assert int(upper.group(1)) == newest[0] + 1, "the runtime must share the gencode's major"


def test_opentelemetry_sdk_has_an_upper_bound_above_the_tested_version() -> None:
    from importlib.metadata import version

    spec = requirement("opentelemetry-sdk")
    upper = re.search(r"<([\d.]+)", spec)
    assert upper, f"{spec}: the OTLP sink uses SDK internals, bound it"
    installed = tuple(int(x) for x in version("opentelemetry-sdk").split(".")[:2])
    assert installed < tuple(int(x) for x in upper.group(1).split(".")), spec


def test_every_join_example_names_the_node() -> None:
    from exporter.metrics import SPECS_LIST
    from monitoring.metricdoc import markdown

    texts = [s.help for s in SPECS_LIST] + [markdown()]
    texts += [p.read_text() for p in (ROOT / "docs").glob("*.md")]
    texts.append((ROOT / "README.md").read_text())
    for text in texts:
        assert not re.search(r"on\s*\(\s*hw_id\s*\)", text), text[:200]


def test_nothing_cites_files_outside_the_repository() -> None:
    # users of the project have no ../shared; facts live in docs/ or cite public sources
    needle = "/".join(("shared", "reference"))  # spelled apart so this file does not match
    for folder in (
        "exporter",
        "simulator",
        "tests",
        "docs",
        "proto",
        "monitoring",
        "deploy",
        "bench",
    ):
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix in {".py", ".pyi", ".md", ".proto", ".yaml", ".c"}:
                assert needle not in path.read_text(), path
