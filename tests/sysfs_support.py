"""Fixture sysfs trees for the sysfs source tests, rendered by the simulator itself."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from exporter.sources import SourceContext
from simulator.scenario import Scenario, load_scenario, parse_scenario
from simulator.sysfs import SysfsPart
from tests.support import Clock


def scenario(text_or_name: str) -> Scenario:
    """A bundled scenario by name, or a scenario from YAML text."""
    if "\n" not in text_or_name:
        return load_scenario(text_or_name)
    return parse_scenario(text_or_name, name="fixture")


def make_tree(tmp_path: Path, text_or_name: str) -> SysfsPart:
    """The simulated node's sysfs part for the scenario, rendered at t=0 under tmp_path."""
    return SysfsPart(scenario(text_or_name), tmp_path)


def context(
    part: SysfsPart, clock: Clock, procfs: Path | None = None, **options: str
) -> SourceContext:
    """`procfs` defaults to an empty directory: no test reads this machine's processes."""
    if procfs is None:
        procfs = part.root.parent / "proc"
        procfs.mkdir(exist_ok=True)
    return SourceContext(sysfs=part.root, procfs=procfs, options=options, clock=clock)


@contextlib.contextmanager
def blocking_file(path: Path) -> Iterator[None]:
    """Replace `path` by a FIFO whose writer never writes: a read of it answers EAGAIN,
    like a driver attribute that has nothing to say (a blocking read would hang). The
    file comes back as it was afterwards."""
    before = path.read_bytes() if path.exists() else None
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    keep_open = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # lets the writer's open return
    writer = os.open(path, os.O_WRONLY)
    try:
        yield
    finally:
        os.close(writer)
        os.close(keep_open)
        path.unlink()
        if before is not None:
            path.write_bytes(before)
