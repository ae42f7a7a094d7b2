"""Sources: one module per kind of hardware, one protocol, one registry.

A source module registers itself with `@register(...)`; the registry generates the
`--collector.NAME` / `--no-collector.NAME` flags and any `--collector.NAME.OPTION`
flags the source declares. `collect()` is blocking (NVML calls, file reads) and runs
off the event loop in a worker thread; it returns devices and samples in base units.
Per-field failures are counted in `SourceResult.field_errors`, never raised; raising
means the whole source failed this cycle (reported as `source_success 0`).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from exporter.model import Sample, SourceResult
from exporter.settings import values
from exporter.settings.config import DEFAULTS

SOURCE_MODULES = ("nvml", "amdgpu", "intel", "rdma", "netdev")
"""Modules under exporter/sources/ that hold sources, in the order they are polled."""


class RestartRequired(RuntimeError):
    """Raised by `collect()` when only a new process can recover (the driver was upgraded
    under a library this process mapped): the source fails and /healthz reports the
    message, so the kubelet restarts the container."""


@dataclass(frozen=True, slots=True)
class SourceContext:
    """What a source may know of the world: host paths, its own options, a clock."""

    sysfs: Path = DEFAULTS.sysfs
    procfs: Path = DEFAULTS.procfs
    options: Mapping[str, str] = field(default_factory=dict)
    """The options given for this source, as text (`option_values` types them)."""
    clock: Callable[[], float] | None = None
    """Monotonic seconds; None means `time.monotonic`."""
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("exporter.sources"))


class Source(Protocol):
    def collect(self) -> SourceResult:
        """Read the hardware once. Blocking; called from a worker thread."""
        ...

    def close(self) -> None:
        """Release handles (NVML shutdown, its event set)."""
        ...


@dataclass(frozen=True, slots=True)
class SourceOption:
    """A flag `--collector.<source>.<name>`, env `KDE_COLLECTOR_<SOURCE>_<NAME>`: a row like
    the settings table's (`exporter.settings.table.Flag`), declared once by its source.

    `parse` is the option's value type (`exporter.settings.values`): the CLI runs it on the
    flag, the variable and the default when it parses the other flags, so a bad value exits
    2 naming the flag instead of reaching the source; the source types what it is given with
    `option_values`, the declared default included.
    """

    name: str
    help: str
    default: str = ""
    """The default as --help and the README say it; parsed by `parse` for the value."""
    parse: Callable[[str], Any] = values.text


def option_values(declared: Sequence[SourceOption], given: Mapping[str, str]) -> dict[str, Any]:
    """Each declared option's typed value: the text given for it, else its default, parsed
    by its own value type."""
    return {o.name: o.parse(given.get(o.name, o.default)) for o in declared}


@dataclass(frozen=True, slots=True)
class SourceInfo:
    name: str
    help: str
    default_enabled: bool
    factory: Callable[[SourceContext], Source]
    options: tuple[SourceOption, ...] = ()


_REGISTRY: dict[str, SourceInfo] = {}


def register(
    name: str, *, help: str, default_enabled: bool = True, options: tuple[SourceOption, ...] = ()
) -> Callable[[Callable[[SourceContext], Source]], Callable[[SourceContext], Source]]:
    """Class or factory decorator that adds a source to the registry."""

    def wrap(factory: Callable[[SourceContext], Source]) -> Callable[[SourceContext], Source]:
        if name in _REGISTRY:
            raise ValueError(f"source {name!r} registered twice")
        _REGISTRY[name] = SourceInfo(name, help, default_enabled, factory, options)
        return factory

    return wrap


def registry() -> dict[str, SourceInfo]:
    """Every known source in SOURCE_MODULES order (flags, polling and output follow it)."""
    for module in SOURCE_MODULES:
        importlib.import_module(f"exporter.sources.{module}")
    order = {name: i for i, name in enumerate(SOURCE_MODULES)}
    return {
        name: _REGISTRY[name] for name in sorted(_REGISTRY, key=lambda n: (order.get(n, 99), n))
    }


def add(samples: list[Sample], metric: str, value: float | None, *attrs: tuple[str, str]) -> None:
    """Append a sample when the value is known: None means "no series", never 0."""
    if value is not None:
        samples.append(_new(Sample, (metric, float(value), attrs)))


_new = tuple.__new__
"""`_new(Sample, (metric, value, attributes))`: a Sample without NamedTuple's Python-level
`__new__` (the hot paths of the sources build hundreds a cycle)."""
