"""Namespaces and pods: who holds which device, top consumers, per-pod memory and utilization.

By workload: with `--kubernetes.api` each device-holding pod has a `k8s.pod.workload.info`
series naming its workload (Deployment, CronJob, Job, StatefulSet...); device and allocation
series join it on the pod, so GPU hours, utilization and idle devices add up per workload.

Per-pod figures come from device series held by exactly one container (they carry the
holder's labels). A shared device (time-slicing, MPS, shared RDMA pools) has no single
holder: its own row splits it per container from process attribution
(`hw.gpu.container.*`, docs/attribution.md), whole-device figures beside it.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash

from monitoring import profiling
from monitoring.grafana import (
    PanelBuilder,
    Q,
    bar_panel,
    stat_panel,
    table_panel,
    timeseries_panel,
)
from monitoring.layout import new_dashboard, rows, variables
from monitoring.queries import GENERAL, HELD, HOLDER, KEY, RESOLVED, SHARED_KEYS, sel

UID = "kde-workloads"
POD = "k8s.namespace.name, k8s.pod.name"
CONTAINER = f"{POD}, k8s.container.name"
ALLOCATIONS = sel("hw.allocation.info", HOLDER)
UNRESOLVED = 'hw.id=""'
SHARED = sel("hw.allocation.info", HOLDER, RESOLVED, 'hw.allocation.shared="true"')


TITLE = "Devices / Namespaces and pods"
"""The dashboard's title: docs/runbooks.md names it (monitoring/runbooks.py)."""


def build() -> dash.Dashboard:
    board = new_dashboard(
        UID,
        TITLE,
        "Which pod holds which device, the top consumers, and per-pod utilization, memory "
        "and power.",
    )
    board = variables(board, ("node", "namespace", "pod"))
    return rows(
        board,
        (
            ("Who uses what", _who()),
            ("Top consumers", _top()),
            ("Per pod (devices held by one container)", _per_pod()),
            ("Shared devices, per container", _shared()),
            ("NUMA placement", _numa()),
            ("By workload (--kubernetes.api)", _by_workload()),
        ),
    )


def _who() -> list[PanelBuilder]:
    return [
        stat_panel(
            "Pods holding devices",
            "Pods with at least one device allocated (device plugins and DRA claims).",
            f"count(count by ({POD}) ({ALLOCATIONS})) or vector(0)",
        ),
        stat_panel(
            "Device IDs held",
            "Device IDs handed to containers, as the kubelet reports them (a time-sliced "
            "replica counts once per replica).",
            f"count(count by (k8s.node.name, hw.allocation.resource, hw.allocation.device_id)"
            f" ({ALLOCATIONS})) or vector(0)",
        ),
        stat_panel(
            "Shared devices held",
            "Devices held by more than one container.",
            f"count(count by ({KEY}) ({SHARED})) or vector(0)",
        ),
        stat_panel(
            "Unresolved allocations",
            "Device IDs held by containers that no source can see (a missing or failing "
            "collector, or a device plugin this exporter does not know).",
            f"count({sel('hw.allocation.info', HOLDER, UNRESOLVED)}) or vector(0)",
            thresholds=((None, "green"), (1, "orange")),
        ),
        table_panel(
            "Allocations",
            "One row per (container, device ID) from the kubelet's PodResources API.",
            [
                (
                    "Held",
                    f"max by (k8s.node.name, {CONTAINER}, hw.allocation.resource,"
                    f" hw.allocation.device_id, hw.id, hw.model, hw.allocation.shared)"
                    f" ({ALLOCATIONS})",
                )
            ],
            hide=("Held",),
            span=24,
            height=10,
        ),
    ]


def _top() -> list[PanelBuilder]:
    return [
        bar_panel(
            "Devices held by namespace",
            "Device IDs held per namespace.",
            [
                Q(
                    f"sort_desc(count by (k8s.namespace.name) ({ALLOCATIONS}))",
                    "{{k8s_namespace_name}}",
                )
            ],
        ),
        bar_panel(
            "Top pods by utilization",
            "Mean general utilization of the devices each pod holds alone.",
            [
                Q(
                    f"topk(10, avg by ({POD}) ({sel('hw.gpu.utilization', GENERAL, HELD)}))",
                    "{{k8s_namespace_name}}/{{k8s_pod_name}}",
                )
            ],
            unit="percentunit",
            maximum=1,
        ),
        bar_panel(
            "Top pods by device memory",
            "Device memory in use on the devices each pod holds alone.",
            [
                Q(
                    f"topk(10, sum by ({POD}) ({sel('hw.gpu.memory.usage', HELD)}))",
                    "{{k8s_namespace_name}}/{{k8s_pod_name}}",
                )
            ],
            unit="bytes",
        ),
    ]


def _per_pod() -> list[PanelBuilder]:
    legend = "{{k8s_namespace_name}}/{{k8s_pod_name}}/{{k8s_container_name}}"
    return [
        profiling.pod_panel(),
        timeseries_panel(
            "Utilization per container",
            "Mean general utilization of the devices the container holds alone.",
            [Q(f"avg by ({CONTAINER}) ({sel('hw.gpu.utilization', GENERAL, HELD)})", legend)],
            unit="percentunit",
            maximum=1,
        ),
        timeseries_panel(
            "Device memory per container",
            "Device memory in use on the devices the container holds alone.",
            [Q(f"sum by ({CONTAINER}) ({sel('hw.gpu.memory.usage', HELD)})", legend)],
            unit="bytes",
        ),
        timeseries_panel(
            "Device memory used, fraction per container",
            "Device memory in use over the size of the devices the container holds alone.",
            [
                Q(
                    f"sum by ({CONTAINER}) ({sel('hw.gpu.memory.usage', HELD)})"
                    f" / sum by ({CONTAINER}) ({sel('hw.gpu.memory.limit', HELD)})",
                    legend,
                )
            ],
            unit="percentunit",
            maximum=1,
        ),
        timeseries_panel(
            "Power per pod",
            "Power drawn by the devices each pod holds alone.",
            [
                Q(
                    f"sum by ({POD}) ({sel('hw.power', HELD)})",
                    "{{k8s_namespace_name}}/{{k8s_pod_name}}",
                )
            ],
            unit="watt",
            stacked=True,
        ),
        bar_panel(
            "Energy per pod in the time range",
            "Energy used by the devices each pod held alone during the dashboard's range.",
            [
                Q(
                    f"sort_desc(sum by ({POD}) (increase({sel('hw.energy', HELD)}[$__range])))",
                    "{{k8s_namespace_name}}/{{k8s_pod_name}}",
                )
            ],
            unit="joule",
            span=12,
        ),
        timeseries_panel(
            "PCIe throughput per pod",
            "Bytes per second over PCIe on the devices each pod holds alone.",
            [
                Q(
                    f"sum by ({POD}, network.io.direction)"
                    f" (rate({sel('hw.gpu.io', HELD)}[$__rate_interval]))",
                    "{{k8s_namespace_name}}/{{k8s_pod_name}} {{network_io_direction}}",
                )
            ],
            unit="Bps",
        ),
    ]


def _shared() -> list[PanelBuilder]:
    return [
        table_panel(
            "Shared devices and their holders",
            "Devices held by more than one container, with whole-device utilization and "
            "memory (the per-container split is in the panels beside).",
            [
                ("Holders", f"count by ({KEY}, hw.model) ({SHARED})"),
                (
                    "Utilization",
                    f"max by ({KEY}) ({sel('hw.gpu.utilization', GENERAL)}) and on({KEY}) {SHARED}",
                ),
                (
                    "Memory used",
                    f"max by ({KEY}) ({sel('hw.gpu.memory.usage')}) and on({KEY}) {SHARED}",
                ),
            ],
            units={"Utilization": "percentunit", "Memory used": "bytes"},
            span=16,
        ),
        table_panel(
            "Used without a request",
            "Containers whose processes use a device the kubelet did not give them (nor its "
            "parent or a slice of it); alert KubeDeviceUsedWithoutRequest.",
            [
                (
                    "Processes",
                    f"max by ({KEY}, hw.model, {CONTAINER})"
                    f" ({sel('hw.gpu.container.processes', HOLDER, UNREQUESTED)})",
                )
            ],
            span=8,
        ),
        timeseries_panel(
            "Utilization per container on shared devices",
            "Each container's processes' share of a shared device (stacked: the shares add up "
            "to what the driver attributes to processes); the series without a pod is host "
            "processes and processes not resolved yet. Needs process attribution "
            "(docs/attribution.md).",
            [Q(_per_container("hw.gpu.container.utilization"), SHARE_LEGEND)],
            unit="percentunit",
            stacked=True,
        ),
        timeseries_panel(
            "Device memory per container on shared devices",
            "Device memory of each container's processes on a shared device (NVIDIA: needs "
            "hostPID, docs/attribution.md).",
            [Q(_per_container("hw.gpu.container.memory.usage"), SHARE_LEGEND)],
            unit="bytes",
            stacked=True,
        ),
        table_panel(
            "Holders of shared devices",
            "Every container that holds a shared device, with the replica it was given.",
            [
                (
                    "Held",
                    f"max by ({KEY}, {CONTAINER}, hw.allocation.resource,"
                    f" hw.allocation.device_id, hw.allocation.replica) ({SHARED})",
                )
            ],
            hide=("Held",),
        ),
    ]


def _numa() -> list[PanelBuilder]:
    aligned = sel("hw.container.numa.aligned", HOLDER)
    return [
        table_panel(
            "NUMA alignment of containers holding devices",
            "Per container: Aligned 1 when its exclusive CPUs and pinned memory sit on "
            "exactly the NUMA nodes of its devices, 0 when not, empty when there is nothing "
            "to compare (shared-pool CPUs and no pinned memory); Exclusive CPUs 0 means it "
            "runs on the shared CPU pool.",
            [
                ("Aligned", f"max by (k8s.node.name, {CONTAINER}) ({aligned})"),
                (
                    "Exclusive CPUs",
                    f"max by (k8s.node.name, {CONTAINER})"
                    f" ({sel('hw.container.cpus.exclusive', HOLDER)})",
                ),
            ],
            span=12,
        ),
        table_panel(
            "NUMA nodes by resource",
            "One row per NUMA node a container's devices (by resource), exclusive CPUs "
            "(`cpu`) or pinned memory (by type) sit on.",
            [
                (
                    "Placed",
                    f"max by (k8s.node.name, {CONTAINER}, hw.numa.resource, hw.numa_node)"
                    f" ({sel('hw.container.numa.node', HOLDER)})",
                )
            ],
            hide=("Placed",),
            span=12,
        ),
        timeseries_panel(
            "Misaligned containers",
            "Containers holding devices whose exclusive CPUs or pinned memory sit on other "
            "NUMA nodes (alert KubeDeviceContainerNumaMisaligned), per node.",
            [Q(f"count by (k8s.node.name) ({aligned} == 0)", "{{k8s_node_name}}")],
            unit="short",
        ),
    ]


INFO = "k8s.pod.workload.info"
WORKLOAD = "k8s.namespace.name, k8s.workload.kind, k8s.workload.name"
TO_WORKLOAD = (
    "* on(k8s.node.name, k8s.namespace.name, k8s.pod.name)"
    f" group_left(k8s.workload.kind, k8s.workload.name) {INFO}"
)
"""Appended to a per-pod expression: the pod's workload labels from the info series."""
WORKLOAD_LEGEND = "{{k8s_namespace_name}}/{{k8s_workload_kind}}/{{k8s_workload_name}}"
IDLE_BELOW = "0.05"


def _by_workload() -> list[PanelBuilder]:
    gpu_allocations = sel("hw.allocation.info", HOLDER, 'hw.type="gpu"')
    gpus_per_pod = f"count by (k8s.node.name, {POD}) ({gpu_allocations})"
    held_util = sel("hw.gpu.utilization", GENERAL, HELD)
    return [
        bar_panel(
            "GPU hours by workload in the time range",
            "GPUs (and MIG slices) held by each workload's pods, integrated over the "
            "dashboard's range (the mean count over the range times its length). Needs "
            "--kubernetes.api.",
            [
                Q(
                    f"sort_desc(sum by ({WORKLOAD}) (avg_over_time(({gpus_per_pod}"
                    f" {TO_WORKLOAD})[$__range:])) * $__range_s / 3600)",
                    WORKLOAD_LEGEND,
                )
            ],
            unit="h",
            span=8,
        ),
        timeseries_panel(
            "Utilization by workload",
            "Mean general utilization of the devices each workload's pods hold alone. "
            "Needs --kubernetes.api.",
            [Q(f"avg by ({WORKLOAD}) ({held_util} {TO_WORKLOAD})", WORKLOAD_LEGEND)],
            unit="percentunit",
            maximum=1,
            span=8,
        ),
        bar_panel(
            "Allocated but idle by workload",
            f"Devices held alone by a workload's pods and below {IDLE_BELOW} general "
            "utilization now. Needs --kubernetes.api.",
            [
                Q(
                    f"sort_desc(count by ({WORKLOAD}) (({held_util} < {IDLE_BELOW})"
                    f" {TO_WORKLOAD}))",
                    WORKLOAD_LEGEND,
                )
            ],
            span=8,
        ),
    ]


UNREQUESTED = 'hw.allocation.requested="false"'
SHARE_LEGEND = "{{hw_id}} {{k8s_namespace_name}}/{{k8s_pod_name}}/{{k8s_container_name}}"


def _per_container(metric: str) -> str:
    """A `hw.gpu.container.*` metric of shared devices per container (filters: node, and
    namespace/pod, which keep the no-pod series while they are `.*`)."""
    return f"sum by ({KEY}, {CONTAINER}) ({sel(metric, HOLDER)}) and on({KEY}) {SHARED_KEYS}"
