"""What a snapshot may carry: the metric groups that are on, and the series budget.

Applied by the cycle's `series-budget` step before every sink, so /metrics in every schema,
OTLP and the landing page see the same series.

- **Groups** (`--metrics.group.NAME`, `exporter.settings.table.GROUPS`): a sample of a group that
  is off is left out of its device's reading.
- **The series budget** (`--metrics.max-series`): memory and Prometheus's load are bounded
  by configuration, not by what the kubelet lists. Never left out: every device a source
  sees and its series (a node's hardware is bounded), the per-resource counts (they keep
  counting every allocation), the exporter's own series. Left out when the total would
  pass the budget: per-holder series (`hw_allocation_info`, `hw_container_*`,
  `k8s_pod_workload_info`, `hw_gpu_container_*`, `hw_gpu_process_*`), whole containers at a
  time, kept in a fixed order: containers holding a device a source sees first, then by
  namespace, pod and container name; the first container that does not fit ends the list.
  The same input always keeps the same containers. One warning when the budget is first
  passed (with what was left out), one line when the node fits again;
  `kube_device_exporter_series_dropped` says how many series each cycle.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace
from itertools import compress
from operator import is_not

from exporter.metrics import SPECS, MetricSpec
from exporter.model import (
    Allocation,
    AllocationKind,
    ContainerNuma,
    ContainerUsage,
    DeviceReading,
    Holder,
    JoinedDevice,
    Layout,
    Sample,
    Snapshot,
    joined_device,
)
from exporter.points import points
from exporter.runtime.evolve import evolve
from exporter.runtime.log import StateLog
from exporter.settings.config import DEFAULTS
from exporter.settings.table import DEFAULT_GROUPS, GROUP_NAMES

log = logging.getLogger("exporter.budget")

_HolderKey = tuple[str, str, str]
_new = tuple.__new__
_NO_POD: _HolderKey = ("\uffff", "", "")
"""The processes of no pod (host processes): after every container."""
_MAX_LAYOUTS = 1024
"""Distinct reading layouts remembered (one per device model and configuration: a handful;
the memo starts over past this many, so it never grows with the node's history)."""


class Budget:
    """Applied once per cycle, before every sink (the cycle's `series-budget` step)."""

    def __init__(
        self,
        *,
        groups: frozenset[str] = DEFAULT_GROUPS,
        max_series: int = DEFAULTS.metrics_max_series,
    ) -> None:
        self.groups = groups | DEFAULT_GROUPS
        self.max_series = max_series
        self._whole: dict[str, bool | None] = {
            name: _whole_metric(spec, self.groups) for name, spec in SPECS.items()
        }
        """metric -> every series kept (True), none (False), or decided by a label (None)."""
        self._states = StateLog(log)
        self._numa = NumaSeries()
        self.last: Snapshot | None = None
        """What the last `apply` returned."""
        self._own_samples: tuple[int, tuple[Sample, ...]] = (0, self._samples(0))
        """(series dropped, the budget's own series saying so): the same most cycles."""
        self._masks: dict[int, tuple[Layout, tuple[tuple[bool, ...], Layout] | None]] = {}
        """id of a reading's layout -> (the layout, which of its values the groups keep and
        the layout of those, None for all): the decision reads nothing else, and a device's
        layout is the same object cycle after cycle, only the values change. Keyed by
        identity, checked against the layout kept here (so its id is not reused while the
        entry lives): `Layout.__hash__` is Python code, one call per device and cycle."""

    def apply(self, snapshot: Snapshot) -> Snapshot:
        """`snapshot` with the groups that are off left out, trimmed to the budget, and the
        budget's own series added."""
        devices = self._grouped(snapshot.devices)
        energy = snapshot.container_energy if "energy" in self.groups else ()
        if energy is not snapshot.container_energy or any(map(is_not, devices, snapshot.devices)):
            snapshot = evolve(snapshot, devices=devices, container_energy=energy)
        trimmed, dropped, holders = trim(snapshot, self.max_series - len(self._own(0)), self._numa)
        if dropped:
            self._states.failed(
                "series",
                f"series budget passed: {dropped} series over --metrics.max-series "
                f"{self.max_series}: the per-holder series of {holders} containers left out "
                "(those holding no device a source sees first, then the last by namespace, "
                "pod, container); device series, per-resource counts and the exporter's own "
                "series are kept. Raise --metrics.max-series and the memory limit together "
                "(docs/reliability.md)",
            )
        else:
            self._states.ok("series", "series budget: the node fits again")
        self.last = evolve(trimmed, self_samples=trimmed.self_samples + self._own(dropped))
        return self.last

    def _own(self, dropped: int) -> tuple[Sample, ...]:
        """The budget's own series (made again only when `dropped` changed)."""
        if self._own_samples[0] != dropped:
            self._own_samples = (dropped, self._samples(dropped))
        return self._own_samples[1]

    def _samples(self, dropped: int) -> tuple[Sample, ...]:
        enabled = "kube_device_exporter.metric_group.enabled"
        return (
            Sample("kube_device_exporter.series.limit", float(self.max_series)),
            Sample("kube_device_exporter.series.dropped", float(dropped)),
            *(Sample(enabled, float(g in self.groups), (("group", g),)) for g in GROUP_NAMES),
        )

    def _grouped(self, joined: tuple[JoinedDevice, ...]) -> tuple[JoinedDevice, ...]:
        """The devices with the values of groups that are off left out (each built
        directly, in one loop: `dataclasses.replace` was most of this step's cost)."""
        masks = self._masks
        out: list[JoinedDevice] = []
        for j in joined:
            reading = j.reading
            layout = reading.layout
            known = masks.get(id(layout))
            masked = known[1] if known is not None and known[0] is layout else self._memo(layout)
            if masked is None:
                out.append(j)
                continue
            mask, kept = masked
            values = tuple(compress(reading.values, mask))
            reading = _new(DeviceReading, (reading.device, kept, values))
            out.append(joined_device(reading, j.holder, j.holders, j.allocatable, j.resource))
        return tuple(out)

    def _memo(self, layout: Layout) -> tuple[tuple[bool, ...], Layout] | None:
        """`_mask`, remembered for the layout."""
        masked = self._mask(layout)
        if len(self._masks) >= _MAX_LAYOUTS:
            self._masks.clear()
        self._masks[id(layout)] = (layout, masked)
        return masked

    def _mask(self, layout: Layout) -> tuple[tuple[bool, ...], Layout] | None:
        """Which values of `layout` the groups keep, and their layout; None for all."""
        whole, groups = self._whole, self.groups
        mask = tuple(
            bool(keep := whole[metric])
            or (keep is None and SPECS[metric].group_of(attributes) in groups)
            for metric, attributes in layout.keys
        )
        if all(mask):
            return None
        return mask, Layout.of(tuple(compress(layout.keys, mask)))


def _whole_metric(spec: MetricSpec, groups: frozenset[str]) -> bool | None:
    """Whether `groups` keep every series of `spec` (True), none (False), or it depends."""
    each = {spec.group in groups, *(group in groups for _, _, group in spec.value_groups)}
    return None if len(each) > 1 else each.pop()


def _numa_series(numa: ContainerNuma) -> int:
    """What `points._numa_points` makes of one container."""
    placed = len(numa.devices) + len(numa.cpus) + len(numa.memory)
    return placed + 1 + (numa.aligned is not None)


class NumaSeries:
    """What `points._numa_points` makes of some containers, remembered for the last ones:
    the join hands the same tuple on while the pods do not change (a thousand containers
    cost a millisecond a cycle to count)."""

    def __init__(self) -> None:
        self._last: tuple[tuple[ContainerNuma, ...], int] | None = None

    def __call__(self, containers: tuple[ContainerNuma, ...]) -> int:
        if self._last is None or self._last[0] is not containers:
            self._last = (containers, sum(_numa_series(n) for n in containers))
        return self._last[1]


def _usage_series(usage: ContainerUsage) -> int:
    return 1 + (usage.memory_bytes is not None) + (usage.utilization is not None)


def _key(holder: Holder) -> _HolderKey:
    return (holder.namespace, holder.pod, holder.container)


def _estimate(snapshot: Snapshot, numa: NumaSeries) -> int:
    """An upper bound of the snapshot's series, cheap enough for every cycle."""
    devices = sum(2 + len(d.reading.values) for d in snapshot.devices)
    holders = len(snapshot.allocations) + len(snapshot.pods)
    holders += numa(snapshot.containers)
    holders += 3 * len(snapshot.container_usage) + 2 * len(snapshot.processes)
    holders += (
        len(snapshot.container_energy)
        + len(snapshot.placements)
        + 2 * len({p.holder for p in snapshot.placements})
    )
    resources = 5 * (len(snapshot.allocatable) + len(snapshot.registered) + len(snapshot.unseen))
    return devices + holders + resources + 64 + 3 * len(snapshot.sources)


def trim(
    snapshot: Snapshot, budget: int, numa: NumaSeries | None = None
) -> tuple[Snapshot, int, int]:
    """(`snapshot` cut to at most `budget` series, series left out, containers left out)."""
    if _estimate(snapshot, numa or NumaSeries()) <= budget:
        return snapshot, 0, 0
    left_out: Counter[str] = Counter(
        a.resource_name for a in snapshot.allocations if a.kind is AllocationKind.DEVICE_PLUGIN
    )
    bare = replace(
        snapshot,
        allocations=(),
        containers=(),
        pods=(),
        container_usage=(),
        processes=(),
        allocations_left_out=tuple(sorted(left_out.items())),
    )
    fixed = sum(1 for _ in points(bare))
    cost, pods_of = _holder_costs(snapshot)
    seen = {d.reading.device.id for d in snapshot.devices}
    holding_seen = {_key(a.holder) for a in snapshot.allocations if a.device_id in seen}
    order = sorted(cost, key=lambda k: (k not in holding_seen, k))
    room = budget - fixed
    kept: set[_HolderKey] = set()
    pods_kept: set[tuple[str, str]] = set()
    for key in order:
        extra = cost[key] + ((key[0], key[1]) in pods_of and (key[0], key[1]) not in pods_kept)
        if extra > room:
            break
        room -= extra
        kept.add(key)
        pods_kept.add((key[0], key[1]))
    total = sum(cost.values()) + len(pods_of) + fixed
    out = _keep(snapshot, kept, pods_kept)
    used = fixed + sum(cost[k] for k in kept) + len(pods_kept & set(pods_of))
    return out, total - used, len(cost) - len(kept)


def _holder_costs(snapshot: Snapshot) -> tuple[Counter[_HolderKey], set[tuple[str, str]]]:
    """Series per container, and the pods that have a `k8s.pod.workload.info` series."""
    cost: Counter[_HolderKey] = Counter(_key(a.holder) for a in snapshot.allocations)
    for numa in snapshot.containers:
        cost[_key(numa.holder)] += _numa_series(numa)
    for usage in snapshot.container_usage:
        if usage.owner is not None:
            o = usage.owner
            cost[(o.namespace, o.pod, o.container)] += _usage_series(usage)
    for proc in snapshot.processes:
        owner = snapshot.owners.get(proc.pid)
        key = _NO_POD if owner is None else (owner.namespace, owner.pod, owner.container)
        cost[key] += (proc.memory_bytes is not None) + (proc.utilization is not None)
    for placement in snapshot.placements:
        cost[_key(placement.holder)] += 1
    for energy in snapshot.container_energy:
        if energy.holder is not None:
            cost[_key(energy.holder)] += 1
    for usage in snapshot.container_usage:  # the processes of no pod: last of all
        if usage.owner is None:
            cost[_NO_POD] += _usage_series(usage)
    return cost, {(p.namespace, p.pod) for p in snapshot.pods}


def _keep(snapshot: Snapshot, kept: set[_HolderKey], pods: set[tuple[str, str]]) -> Snapshot:
    def holds(items: Iterable[Allocation]) -> tuple[Allocation, ...]:
        return tuple(a for a in items if _key(a.holder) in kept)

    allocations = holds(snapshot.allocations)
    left_out: Counter[str] = Counter(
        a.resource_name for a in snapshot.allocations if a.kind is AllocationKind.DEVICE_PLUGIN
    )
    left_out.subtract(
        a.resource_name for a in allocations if a.kind is AllocationKind.DEVICE_PLUGIN
    )

    def owner_key(usage: ContainerUsage) -> _HolderKey:
        o = usage.owner
        return _NO_POD if o is None else (o.namespace, o.pod, o.container)

    def proc_key(pid: int) -> _HolderKey:
        o = snapshot.owners.get(pid)
        return _NO_POD if o is None else (o.namespace, o.pod, o.container)

    return replace(
        snapshot,
        allocations=allocations,
        containers=tuple(n for n in snapshot.containers if _key(n.holder) in kept),
        pods=tuple(p for p in snapshot.pods if (p.namespace, p.pod) in pods),
        container_usage=tuple(u for u in snapshot.container_usage if owner_key(u) in kept),
        processes=tuple(p for p in snapshot.processes if proc_key(p.pid) in kept),
        placements=tuple(p for p in snapshot.placements if _key(p.holder) in kept),
        container_energy=tuple(
            e for e in snapshot.container_energy if e.holder is None or _key(e.holder) in kept
        ),
        allocations_left_out=tuple(sorted((r, n) for r, n in left_out.items() if n > 0)),
    )
