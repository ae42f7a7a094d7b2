"""The simulated NVIDIA driver of a simulated node (scenario section `nvidia:`).

The exporter's NVML source uses the unmodified nvidia-ml-py binding; what it loads is our
compiled `libnvidia-ml.so.1` (fakenvml/, built by `make install`). This part tells the
exporter process where that library is (LD_LIBRARY_PATH: pynvml dlopens it by name, so
the path must be set before the process starts) and keeps the state file the library
serves current: `advance(t)` renders the scenario at time t and replaces the file
atomically, and the library re-reads it on its next call.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from simulator.nvml_scenario import parse_nvidia
from simulator.nvml_spec import NvidiaSpec
from simulator.nvml_state import render
from simulator.scenario import Scenario, load_scenario

FAKENVML_DIR = Path(__file__).parent / "fakenvml"
LIBRARY_NAME = "libnvidia-ml.so.1"
STATE_ENV = "KDE_FAKENVML_STATE"
"""Where the simulated library reads the node's state; unset or missing = no driver."""


class FakeNvmlNotBuilt(RuntimeError):
    pass


def library_dir() -> Path:
    return FAKENVML_DIR / "build"


def library_path() -> Path:
    """The built simulated library; FakeNvmlNotBuilt says how to build it."""
    path = library_dir() / LIBRARY_NAME
    if not path.is_file():
        raise FakeNvmlNotBuilt(
            f"the simulated NVML library is not built ({path} is missing): run `make install`, "
            f"or `make -C {FAKENVML_DIR} PYTHON={sys.executable}` (needs gcc and the "
            "nvidia-nvml-dev package, a dependency of simulator/pyproject.toml)"
        )
    return path


def preload_library() -> ctypes.CDLL:
    """Load the simulated library into this process by absolute path, before pynvml does.

    pynvml's `CDLL("libnvidia-ml.so.1")` is then answered by glibc with this object (the
    soname matches an already-loaded library), so in-process tests and benchmarks need
    no LD_LIBRARY_PATH. Subprocesses find it through `NvmlPart.env()` instead.
    """
    return ctypes.CDLL(str(library_path()), mode=ctypes.RTLD_GLOBAL)


def with_library_dir(ld_library_path: str) -> str:
    """LD_LIBRARY_PATH with the simulated library's directory first (idempotent: the
    kde-simulate runner re-execs until the environment matches)."""
    first = str(library_dir())
    parts = [p for p in ld_library_path.split(":") if p]
    if parts[:1] == [first]:
        return ld_library_path
    return ":".join([first, *parts])


class NvmlPart:
    """`NodePart` for the `nvidia:` section."""

    def __init__(self, spec: NvidiaSpec, workdir: Path, *, epoch_us: int | None = None) -> None:
        self.spec = spec
        self.state_path = workdir / "fakenvml" / "state"
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        self.epoch_us = time.time_ns() // 1000 if epoch_us is None else epoch_us
        self.t = 0.0
        self.generation_path = self.state_path.with_name(self.state_path.name + ".gen")
        self.generation = 0
        self.generation_path.write_bytes(bytes(8))  # before the library's first look

    def env(self) -> dict[str, str]:
        return {
            "LD_LIBRARY_PATH": with_library_dir(os.environ.get("LD_LIBRARY_PATH", "")),
            STATE_ENV: str(self.state_path),
        }

    def exporter_args(self) -> list[str]:
        return []

    def advance(self, t: float) -> None:
        self.t = t
        tmp = self.state_path.with_name(f".{self.state_path.name}.{os.getpid()}.tmp")
        tmp.write_text(render(self.spec, t, self.epoch_us))
        # rename() is atomic: the library never reads half a state (and sees a new inode)
        tmp.replace(self.state_path)
        self._bump()

    def _bump(self) -> None:
        """After each change of the state file, the generation the library maps
        (fakenvml.c, generation_unchanged): a call that sees it unchanged costs no system
        call. The file stays for the node's life (the library maps it once)."""
        self.generation += 1
        fd = os.open(self.generation_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, self.generation.to_bytes(8, sys.byteorder), 0)
        finally:
            os.close(fd)

    def close(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.state_path.unlink()
        self._bump()  # the state is gone: a library still mapping it must look


def make_part(scenario: Scenario, workdir: Path) -> NvmlPart:
    library_path()
    return NvmlPart(parse_nvidia(scenario.sections["nvidia"], scenario.name), workdir)


def measure_collect(
    scenario: str | None = "dense",
    *,
    cycles: int = 20,
    interval: float = 10.0,
    workdir: Path | None = None,
    timer: Callable[[], float] = time.perf_counter,
) -> list[float]:
    """Seconds each of `cycles` NVML collections took (for bench/), in this process.

    With a scenario (and a `workdir` for its state file) the simulated library is
    preloaded and the scenario advances `interval` seconds between collections; with
    `scenario=None` it measures the real driver this process finds. The first cycle
    includes NVML initialization and discovery.
    """
    from exporter.sources import SourceContext
    from exporter.sources.nvml import NvmlSource

    part = None
    if scenario is not None:
        if workdir is None:
            raise ValueError("a simulated scenario needs a workdir for its state file")
        preload_library()
        part = make_part(load_scenario(scenario), workdir)
        os.environ[STATE_ENV] = str(part.state_path)
    source = NvmlSource(SourceContext())
    durations = []
    try:
        for cycle in range(cycles):
            if part is not None:
                part.advance(cycle * interval)
            started = timer()
            source.collect()
            durations.append(timer() - started)
    finally:
        source.close()
        if part is not None:
            part.close()
    return durations
