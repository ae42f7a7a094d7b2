"""The docs name only what exists, and say what the code does (issue 42, "Words that disagree
with the code").

Every user-facing text (README.md, docs/*.md, deploy/ READMEs, the chart's NOTES.txt) is read
for what it names: our flags (`--collector.rdma.pool-config`), metric and label names
(`hw_*`, `k8s_*`, `kube_device_exporter_*`, `DCGM_*`), paths in this repository
(`deploy/overlays/k0s`, relative links) and Make targets (`make demo`); each must exist. A
few claims that were found wrong by trying them are checked against their one source of
truth: the host paths docs/security.md says the agent reads are the kit's hostPath volumes,
the GPU a measured figure was taken on is docs/measured.json's, a quoted `cannot start:`
line is what the program prints, the kubelet is asked on no per-minute schedule, no field
is "always served" past the metric groups, and a file a flag names exits 2 when missing.
`test_each_mismatch_found_is_caught` puts each of the seven back into a copy of its text.
"""

from __future__ import annotations

import errno
import os
import re
import socket
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

import pytest
import yaml

from exporter.cli.flags import parse_config
from exporter.cli.parser import UsageError, build_parser
from exporter.metrics import SPECS
from exporter.web.listen import listen_problem

REPO = Path(__file__).resolve().parent.parent


def documents() -> list[Path]:
    chart = REPO / "deploy" / "helm" / "kube-device-exporter" / "templates" / "NOTES.txt"
    return [
        REPO / "README.md",
        *sorted((REPO / "docs").glob("*.md")),
        *sorted((REPO / "deploy").rglob("README.md")),
        chart,
    ]


# --- names ---------------------------------------------------------------------------------

OUR_FLAG = re.compile(
    r"(?<![\w/.-])--(?:no-)?(?:kubernetes|collector|web|metrics|otlp|log|path|attribution)"
    r"(?:\.[a-z0-9-]+)+(?:\.[A-Z]+)?"
)
"""A flag of ours: the dotted families (`--collector.NAME.OPTION`); `.NAME` in capitals is a
placeholder (`--metrics.group.NAME`)."""
EXAMPLES = {
    "--collector.acme": "docs/architecture.md's 'Adding a source' walks through a new source",
    "--no-collector.acme": "the same",
}


@cache
def known_flags() -> frozenset[str]:
    return frozenset(o for o in build_parser()._option_string_actions if o.startswith("--"))


def flag_problems(text: str) -> Iterator[str]:
    for match in OUR_FLAG.finditer(text):
        flag = match.group()
        if re.search(r"\.[A-Z]+$", flag):  # --metrics.group.NAME: a family
            family = flag.rsplit(".", 1)[0] + "."
            if any(known.startswith(family) for known in known_flags()):
                continue
        elif flag in known_flags() or flag in EXAMPLES:
            continue
        yield f"names the flag {flag}, which does not exist"


NAME = re.compile(
    r"(?<![\w.:/-])((?:hw|k8s|kube_device_exporter)_[a-z0-9_]+|DCGM_(?:FI|EXP)_[A-Z0-9_]+)"
)
SUFFIXES = re.compile(r"_(?:total|bucket|sum|count|created)$")
NAME_EXAMPLES = {
    "DCGM_FI_PROF_PIPE_TENSOR_IMMA": "dcgm-exporter's DCP fields IMMA/HMMA/DFMA, a slash list "
    "in docs/migrating-from-dcgm-exporter.md",
}


@cache
def known_names() -> frozenset[str]:
    """Every metric and label name the exporter writes: the metric table (names, attributes,
    OpenTelemetry names), the whole outputs of tests/golden (label names and values of every
    scenario, both schemas), and dcgm-exporter's own field names (tests/data)."""
    names: set[str] = set()
    for spec in SPECS.values():
        names |= {spec.prom_name, spec.name.replace(".", "_")}
        names |= {a.replace(".", "_") for a in spec.attributes}
    for golden in (REPO / "tests" / "golden").glob("*.prom"):
        names |= set(NAME.findall(golden.read_text()))
    csv = REPO / "tests" / "data" / "dcgm-exporter-default-counters.csv"
    names |= set(re.findall(r"DCGM_(?:FI|EXP)_[A-Z0-9_]+", csv.read_text()))
    return frozenset(names)


def name_problems(text: str) -> Iterator[str]:
    for name in NAME.findall(text):
        if name.endswith("_"):  # a family: `hw_gpu_container_*`, `k8s_pod_label_<key>`
            if any(k.startswith(name) for k in known_names()) or name == "k8s_pod_label_":
                continue
        elif name.startswith("k8s_pod_label_"):
            continue  # one per allowed pod label key
        elif {name, SUFFIXES.sub("", name)} & known_names() or name in NAME_EXAMPLES:
            continue
        yield f"names the metric or label {name}, which the exporter does not write"


TOPS = "exporter|simulator|tests|bench|monitoring|deploy|docs|dashboards|proto|requirements"
REPO_PATH = re.compile(rf"(?<![\w./-])((?:{TOPS})/[\w./*-]*)")
PACKAGES = sorted(p.name for p in (REPO / "exporter").iterdir() if (p / "__init__.py").exists())
MODULE_PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(PACKAGES)})/[\w/]*\.py)\b")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
PATH_EXAMPLES = {"exporter/sources/acme.py": "the source of docs/architecture.md's example"}


def path_problems(document: Path, text: str) -> Iterator[str]:
    for match in REPO_PATH.finditer(text):
        path = match.group(1).rstrip(".,;:")
        if path not in PATH_EXAMPLES and not list(REPO.glob(path.rstrip("/"))):
            yield f"names {path}, which is not in the repository"
    for match in MODULE_PATH.finditer(text):  # `cycle/poller.py`: a module of the package
        if not (REPO / "exporter" / match.group(1)).exists():
            yield f"names the module {match.group(1)}, which exporter/ does not have"
    for match in LINK.finditer(text):
        target = match.group(1)
        if "://" in target or target.startswith("mailto:"):
            continue
        if not (document.parent / target).exists():
            yield f"links to {target}, which does not exist"


@cache
def make_targets() -> frozenset[str]:
    text = (REPO / "Makefile").read_text()
    return frozenset(re.findall(r"^([A-Za-z0-9_-]+):(?!=)", text, re.MULTILINE))


def code(text: str) -> Iterator[str]:
    """Backtick spans (over line breaks, as Markdown reads them) and fenced code lines."""
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.DOTALL | re.MULTILINE)
    yield from (line for block in fenced for line in block.splitlines())
    without = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.DOTALL | re.MULTILINE)
    yield from (" ".join(span.split()) for span in re.findall(r"`([^`]+)`", without))


def make_problems(text: str) -> Iterator[str]:
    for span in code(text):
        for target in re.findall(r"(?:^|[;&|(]\s*)make ((?:[a-z][\w-]*))", span.strip()):
            if target not in make_targets():
                yield f"runs `make {target}`, which the Makefile does not have"


# --- claims, each against its one source of truth ---------------------------------------------


def sentences(text: str) -> Iterator[str]:
    """Table cells, and the sentences of each paragraph (over its line breaks)."""
    for paragraph in re.split(r"\n\s*\n", text):
        if paragraph.lstrip().startswith("|"):
            yield from paragraph.split("|")
        else:
            yield from re.split(r"(?<=[.!?])\s+", " ".join(paragraph.split()))


@cache
def kit_host_paths() -> frozenset[str]:
    daemonset = yaml.safe_load((REPO / "deploy" / "base" / "daemonset.yaml").read_text())
    volumes = daemonset["spec"]["template"]["spec"]["volumes"]
    return frozenset(v["hostPath"]["path"] for v in volumes if "hostPath" in v)


def host_path_problems(document: Path, text: str) -> Iterator[str]:
    """docs/security.md's table of what the agent reads: every host path said to be read is
    under one of the kit's hostPath volumes (a clause saying `not mounted` is skipped)."""
    if document.name != "security.md":
        return
    table = text.split("## What the agent reads on the node", 1)[-1].split("\n\n", 2)[1]
    for row in table.splitlines()[2:]:
        where = row.split("|")[2]
        for clause in where.split(";"):
            if "not mounted" in clause:
                continue
            for path in re.findall(r"`(/[^`]+)`", clause):
                path = path.removeprefix("/host") or "/"
                if not any(path == p or path.startswith(p + "/") for p in kit_host_paths()):
                    yield f"says the agent reads {path}, which the kit does not mount"


def measured_model_problems(text: str) -> Iterator[str]:
    """A figure of docs/measured.json (`<!-- measured:KEY -->`) said to be from a GPU model
    (the last `on a real MODEL` before it on its line) was measured on that model."""
    import json

    measured = json.loads((REPO / "docs" / "measured.json").read_text())
    for line in text.splitlines():
        for marker in re.finditer(r"<!-- measured:([\w.]+) -->", line):
            models = re.findall(r"on an? real ([A-Z]\d{2,4}\w*)", line[: marker.start()])
            machine = measured.get(marker.group(1), {}).get("machine", "")
            if models and models[-1] not in machine:
                yield f"says {marker.group(1)} was measured on a {models[-1]}: {machine}"


def schedule_problems(text: str) -> Iterator[str]:
    """The kubelet is asked on change and every --kubernetes.poll-interval: no per-minute
    schedule (architecture.md, The kubelet)."""
    for cell in sentences(text):
        if re.search(r"\b(List|GetAllocatableResources)\b", cell) and re.search(
            r"once a minute|every minute|once per minute", cell
        ):
            yield f"puts the kubelet on a per-minute schedule: {cell.strip()[:100]}"


def served_problems(text: str) -> Iterator[str]:
    """What is served is the metric groups' choice: no claim that every field is."""
    for sentence in sentences(text):
        claim = re.search(
            r"every (?:field|metric|series)\b[^.]*\b(?:is|are) (?:served|exported)", sentence
        )
        if claim and "group" not in sentence:
            yield f"says every field is served, past the metric groups: {claim.group()}"


def error_text_problems(text: str) -> Iterator[str]:
    """A quoted `cannot start:` line (`...` for what varies) is one the exporter prints."""
    for span in code(text):
        if not span.startswith("cannot start:"):
            continue
        shown = re.search(r"--web\.listen-address (\S+?):(\d+):", span)
        address = (shown.group(1), int(shown.group(2))) if shown else ("127.0.0.1", 9405)
        printed = [
            "cannot start: " + listen_problem(address, OSError(code, os.strerror(code)))
            for code in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES)
        ]
        printed.append("cannot start: " + listen_problem(address, socket.gaierror(-2, "unknown")))
        pattern = ".*".join(re.escape(part) for part in span.split("..."))
        if not any(re.fullmatch(pattern, line) for line in printed):
            yield f"quotes `{span}`, which the exporter does not print"


FILE_FLAGS = {
    "--web.config.file": [],
    "--kubernetes.kubeconfig": ["--kubernetes.api", "--node-name", "n"],
    "--collector.rdma.pool-config": [],
}
"""Files of the user's that a flag names, and what else makes the exporter read the file."""


@cache
def exits_2_when_missing(flag: str) -> bool:
    try:
        parse_config([flag, "/nonexistent/kde-file", *FILE_FLAGS[flag]], env={})
    except UsageError as exc:
        return flag in str(exc)
    return False


def file_flag_problems(text: str) -> Iterator[str]:
    """README's rule (a file a flag names that cannot be read at start exits 2) holds for each
    flag it lists, and no text says such a file is only warned about."""
    rule = re.search(r"so does a file of yours that a flag names(.*?)\.\s", text, re.DOTALL)
    for flag in re.findall(r"`(--[\w.-]+)`", rule.group(1)) if rule else ():
        if flag in FILE_FLAGS and not exits_2_when_missing(flag):
            yield f"says a missing {flag} file exits 2, but it does not"
    for sentence in sentences(text):
        for flag in FILE_FLAGS:
            if (
                flag in sentence
                and "exits 2" not in sentence
                and re.search(r"missing|cannot be read|unreadable|does not exist", sentence)
                and re.search(r"warn|logged|keeps serving|only logs", sentence)
                and exits_2_when_missing(flag)
            ):
                yield f"says a missing {flag} file is only warned about; it exits 2"


# --- together --------------------------------------------------------------------------------

CHECKS: tuple[Callable[[Path, str], Iterator[str]], ...] = (
    lambda _, text: flag_problems(text),
    lambda _, text: name_problems(text),
    path_problems,
    lambda _, text: make_problems(text),
    host_path_problems,
    lambda _, text: measured_model_problems(text),
    lambda _, text: schedule_problems(text),
    lambda _, text: served_problems(text),
    lambda _, text: error_text_problems(text),
    lambda _, text: file_flag_problems(text),
)


def problems(document: Path, text: str | None = None) -> list[str]:
    text = document.read_text() if text is None else text
    where = document.relative_to(REPO)
    return [f"{where}: {p}" for check in CHECKS for p in check(document, text)]


def test_the_docs_name_only_what_exists_and_say_what_the_code_does() -> None:
    found = [p for document in documents() for p in problems(document)]
    assert found == []


MISMATCHES = [
    pytest.param(
        "docs/security.md",
        "| container-log links | `/var/log/containers` mounted read-only at "
        "`/host/var/log/containers` (`--path.container-logs`); their targets under "
        "`/var/log/pods` are not mounted |",
        "| pod logs directory | `/var/log/pods` read-only |",
        "reads /var/log/pods",
        id="1-security-pod-logs-mounted",
    ),
    pytest.param(
        "docs/device-ids.md",
        "(`--collector.rdma.pool-config`)",
        "(`--collector.rdma.pools`)",
        "--collector.rdma.pools",
        id="2-device-ids-rdma-pools-flag",
    ),
    pytest.param(
        "docs/security.md",
        "`GetAllocatableResources` with it, at most every 5 s",
        "`GetAllocatableResources` once a minute",
        "per-minute schedule",
        id="3-security-allocatable-once-a-minute",
    ),
    pytest.param(
        "docs/migrating-from-dcgm-exporter.md",
        "| `--metrics.group.NAME`: metric groups, not fields; with `--metrics.schema=dcgm` the "
        "groups of the default counters are on unless named off (above); `--collector.NAME` "
        "switches whole sources |",
        "| none: every field the hardware supports is served (`--collector.NAME` switches "
        "whole sources) |",
        "every field",
        id="4-migrating-every-field-served",
    ),
    pytest.param(
        "README.md",
        "on a real H200 at a 1 s interval",
        "on a real H100 at a 1 s interval",
        "measured on a H100",
        id="5-readme-h100",
    ),
    pytest.param(
        "docs/simulation.md",
        "(`cannot start: --web.listen-address 127.0.0.1:9999: port 9999 is in use by another\n"
        "process (another exporter?); pick another port, or stop the other process`)",
        "(`cannot start: ... address already in use`)",
        "does not print",
        id="6-simulation-port-error-text",
    ),
    pytest.param(
        "README.md",
        "the exporter serves what it can until it appears.",
        "the exporter serves what it can until it appears. A missing "
        "`--collector.rdma.pool-config` file is logged as a warning and the exporter keeps "
        "serving.",
        "only warned about",
        id="7-readme-files-named-by-flags",
    ),
]


@pytest.mark.parametrize(("name", "now", "then", "says"), MISMATCHES)
def test_each_mismatch_found_is_caught(name: str, now: str, then: str, says: str) -> None:
    document = REPO / name
    text = document.read_text()
    assert now in text, f"{name} no longer says {now!r}: update this test's copy of it"
    found = problems(document, text.replace(now, then))
    assert any(says in p for p in found), found


def test_a_missing_file_a_flag_names_exits_2_naming_it() -> None:
    """README's rule, each flag of it: what the file-flag check relies on."""
    assert all(exits_2_when_missing(flag) for flag in FILE_FLAGS)
