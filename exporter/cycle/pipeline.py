"""A cycle as an ordered list of named steps, each isolated the same way.

Stages, in order:

- **collect** (the event loop, `collect.Collect`): every source in its daemon thread, the
  kubelet when due, the CPU map;
- **build**: the join, then the snapshot: a cycle whose collect or build step fails has no
  new snapshot;
- **derive**: parts derived from the new snapshot (attribution, placement, energy, ...);
  skipped when there is none;
- **publish**: the exporter's own series, the series budget, then the sinks: every cycle,
  on the new snapshot or, when there is none, on the last good one (an empty one before
  the first), so /metrics always answers with the failures counted;
- **after**: work that is not the cycle's (the heap trim, bodies built ahead of scrapes),
  after the cycle's duration is taken.

A step that raises is logged with its name once per state change (with the traceback the
first time), counted per step (`kube_device_exporter_cycle_step_failures_total`), and the
cycle goes on. Every step but collect runs in the poller's worker thread.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import Protocol

from exporter.join import JoinResult
from exporter.model import PodResourcesState, Sample, Snapshot, SourceHealth, SourceResult

log = logging.getLogger("exporter.poller")

FAILURES = "kube_device_exporter.cycle.step.failures"


class Stage(IntEnum):
    COLLECT = 0
    BUILD = 1
    DERIVE = 2
    PUBLISH = 3
    AFTER = 4


@dataclass(slots=True)
class Cycle:
    """One cycle's work in progress: what each step reads and adds."""

    number: int
    """1 for the first cycle."""
    started: float
    """Monotonic seconds at its start."""
    results: list[tuple[SourceResult | None, SourceHealth]] = field(default_factory=list)
    """Each source's result (None: it failed) and health, in polling order."""
    kubelet: PodResourcesState | None = None
    answered: bool = True
    """Whether the kubelet's answer came in time (else `kubelet` is the last good one)."""
    cpu_nodes: Mapping[int, int] = field(default_factory=dict)
    joined: JoinResult | None = None
    snapshot: Snapshot | None = None
    published: Snapshot | None = None
    """What the sinks get: the snapshot with the metric groups and the series budget applied."""
    previous_published: Snapshot | None = None
    previous_duration: float | None = None
    """The last cycle's duration; in the first cycle, its own up to the build stage."""
    broken: bool = False
    """A collect or build step failed: no new snapshot this cycle."""
    failures: tuple[Sample, ...] = ()
    """The step failures so far, for what is published (set before each publish step)."""

    @property
    def healths(self) -> list[SourceHealth]:
        return [health for _, health in self.results]

    @property
    def collected(self) -> list[SourceResult]:
        return [result for result, _ in self.results if result is not None]

    def to_publish(self) -> Snapshot:
        """`published`, with the step failures so far; when the step that makes it failed,
        the last one published with this cycle's exporter series (the snapshot itself before
        anything was published)."""
        out = self.published
        if out is None:
            assert self.snapshot is not None  # the pipeline sets it before the publish stage
            out = self.snapshot
            if self.previous_published is not None:
                out = replace(self.previous_published, self_samples=out.self_samples)
        if self.failures:
            kept = tuple(s for s in out.self_samples if s.metric != FAILURES)
            out = replace(out, self_samples=kept + self.failures)
        return out


@dataclass(frozen=True, slots=True)
class Step:
    """A named part of the cycle: `run` reads and adds to the cycle."""

    name: str
    stage: Stage
    run: Callable[[Cycle], None]


class Collector(Protocol):
    """The collect stage: the one step that runs on the event loop (`collect.Collect`)."""

    name: str
    source_timeout: float
    """How long one source may take: the rest of the cycle gets the interval plus this."""
    restart_required: dict[str, str]
    """source -> why only a new process can recover it (/healthz fails while set)."""

    async def run(self, cycle: Cycle) -> None: ...

    async def news(self) -> None:
        """Return when a cycle should run before the interval ends (the kubelet has news);
        the poller waits for it between cycles and cancels it when the next is due."""
        ...

    async def close(self, timeout: float) -> dict[str, str]:
        """Close every source and the kubelet channel; source -> why it did not close."""
        ...


class Pipeline:
    """The steps of every cycle, their isolation, and the last good snapshot."""

    def __init__(
        self,
        collect: Collector,
        steps: Sequence[Step],
        *,
        node: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        stages = [s.stage for s in steps]
        if stages != sorted(stages) or Stage.COLLECT in stages:
            raise ValueError(f"steps out of stage order: {[s.name for s in steps]}")
        names = [collect.name, *(s.name for s in steps)]
        if len(set(names)) != len(names):
            raise ValueError(f"step names repeat: {names}")
        self.collect = collect
        self.steps = tuple(steps)
        self.node = node
        self._clock = clock
        self.failures: Counter[str] = Counter()
        """Step name -> raises so far."""
        self._failing: set[str] = set()
        self.last: Snapshot | None = None
        """The last snapshot a cycle built (and derived, and published)."""
        self.last_published: Snapshot | None = None
        self.duration: float | None = None
        """The last cycle's duration, from its start to its after stage."""

    def new_cycle(self, number: int) -> Cycle:
        return Cycle(
            number=number,
            started=self._clock(),
            previous_published=self.last_published,
            previous_duration=self.duration,
        )

    async def run_collect(self, cycle: Cycle) -> None:
        await self._isolated_async(self.collect.name, self.collect.run(cycle), cycle)

    def finish(self, cycle: Cycle) -> Snapshot:
        """Every step after collect, in order; the cycle's snapshot (never None)."""
        if cycle.previous_duration is None:
            cycle.previous_duration = self._clock() - cycle.started
        timed = False
        for step in self.steps:
            if step.stage >= Stage.PUBLISH and cycle.snapshot is None:
                cycle.snapshot = self.last or Snapshot(timestamp=0.0, node=self.node)
            if step.stage is Stage.AFTER and not timed:
                self._end(cycle)
                timed = True
            if cycle.broken and step.stage in (Stage.BUILD, Stage.DERIVE):
                continue
            self._isolated(step, cycle)
        if cycle.snapshot is None:
            cycle.snapshot = self.last or Snapshot(timestamp=0.0, node=self.node)
        if not timed:
            self._end(cycle)
        return cycle.snapshot

    def _end(self, cycle: Cycle) -> None:
        self.duration = self._clock() - cycle.started
        if not cycle.broken:
            self.last = cycle.snapshot
        self.last_published = cycle.published or self.last_published

    def self_samples(self) -> tuple[Sample, ...]:
        """Each step's raises so far (only steps that have raised: none on a healthy node).
        Added to what every sink publishes, so that no step's failure hides its own count
        (the exporter's series step included)."""
        return tuple(
            Sample(FAILURES, float(n), (("step", name),))
            for name, n in sorted(self.failures.items())
        )

    def _isolated(self, step: Step, cycle: Cycle) -> None:
        if step.stage is Stage.PUBLISH:
            cycle.failures = self.self_samples()
        try:
            step.run(cycle)
        except Exception as exc:  # noqa: BLE001 - one step's bug, not the cycle's
            self._failed(step.name, exc, cycle, build=step.stage is Stage.BUILD)
        else:
            self._ok(step.name)

    async def _isolated_async(self, name: str, work: Awaitable[None], cycle: Cycle) -> None:
        try:
            await work
        except Exception as exc:  # noqa: BLE001 - one step's bug, not the cycle's
            self._failed(name, exc, cycle, build=True)
        else:
            self._ok(name)

    def _failed(self, name: str, exc: Exception, cycle: Cycle, *, build: bool) -> None:
        self.failures[name] += 1
        if build:
            cycle.broken = True
        if name not in self._failing:
            self._failing.add(name)
            what = "the last good snapshot stands in" if build else "the cycle goes on without it"
            log.error("cycle step %s failed (%s): %r", name, what, exc, exc_info=exc)

    def _ok(self, name: str) -> None:
        if name in self._failing:
            self._failing.discard(name)
            log.info("cycle step %s works again", name)
