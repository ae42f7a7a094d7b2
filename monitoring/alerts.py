"""The alert rules, each with the promtool unit tests that show it firing and not firing.

This is the one source of the plain rule file, the PrometheusRule and the promtool test
file. Expressions, series and labels use OpenTelemetry names (`monitoring.promql`);
annotation placeholders `{hw.id}` become `{{ $labels.hw_id }}` in the rules and the label's
value in the tests' expected annotations.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from monitoring.promql import label, promql

JOB = "kube-device-exporter"
"""The Prometheus job of the exporter's targets (ServiceMonitor and PodMonitor set it with
`jobLabel`; a hand-written scrape config must use it as `job_name`)."""
CRITICAL_XIDS = ("48", "62", "64", "74", "79", "95", "119", "120")
"""XIDs that mean the GPU needs attention now: double-bit ECC (48), internal micro-controller
halt (62), row-remap failure (64), NVLink error (74), fallen off the bus (79), uncontained
ECC error (95), GSP RPC timeout/error (119, 120)."""
IDLE_THRESHOLD = 0.05
DEVICE = "k8s.node.name, hw.id, hw.model"
KEY = "k8s.node.name, hw.id"


@dataclass(frozen=True, slots=True)
class Case:
    """A promtool unit test of one alert: input series, an evaluation time, and the label
    sets (beyond alertname and severity) of the alerts that must be firing then; none means
    the alert must not fire."""

    title: str
    series: dict[str, str]
    eval_time: str
    fires: tuple[dict[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Alert:
    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str
    cases: tuple[Case, ...] = field(default=())


def _new_or_increased(selector: str, by: str, window: str = "10m") -> str:
    """Counter grew in `window`, or its series appeared in it: the first event of an error
    code creates the series at 1, which `increase()` alone never sees."""
    return (
        f"sum by ({by}) (increase({selector}[{window}])) > 0"
        f" or (max by ({by}) ({selector}) unless max by ({by}) ({selector} offset {window}))"
    )


N1 = 'k8s.node.name="node-1"'
GPU = f'{N1}, hw.id="GPU-1", hw.model="NVIDIA H100"'
GPU_LABELS = {"k8s.node.name": "node-1", "hw.id": "GPU-1", "hw.model": "NVIDIA H100"}
XID = "hw.gpu.xid.errors"
CRITICAL = "|".join(CRITICAL_XIDS)


def _xid_alerts() -> list[Alert]:
    by = f"{DEVICE}, hw.gpu.xid"
    return [
        Alert(
            "KubeDeviceXidCritical",
            _new_or_increased(f'{XID}{{hw.gpu.xid=~"{CRITICAL}"}}', by),
            "0m",
            "critical",
            "GPU {hw.id} on {k8s.node.name} reported critical XID {hw.gpu.xid}",
            "XID {hw.gpu.xid} on {hw.model} {hw.id} (node {k8s.node.name}) usually means the "
            "GPU needs a reset or service; drain the node's GPU workloads.",
            (
                Case(
                    "first XID 79 creates the series",
                    {f'{XID}{{{GPU}, hw.gpu.xid="79"}}': "_x5 1+0x20"},
                    "10m",
                    ({**GPU_LABELS, "hw.gpu.xid": "79"},),
                ),
                Case(
                    "XID 48 count grows",
                    {f'{XID}{{{GPU}, hw.gpu.xid="48"}}': "1+0x5 2+0x10"},
                    "8m",
                    ({**GPU_LABELS, "hw.gpu.xid": "48"},),
                ),
                Case(
                    "non-critical XID 31",
                    {f'{XID}{{{GPU}, hw.gpu.xid="31"}}': "_x5 1+0x20"},
                    "10m",
                ),
                Case(
                    "an old XID 79, nothing new",
                    {f'{XID}{{{GPU}, hw.gpu.xid="79"}}': "1+0x40"},
                    "30m",
                ),
            ),
        ),
        Alert(
            "KubeDeviceXidError",
            _new_or_increased(f'{XID}{{hw.gpu.xid!~"{CRITICAL}"}}', by),
            "0m",
            "warning",
            "GPU {hw.id} on {k8s.node.name} reported XID {hw.gpu.xid}",
            "XID {hw.gpu.xid} on {hw.model} {hw.id} (node {k8s.node.name}): often an "
            "application fault (e.g. 13, 31, 43); look at the workload's logs.",
            (
                Case(
                    "first XID 31",
                    {f'{XID}{{{GPU}, hw.gpu.xid="31"}}': "_x5 1+0x20"},
                    "10m",
                    ({**GPU_LABELS, "hw.gpu.xid": "31"},),
                ),
                Case(
                    "critical XID 79 is the other alert's",
                    {f'{XID}{{{GPU}, hw.gpu.xid="79"}}': "_x5 1+0x20"},
                    "10m",
                ),
                Case(
                    "XID 13 stopped growing long ago",
                    {f'{XID}{{{GPU}, hw.gpu.xid="13"}}': "1+1x5 6+0x40"},
                    "30m",
                ),
            ),
        ),
    ]


def _memory_alerts() -> list[Alert]:
    errors = "hw.errors"
    return [
        Alert(
            "KubeDeviceUncorrectableEccErrors",
            _new_or_increased(f'{errors}{{error.type="ecc_uncorrected"}}', DEVICE),
            "0m",
            "critical",
            "Uncorrectable ECC errors on {hw.id} ({k8s.node.name})",
            "{hw.model} {hw.id} on {k8s.node.name} counted uncorrectable ECC errors: data "
            "may be corrupt; the device needs a reset and may need replacing.",
            (
                Case(
                    "uncorrected count grows",
                    {f'{errors}{{{GPU}, error.type="ecc_uncorrected"}}': "0+0x5 2+0x10"},
                    "8m",
                    (GPU_LABELS,),
                ),
                Case(
                    "corrected errors only",
                    {
                        f'{errors}{{{GPU}, error.type="ecc_corrected"}}': "0+5x20",
                        f'{errors}{{{GPU}, error.type="ecc_uncorrected"}}': "0+0x20",
                    },
                    "15m",
                ),
                Case(
                    "old uncorrected count, nothing new",
                    {f'{errors}{{{GPU}, error.type="ecc_uncorrected"}}': "3+0x40"},
                    "30m",
                ),
            ),
        ),
        Alert(
            "KubeDeviceRowRemapFailed",
            f"max by ({DEVICE}) (hw.gpu.memory.row_remap.failed) == 1",
            "0m",
            "critical",
            "Row remapping failed on {hw.id} ({k8s.node.name})",
            "{hw.model} {hw.id} on {k8s.node.name} has no spare memory rows left: the GPU "
            "needs service.",
            (
                Case(
                    "failed",
                    {f"hw.gpu.memory.row_remap.failed{{{GPU}}}": "1+0x5"},
                    "2m",
                    (GPU_LABELS,),
                ),
                Case("not failed", {f"hw.gpu.memory.row_remap.failed{{{GPU}}}": "0+0x5"}, "2m"),
            ),
        ),
        Alert(
            "KubeDeviceRowRemapPending",
            f"max by ({DEVICE}) (hw.gpu.memory.row_remap.pending) == 1",
            "15m",
            "warning",
            "Row remap pending on {hw.id} ({k8s.node.name})",
            "{hw.model} {hw.id} on {k8s.node.name} has remapped memory rows waiting for a GPU "
            "reset; schedule one when its workloads allow.",
            (
                Case(
                    "pending for 20m",
                    {f"hw.gpu.memory.row_remap.pending{{{GPU}}}": "1+0x30"},
                    "20m",
                    (GPU_LABELS,),
                ),
                Case(
                    "pending for 10m only",
                    {f"hw.gpu.memory.row_remap.pending{{{GPU}}}": "1+0x30"},
                    "10m",
                ),
            ),
        ),
    ]


def _throttle_alerts() -> list[Alert]:
    throttled = "hw.gpu.clock.throttled"
    reason = "hw.gpu.clock.throttle_reason"
    by = f"{DEVICE}, {reason}"
    return [
        Alert(
            "KubeDeviceThermalThrottling",
            f'max by ({by}) ({throttled}{{{reason}=~".*thermal.*"}}) == 1',
            "10m",
            "warning",
            "{hw.id} on {k8s.node.name} is thermally throttled",
            "Clocks of {hw.model} {hw.id} on {k8s.node.name} are held down by "
            "{hw.gpu.clock.throttle_reason}: check cooling and airflow.",
            (
                Case(
                    "thermal slowdown for 15m",
                    {f'{throttled}{{{GPU}, {reason}="hw_thermal_slowdown"}}': "1+0x20"},
                    "15m",
                    ({**GPU_LABELS, reason: "hw_thermal_slowdown"},),
                ),
                Case(
                    "power capped, not thermal",
                    {
                        f'{throttled}{{{GPU}, {reason}="sw_power_cap"}}': "1+0x20",
                        f'{throttled}{{{GPU}, {reason}="sw_thermal_slowdown"}}': "0+0x20",
                    },
                    "15m",
                ),
            ),
        ),
        Alert(
            "KubeDevicePowerThrottling",
            f'max by ({by}) ({throttled}{{{reason}=~".*power.*"}}) == 1',
            "30m",
            "info",
            "{hw.id} on {k8s.node.name} is held at its power limit",
            "Clocks of {hw.model} {hw.id} on {k8s.node.name} have been held down by "
            "{hw.gpu.clock.throttle_reason} for 30 minutes.",
            (
                Case(
                    "power capped for 40m",
                    {f'{throttled}{{{GPU}, {reason}="sw_power_cap"}}': "1+0x45"},
                    "40m",
                    ({**GPU_LABELS, reason: "sw_power_cap"},),
                ),
                Case(
                    "power capped for 10m only",
                    {f'{throttled}{{{GPU}, {reason}="sw_power_cap"}}': "0+0x30 1+0x10"},
                    "40m",
                ),
            ),
        ),
    ]


def _device_state_alerts() -> list[Alert]:
    info = "hw.info"
    identity = "k8s.node.name, hw.id, hw.type, hw.vendor, hw.model"
    device = f'{GPU}, hw.type="gpu", hw.vendor="nvidia"'
    device_labels = {**GPU_LABELS, "hw.type": "gpu", "hw.vendor": "nvidia"}
    exporter_up = {
        f"kube_device_exporter.build.info{{{N1}}}": "1+0x40",
        f'kube_device_exporter.source.success{{{N1}, source="nvml"}}': "1+0x40",
    }
    return [
        Alert(
            "KubeDeviceFailed",
            f'max by ({identity}) (hw.status{{hw.state="failed"}}) == 1',
            "2m",
            "critical",
            "{hw.id} on {k8s.node.name} reports a failed state",
            "{hw.vendor} {hw.model} {hw.id} on {k8s.node.name} reports status failed.",
            (
                Case(
                    "failed",
                    {f'hw.status{{{device}, hw.state="failed"}}': "1+0x10"},
                    "5m",
                    (device_labels,),
                ),
                Case(
                    "ok",
                    {
                        f'hw.status{{{device}, hw.state="failed"}}': "0+0x10",
                        f'hw.status{{{device}, hw.state="ok"}}': "1+0x10",
                    },
                    "5m",
                ),
            ),
        ),
        Alert(
            "KubeDeviceDegraded",
            f'max by ({identity}) (hw.status{{hw.state="degraded"}}) == 1',
            "15m",
            "warning",
            "{hw.id} on {k8s.node.name} is degraded",
            "{hw.vendor} {hw.model} {hw.id} on {k8s.node.name} has reported status degraded "
            "for 15 minutes.",
            (
                Case(
                    "degraded 20m",
                    {f'hw.status{{{device}, hw.state="degraded"}}': "1+0x30"},
                    "20m",
                    (device_labels,),
                ),
                Case(
                    "degraded 5m",
                    {f'hw.status{{{device}, hw.state="degraded"}}': "0+0x10 1+0x5"},
                    "15m",
                ),
            ),
        ),
        Alert(
            "KubeDeviceLost",
            f'max by ({identity}) (max_over_time({info}{{hw.gpu.mig.profile=""}}[1h]))'
            f" unless on({KEY}) {info}"
            " and on(k8s.node.name) kube_device_exporter.build.info"
            " unless on(k8s.node.name)"
            " (min by (k8s.node.name) (kube_device_exporter.source.success) == 0)",
            "5m",
            "critical",
            "{hw.id} vanished from {k8s.node.name}",
            "{hw.vendor} {hw.model} {hw.id} was seen on {k8s.node.name} in the last hour but "
            "is gone while the exporter and its sources run: it fell off the bus, was "
            "unbound from its driver or was removed.",
            (
                Case(
                    "device gone, exporter fine",
                    {f"{info}{{{device}}}": "1+0x10", **exporter_up},
                    "25m",
                    (device_labels,),
                ),
                Case("device still there", {f"{info}{{{device}}}": "1+0x40", **exporter_up}, "25m"),
                Case(
                    "exporter gone too",
                    {
                        f"{info}{{{device}}}": "1+0x10",
                        f"kube_device_exporter.build.info{{{N1}}}": "1+0x10",
                    },
                    "25m",
                ),
                Case(
                    "its source is failing",
                    {
                        f"{info}{{{device}}}": "1+0x10",
                        f"kube_device_exporter.build.info{{{N1}}}": "1+0x40",
                        f'kube_device_exporter.source.success{{{N1}, source="nvml"}}': (
                            "1+0x10 0+0x30"
                        ),
                    },
                    "25m",
                ),
                Case(
                    "a MIG slice removed by reconfiguration",
                    {f'{info}{{{device}, hw.gpu.mig.profile="1g.10gb"}}': "1+0x10", **exporter_up},
                    "25m",
                ),
            ),
        ),
    ]


def _idle_alerts() -> list[Alert]:
    util = 'hw.gpu.utilization{hw.gpu.task="general"}'
    holder = "k8s.namespace.name, k8s.pod.name, k8s.container.name, hw.allocation.resource"
    alloc = (
        f'hw.allocation.info{{{GPU}, k8s.namespace.name="ml", k8s.pod.name="train-0",'
        ' k8s.container.name="pytorch", hw.allocation.resource="nvidia.com/gpu",'
        ' hw.allocation.device_id="GPU-1", hw.allocation.shared="false"}'
    )
    fired = {
        **GPU_LABELS,
        "k8s.namespace.name": "ml",
        "k8s.pod.name": "train-0",
        "k8s.container.name": "pytorch",
        "hw.allocation.resource": "nvidia.com/gpu",
    }
    gpu_util = f'hw.gpu.utilization{{{GPU}, hw.gpu.task="general"}}'
    return [
        Alert(
            "KubeDeviceAllocatedIdle",
            f"(max by ({KEY}) (max_over_time({util}[15m])) < {IDLE_THRESHOLD})"
            f" * on({KEY}) group_right()"
            f' max by ({DEVICE}, {holder}) (hw.allocation.info{{hw.id!=""}})',
            "45m",
            "info",
            "{k8s.namespace.name}/{k8s.pod.name} holds {hw.id} but leaves it idle",
            "{k8s.namespace.name}/{k8s.pod.name} (container {k8s.container.name}) holds "
            "{hw.allocation.resource} {hw.model} {hw.id} on {k8s.node.name}, and its "
            f"utilization has stayed below {IDLE_THRESHOLD:.0%} for an hour.",
            (
                Case("idle for 70m", {gpu_util: "0.01+0x90", alloc: "1+0x90"}, "70m", (fired,)),
                Case(
                    "busy 30 minutes ago",
                    {gpu_util: "0.01+0x30 0.9 0.01+0x58", alloc: "1+0x90"},
                    "70m",
                ),
                Case("idle but nobody holds it", {gpu_util: "0.01+0x90"}, "70m"),
            ),
        ),
    ]


def _exporter_alerts() -> list[Alert]:
    up = f'up{{job="{JOB}", instance="10.0.0.1:9405"}}'
    return [
        Alert(
            "KubeDeviceExporterDown",
            f'up{{job="{JOB}"}} == 0',
            "5m",
            "warning",
            "kube-device-exporter target {instance} is down",
            "Prometheus cannot scrape kube-device-exporter at {instance}: device metrics and "
            "pod attribution for that node are missing.",
            (
                Case("down", {up: "0+0x10"}, "6m", ({"job": JOB, "instance": "10.0.0.1:9405"},)),
                Case("up", {up: "1+0x10"}, "6m"),
            ),
        ),
        Alert(
            "KubeDeviceExporterAbsent",
            f'absent(up{{job="{JOB}"}})',
            "15m",
            "warning",
            "No kube-device-exporter target",
            f"Prometheus has no target with job={JOB}: the DaemonSet, its Service or the "
            "ServiceMonitor/PodMonitor is missing or not selected.",
            (
                Case("absent", {'up{job="other"}': "1+0x20"}, "16m", ({"job": JOB},)),
                Case("present", {up: "1+0x20"}, "16m"),
            ),
        ),
        Alert(
            "KubeDeviceExporterKubeletUnreachable",
            "max by (k8s.node.name) (kube_device_exporter.podresources.up) == 0",
            "5m",
            "warning",
            "kube-device-exporter on {k8s.node.name} cannot read the kubelet",
            "PodResources List fails on {k8s.node.name}: devices lose their pod labels. Check "
            "the pod-resources mount (kubelet root directory) and SELinux labels.",
            (
                Case(
                    "unreachable",
                    {f'kube_device_exporter.podresources.up{{{N1}, api_version=""}}': "0+0x10"},
                    "6m",
                    ({"k8s.node.name": "node-1"},),
                ),
                Case(
                    "connected",
                    {f'kube_device_exporter.podresources.up{{{N1}, api_version="v1"}}': "1+0x10"},
                    "6m",
                ),
            ),
        ),
        Alert(
            "KubeDeviceExporterSourceFailing",
            "min by (k8s.node.name, source) (kube_device_exporter.source.success) == 0",
            "10m",
            "warning",
            "Source {source} fails on {k8s.node.name}",
            "The {source} collector of kube-device-exporter on {k8s.node.name} has failed for "
            "10 minutes: its devices are missing. The exporter's log says why.",
            (
                Case(
                    "failing",
                    {f'kube_device_exporter.source.success{{{N1}, source="nvml"}}': "0+0x15"},
                    "11m",
                    ({"k8s.node.name": "node-1", "source": "nvml"},),
                ),
                Case(
                    "failed briefly",
                    {f'kube_device_exporter.source.success{{{N1}, source="nvml"}}': "0+0x5 1+0x10"},
                    "11m",
                ),
            ),
        ),
        Alert(
            "KubeDeviceExporterCycleStalled",
            "time() - max by (k8s.node.name)"
            " (kube_device_exporter.cycle.last_success_timestamp) > 300",
            "5m",
            "warning",
            "kube-device-exporter on {k8s.node.name} stopped collecting",
            "The last collection cycle on {k8s.node.name} finished more than 5 minutes ago "
            "although the exporter still answers: /metrics serves old values.",
            (
                Case(
                    "stalled at 1m",
                    {f"kube_device_exporter.cycle.last_success_timestamp{{{N1}}}": "60+0x20"},
                    "15m",
                    ({"k8s.node.name": "node-1"},),
                ),
                Case(
                    "collecting",
                    {f"kube_device_exporter.cycle.last_success_timestamp{{{N1}}}": "0+60x20"},
                    "15m",
                ),
            ),
        ),
    ]


GROUPS: dict[str, list[Alert]] = {
    "kube-device-exporter.devices": [
        *_xid_alerts(),
        *_memory_alerts(),
        *_throttle_alerts(),
        *_device_state_alerts(),
        *_idle_alerts(),
    ],
    "kube-device-exporter.exporter": _exporter_alerts(),
}

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_.]*)\}")


def _prom_label(key: str) -> str:
    return key if "." not in key else label(key)


def template(text: str) -> str:
    """`{hw.id}` -> `{{ $labels.hw_id }}` (Prometheus alert template)."""
    return _PLACEHOLDER.sub(lambda m: "{{ $labels." + _prom_label(m[1]) + " }}", text)


def render(text: str, labels: dict[str, str]) -> str:
    """What Prometheus makes of `template(text)` for an alert with these labels."""
    return _PLACEHOLDER.sub(lambda m: labels[_prom_label(m[1])], text)


def rule_groups() -> list[dict[str, object]]:
    groups: list[dict[str, object]] = []
    for name, alerts in GROUPS.items():
        rules = []
        for alert in alerts:
            rule: dict[str, object] = {"alert": alert.name, "expr": promql(alert.expr)}
            if alert.for_ != "0m":
                rule["for"] = alert.for_
            rule["labels"] = {"severity": alert.severity}
            rule["annotations"] = {
                "summary": template(alert.summary),
                "description": template(alert.description),
            }
            rules.append(rule)
        groups.append({"name": name, "rules": rules})
    return groups


def unit_tests(rule_file: str) -> dict[str, object]:
    """The promtool test file: one test per case, each with its own input series."""
    tests = []
    for alerts in GROUPS.values():
        for alert in alerts:
            for case in alert.cases:
                expected = []
                for fired in case.fires:
                    labels = {_prom_label(k): v for k, v in fired.items()}
                    labels_all = {**labels, "severity": alert.severity}
                    expected.append(
                        {
                            "exp_labels": labels_all,
                            "exp_annotations": {
                                "summary": render(alert.summary, labels),
                                "description": render(alert.description, labels),
                            },
                        }
                    )
                tests.append(
                    {
                        "name": f"{alert.name}: {case.title}",
                        "interval": "1m",
                        "input_series": [
                            {"series": promql(s), "values": v} for s, v in case.series.items()
                        ],
                        "alert_rule_test": [
                            {
                                "eval_time": case.eval_time,
                                "alertname": alert.name,
                                "exp_alerts": expected,
                            }
                        ],
                    }
                )
    return {"rule_files": [rule_file], "evaluation_interval": "1m", "tests": tests}
