"""A poller assembled the way exporter/app.py assembles one, from only the parts a test
names: the same step factories, so a test exercises the product's own cycle."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from exporter.attribution.resolver import ProcessResolver
from exporter.cycle.collect import Collect
from exporter.cycle.pipeline import Pipeline, Stage, Step
from exporter.cycle.poller import Poller
from exporter.cycle.steps import (
    Attribution,
    Joiner,
    SnapshotBuilder,
    SnapshotPart,
    after,
    derive,
    exporter_series,
    publish,
    unseen_warnings,
)
from exporter.cycle.steps import budget as budget_step
from exporter.derive.budget import Budget
from exporter.derive.numa import CpuNodeMap
from exporter.ids import ResourceMatcher
from exporter.model import PodResourcesHealth, Snapshot
from exporter.sinks import SelfMetrics, SnapshotSink
from exporter.sources import Source


def make_poller(
    *,
    node: str,
    sources: Mapping[str, Source],
    client: Any,
    sinks: Sequence[SnapshotSink] = (),
    budget: Budget | None = None,
    parts: Sequence[SnapshotPart] = (),
    after_cycle: Sequence[Callable[[Snapshot], None]] = (),
    self_metrics: Sequence[SelfMetrics] = (),
    resolver: ProcessResolver | None = None,
    process_series: bool = False,
    matcher: ResourceMatcher | None = None,
    cpu_nodes: CpuNodeMap | None = None,
    interval: float = 10.0,
    kubelet_every: float = 0.0,
    source_timeout: float = 5.0,
    clock: Callable[[], float] = time.monotonic,
    wall_clock: Callable[[], float] = time.time,
    extra: Sequence[Step] = (),
) -> Poller:
    """`client`: a PodResourcesClient or a stand-in with its `poll`/`health`/`close`;
    `parts`: derived parts in order (placement, energy); `extra`: steps placed by stage."""
    matcher = matcher or ResourceMatcher()
    collect = Collect(
        sources,
        client,
        interval=interval,
        kubelet_every=kubelet_every,
        source_timeout=source_timeout,
        cpu_nodes=cpu_nodes,
        clock=clock,
    )
    health = client.health if client is not None else PodResourcesHealth
    builder = SnapshotBuilder(
        node, health=health, process_series=process_series, wall_clock=wall_clock
    )
    steps = [
        Step("join", Stage.BUILD, Joiner(matcher).run),
        Step("snapshot", Stage.BUILD, builder.run),
        *([Step("attribution", Stage.DERIVE, Attribution(resolver).run)] if resolver else []),
        *(derive(f"part-{i}", part) for i, part in enumerate(parts)),
        unseen_warnings(matcher),
        exporter_series(self_metrics),
        *([budget_step(budget)] if budget is not None else []),
        *(publish(f"sink-{i}", sink) for i, sink in enumerate(sinks)),
        *(after(f"after-{i}", work) for i, work in enumerate(after_cycle)),
    ]
    steps = sorted([*steps, *extra], key=lambda s: s.stage)  # stable: order within a stage
    pipeline = Pipeline(collect, steps, node=node, clock=clock)
    return Poller(pipeline, interval=interval, clock=clock)
