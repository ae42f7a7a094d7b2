"""Fixtures for tests of the NVML source against the simulated libnvidia-ml.so.1.

The library is loaded into the test process by absolute path before pynvml's first
nvmlInit; glibc then answers pynvml's own `CDLL("libnvidia-ml.so.1")` with it (the soname
matches a loaded object), so the unmodified binding runs our library. An unbuilt library
fails every test that needs it, with the command that builds it.

Use in a test module: `from tests.nvml_support import fakenvml, nvidia_node`.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from exporter.model import SourceResult
from exporter.sources import SourceContext
from exporter.sources.nvml import NvmlSource
from simulator import nvml as simnvml
from simulator.scenario import Scenario, load_scenario, parse_scenario


class NvidiaNode:
    """The simulated NVIDIA driver of one test: move time, make sources, count calls."""

    def __init__(self, lib: ctypes.CDLL, scenario: Scenario, workdir: Path) -> None:
        self.lib = lib
        self.scenario = scenario
        self.part = simnvml.make_part(scenario, workdir)
        self.now = 0.0
        self.sources: list[NvmlSource] = []
        lib.fakenvml_reset_counts()
        lib.fakenvml_new_process()  # a new node: the library has mapped no driver yet
        self.at(0.0)

    def at(self, t: float) -> None:
        """Scenario time t for the library and for the sources' clock."""
        self.now = t
        self.part.advance(t)

    def source(self, **options: str) -> NvmlSource:
        ctx = SourceContext(options=options, clock=lambda: self.now)
        source = NvmlSource(ctx)
        self.sources.append(source)
        return source

    def collect_at(self, source: NvmlSource, t: float) -> SourceResult:
        self.at(t)
        return source.collect()

    def calls(self, function: str) -> int:
        return int(self.lib.fakenvml_call_count(function.encode()))

    def close(self) -> None:
        for source in self.sources:
            source.close()
        self.part.close()


@pytest.fixture(scope="session")
def fakenvml() -> ctypes.CDLL:
    try:
        lib = simnvml.preload_library()
    except simnvml.FakeNvmlNotBuilt as exc:
        pytest.fail(str(exc))
    lib.fakenvml_call_count.restype = ctypes.c_ulonglong
    lib.fakenvml_call_count.argtypes = [ctypes.c_char_p]
    return lib


@pytest.fixture
def nvidia_node(
    fakenvml: ctypes.CDLL, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[str], NvidiaNode]]:
    """`nvidia_node("dense")` or `nvidia_node(yaml_text)`: a simulated driver for this test."""
    nodes: list[NvidiaNode] = []

    def make(scenario: str) -> NvidiaNode:
        loaded = (
            parse_scenario(scenario, name="test") if "\n" in scenario else load_scenario(scenario)
        )
        node = NvidiaNode(fakenvml, loaded, tmp_path / f"node{len(nodes)}")
        monkeypatch.setenv(simnvml.STATE_ENV, str(node.part.state_path))
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        node.close()
