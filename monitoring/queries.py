"""PromQL building blocks shared by the dashboards and the alert rules (OpenTelemetry names).

Two facts shape every query here:

* A device is `(k8s.node.name, hw.id)`, never `hw.id` alone: PCI addresses (AMD and Intel
  GPUs, NIC VFs) repeat from node to node.
* Device series carry holder labels (`k8s.namespace.name`...) only while exactly one
  container holds the device, so a device's series change identity when its pod changes.
  Anything that spans time or joins is first reduced with `max by (KEY)`; holders come from
  `hw.allocation.info`, which has one series per (device, holder).
"""

from __future__ import annotations

KEY = "cluster, k8s.node.name, hw.id"
"""The labels that name one device: in the whole cluster, and among clusters when one
Prometheus (Thanos, Mimir) holds several, each with its external label `cluster`. Where there
is no such label it is empty on every side, and joins and sums are the same without it."""

CLUSTER = 'cluster=~"$cluster"'
"""The dashboards' first variable (monitoring/layout.py); `.*` (All) also matches no label."""
NODE = f'{CLUSTER}, k8s.node.name=~"$node"'
DEVICE = f'{NODE}, hw.type=~"$type", hw.vendor=~"$vendor", hw.model=~"$model"'
"""Device filter of the overview (node, type, vendor, model variables)."""
HOLDER = f'{NODE}, k8s.namespace.name=~"$namespace", k8s.pod.name=~"$pod"'
"""Holder filter of the workload views (node, namespace, pod variables)."""
HELD = f'{HOLDER}, k8s.pod.name!=""'
"""Device series that one container holds (exclusive devices), filtered by holder."""

GENERAL = 'hw.gpu.task="general"'


def sel(metric: str, *matchers: str) -> str:
    """`metric{m1, m2}` without empty matchers."""
    inner = ", ".join(m for m in matchers if m)
    return f"{metric}{{{inner}}}" if inner else metric


PARENTS = (
    'label_replace(max by (cluster, k8s.node.name, hw.parent) (hw.info{hw.parent!=""}),'
    ' "hw.id", "$1", "hw.parent", "(.+)")'
)
"""Devices that are some device's parent (a GPU split into MIG slices, an HCA, a PF),
renamed so they match `on(KEY)`. They are not allocation units themselves."""


def units(filters: str, by: str = "hw.type, hw.vendor, hw.model") -> str:
    """The allocatable units: every device that is no other device's parent."""
    return f"(max by ({KEY}, {by}) ({sel('hw.info', filters)}) unless on({KEY}) {PARENTS})"


RESOLVED = 'hw.id!=""'
ALLOCATED = f"hw.allocation.info{{{RESOLVED}}}"
"""Allocations that resolved to a device a source can see."""


def allocated_units(filters: str, by: str = "hw.type, hw.vendor, hw.model") -> str:
    return f"({units(filters, by)} and on({KEY}) {ALLOCATED})"


def free_units(filters: str, by: str = "hw.type, hw.vendor, hw.model") -> str:
    return f"({units(filters, by)} unless on({KEY}) {ALLOCATED})"


def utilization(filters: str) -> str:
    """Current general utilization per device, holder labels dropped."""
    return f"max by ({KEY}) ({sel('hw.gpu.utilization', GENERAL, filters)})"


def idle_allocated(filters: str, window: str, threshold: str) -> str:
    """Allocated devices whose utilization stayed below `threshold` for all of `window`;
    the value is the highest utilization seen in the window."""
    peak = (
        f"max by ({KEY}) (max_over_time({sel('hw.gpu.utilization', GENERAL, filters)}[{window}]))"
    )
    return f"(({peak}) < {threshold} and on({KEY}) {ALLOCATED})"


def idle_now_allocated(filters: str, threshold: str) -> str:
    """Allocated devices below `threshold` right now (cheap enough for a time series)."""
    return f"(({utilization(filters)}) < {threshold} and on({KEY}) {ALLOCATED})"


def holders(filters: str, by: str) -> str:
    """Allocation series reduced to `KEY` plus `by` (for `group_right` joins)."""
    return f"max by ({KEY}, {by}) ({sel('hw.allocation.info', RESOLVED, filters)})"


def or_zero(expr: str, like: str) -> str:
    """`expr`, or 0 for every series of `like` that `expr` lacks: a device with no XIDs shows
    0 instead of vanishing from the table."""
    return f"({expr}) or (0 * ({like}))"


SHARED_KEYS = f'max by ({KEY}) (hw.allocation.info{{{RESOLVED}, hw.allocation.shared="true"}})'
"""Devices held by more than one container (time-slicing, MPS, shared pools)."""


def attributed(metric: str, filters: str, by: str) -> str:
    """What the holders' own processes use of each shared device (`hw.gpu.container.*`,
    process attribution), summed by `KEY` plus `by`; empty where attribution is off."""
    mine = sel(metric, filters, 'hw.allocation.requested="true"')
    return f"(sum by ({KEY}, {by}) ({mine}) and on({KEY}) {SHARED_KEYS})"
