"""docs/metrics.md, generated from the metric-spec table (`exporter/metrics.py`).

`python -m monitoring.metricdoc > docs/metrics.md` (make docs); a test fails when the file and
the table disagree.
"""

from __future__ import annotations

from exporter.metrics import ATTRIBUTES, SPECS_LIST, Kind, MetricSpec, Scope, prometheus_label
from exporter.settings.table import CORE, GROUPS

_GROUPS_HEAD = """## Metric groups

As node_exporter's collectors and dcgm-exporter's counter files: the default (`core`)
answers the first questions (utilization, memory, power, temperature, errors, who holds
what) at no more series of a whole GPU than dcgm-exporter's default counters (25 series:
`etc/default-counters.csv`, 26 fields of which `DCGM_FI_DRIVER_VERSION` is a label; ours: 21
or 22 on `dense`'s time-sliced GPUs), plus 3 for each container holding it (its allocation,
and its own GPU use and processes from process attribution), where dcgm-exporter has no
per-holder series but one pod's labels on the GPU's (counted by
`tests/test_metric_groups.py`). Each other group is one flag away, `--metrics.group.NAME`
(`KDE_METRICS_GROUP_NAME=true`; chart `metricGroups.NAME`; kit
`deploy/components/metric-groups`). `kube_device_exporter_metric_group_enabled{group}`
says which are on. A row below names its group; a row whose group says "by label" puts
some series in another group by a label value. The dcgm schema (`--metrics.schema=dcgm`)
renames what the groups let through, and turns on by default the groups dcgm-exporter's
default counters are made from (`clocks`, `interconnect`, `memory`, `media`, `profiling`):
the flag alone serves that default set; a `--metrics.group.NAME` given still wins.

| group | default | what |
|---|---|---|
"""

_DOC_HEAD = """# Metrics

Generated from `exporter/metrics.py` by `make docs`; a test keeps this file equal to the table.

Names are the OpenTelemetry ones (the hardware semantic conventions `hw.*`, extended in the
same pattern where none exists). The Prometheus names and labels are what the OpenTelemetry
Collector's Prometheus translation produces from them (`.` -> `_`, a unit suffix, `_total` on
counters, `_ratio` on unit-1 gauges), so dashboards and alerts work the same whether the data
was scraped from `/metrics` or pushed over OTLP through a Collector.

## Label semantics

- **Every device series is emitted once per device**, never copied per pod. It carries the
  keys to filter, group and join by (`hw_id`, `hw_type`, `hw_vendor`, `hw_model`,
  `hw_parent`) and `k8s_namespace_name`, `k8s_pod_name`, `k8s_container_name` of its
  holder **when exactly one container holds it**; when nobody holds it, or several containers
  share it (time-slicing, MPS, RDMA shared pools), those labels are absent (empty in PromQL).
- **The rest of a device's identity is on `hw_info` only** (driver version, serial, PCI bus
  id, index, minor, MIG profile and instance ids, partition, interface name and port), as
  `kube_pod_info` and `node_uname_info` do: a driver upgrade does not rename every series,
  and the output is about a third smaller. Join it where needed:
  `hw_gpu_utilization_ratio * on(k8s_node_name, hw_id) group_left(hw_pci_bus_id) hw_info`.
- **`hw_allocation_info` has one series per (device, holder)**, straight from PodResources,
  with the resource name, the raw device ID, the replica and `hw_allocation_shared`. Join any
  device series to pods with it, e.g. per-pod memory of shared GPUs:
  `hw_gpu_memory_usage_bytes * on(k8s_node_name, hw_id) group_right hw_allocation_info`.
- **`k8s_node_name`** on every series comes from `--node-name` (`NODE_NAME` from the downward
  API). In OTLP it is the resource attribute `k8s.node.name`.
- **No collisions with target labels.** Prometheus (and kube-prometheus ServiceMonitors) add
  `namespace`, `pod`, `container`, `service`, `endpoint`, `instance`, `job` to every scraped
  series, naming the exporter's own pod. Ours are `k8s_*`, so nothing is renamed to
  `exported_*` and `honorLabels` can stay `false` (the default) in the ServiceMonitor/PodMonitor:
  the target labels keep describing the exporter pod, ours describe the workload.
- Label values are escaped by the Prometheus client, whatever the pod or container name.
- Series of pods that are gone disappear in the next cycle: families are rebuilt from each
  snapshot, nothing is kept between cycles.
- **`k8s_pod_workload_info`** (only with `--kubernetes.api`) has one series per pod holding a
  device, with the pod's UID, its workload (`k8s_workload_kind`, `k8s_workload_name` and the
  semantic-convention `k8s_deployment_name`, `k8s_job_name`...) and the pod labels the operator
  allowed (`k8s_pod_label_<key>`). These are never copied onto device series; join them, e.g.
  GPU utilization by Deployment: `sum by (k8s_deployment_name) (hw_gpu_utilization_ratio *
  on(k8s_node_name, k8s_namespace_name, k8s_pod_name) group_left(k8s_deployment_name)
  k8s_pod_workload_info)`. See docs/kubernetes-api.md.

- **`process_*`** (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
  `process_open_fds`, `process_max_fds`, `process_start_time_seconds`,
  `process_virtual_memory_bytes`) are the exporter's own process, from prometheus_client's
  process collector, read at scrape time, as every Prometheus exporter has them; on
  `/metrics` only (an OTLP pipeline has the Collector's own host and process receivers).
- A value a device does not support (NVML NOT_SUPPORTED, a missing sysfs file) has **no
  series**; it is never reported as 0.

"""


def _doc_label(attribute: str) -> str:
    if attribute.endswith(".<key>"):
        return prometheus_label(attribute.removesuffix(".<key>")) + "_<key>"
    return prometheus_label(attribute)


def _group_cell(spec: MetricSpec) -> str:
    if not spec.value_groups:
        return f"`{spec.group}`"
    by: dict[str, list[str]] = {}
    for key, value, group in spec.value_groups:
        by.setdefault(group, []).append(f'`{_doc_label(key)}="{value}"`')
    others = "; ".join(f"`{g}`: {', '.join(v)}" for g, v in by.items())
    return f"`{spec.group}`; by label: {others}"


def markdown() -> str:
    """docs/metrics.md."""
    out = [_DOC_HEAD, _GROUPS_HEAD]
    for group in GROUPS:
        default = "always" if group.name == CORE else ("on" if group.default else "off")
        out.append(f"| `{group.name}` | {default} | {group.help} |\n")
    out.append("\n")
    titles = {
        Scope.DEVICE: "Device metrics",
        Scope.ALLOCATION: "Allocation metrics (from PodResources)",
        Scope.POD: "Pod metrics (from the Kubernetes API, `--kubernetes.api`)",
        Scope.WORKLOAD: "Workload metrics (from process attribution, docs/attribution.md)",
        Scope.EXPORTER: "Exporter self-metrics",
    }
    for scope, title in titles.items():
        out.append(f"## {title}\n\n")
        out.append(
            "| Prometheus name | type | OpenTelemetry name | unit | labels | group | help |\n"
        )
        out.append("|---|---|---|---|---|---|---|\n")
        for s in SPECS_LIST:
            if s.scope is not scope:
                continue
            typ = "counter" if s.kind is Kind.COUNTER else "gauge"
            otel = f"{s.name} ({s.kind.value})"
            labels = ", ".join(f"`{_doc_label(a)}`" for a in s.attributes)
            unit = s.unit or "-"
            cells = (f"`{s.prom_name}`", typ, f"`{otel}`", f"`{unit}`", labels, _group_cell(s))
            out.append(f"| {' | '.join(cells)} | {s.help} |\n")
        out.append("\n")
    out.append(
        "## Attributes (labels)\n\n| Prometheus label | OpenTelemetry attribute | meaning |\n"
    )
    out.append("|---|---|---|\n")
    for key, meaning in ATTRIBUTES.items():
        out.append(f"| `{_doc_label(key)}` | `{key}` | {meaning} |\n")
    return "".join(out)


if __name__ == "__main__":
    print(markdown(), end="")
