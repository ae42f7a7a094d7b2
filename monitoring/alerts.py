"""The alert rules, each with the promtool unit tests that show it firing and not firing.

This is the one source of the plain rule file, the PrometheusRule and the promtool test
file. Expressions, series and labels use OpenTelemetry names (`monitoring.promql`);
annotation placeholders `{hw.id}` become `{{ $labels.hw_id }}` in the rules and the label's
value in the tests' expected annotations.
"""

from __future__ import annotations

import re

from exporter.derive.devicecodes import xids_of
from monitoring.alert_rule import N1, Alert, Case
from monitoring.dra_alerts import alerts as dra_alerts
from monitoring.promql import label, promql

JOB = "kube-device-exporter"
"""The Prometheus job of the exporter's targets (ServiceMonitor and PodMonitor set it with
`jobLabel`; a hand-written scrape config must use it as `job_name`)."""
XID_HARDWARE = xids_of("hardware")
"""XIDs of failing hardware, which needs a reset or service now: double-bit ECC error (48),
row-remap failure (64), NVLink error (74), fallen off the bus (79), uncontained ECC error
(95). Critical."""
XID_DRIVER = xids_of("driver")
"""XIDs of the driver, its firmware or the GPU's micro-controllers: corrupted push buffer (32),
driver firmware error (38), internal micro-controller halt (62), context switch timeout
(109), GSP RPC timeout and GSP error (119, 120); the GPU usually needs a reset, and
repeated ones a driver update. Warning."""
XID_APPLICATION = xids_of("application")
"""XIDs a program usually causes: graphics engine exception (13), GPU memory page fault
(31), channel stopped (43), preemptive cleanup after an earlier error (45). The workload's
owner reads its logs; nobody is paged. Info."""
XID_CLASSES = {"hardware": XID_HARDWARE, "driver": XID_DRIVER, "application": XID_APPLICATION}
RUNBOOK_BASE = (
    "https://github.com/kube-device-exporter/kube-device-exporter/blob/main/docs/runbooks.md"
)
"""Where docs/runbooks.md is published; the Helm chart's `prometheusRule.runbookBaseURL`
replaces it (a fork, an internal mirror)."""
IDLE_THRESHOLD = 0.05
DEVICE = "k8s.node.name, hw.id, hw.model"
KEY = "k8s.node.name, hw.id"


def _new_or_increased(selector: str, by: str, window: str = "10m") -> str:
    """Counter grew in `window`, or its series appeared in it: the first event of an error
    code creates the series at 1, which `increase()` alone never sees. "Appeared" counts only
    where the exporter already reported the device `window` ago (its `hw.info`): with no
    history at all (a restarted Prometheus on an emptyDir, a new HA replica, a scrape gap
    longer than the window), a series that is merely old is not new."""
    return (
        f"sum by ({by}) (increase({selector}[{window}])) > 0"
        f" or ((max by ({by}) ({selector}) unless max by ({by}) ({selector} offset {window}))"
        f" and on({KEY}) max by ({KEY}) (hw.info offset {window}))"
    )


GPU = f'{N1}, hw.id="GPU-1", hw.model="NVIDIA H100"'
GPU_LABELS = {"k8s.node.name": "node-1", "hw.id": "GPU-1", "hw.model": "NVIDIA H100"}
XID = "hw.gpu.xid.errors"
INFO = f'hw.info{{{GPU}, hw.type="gpu", hw.vendor="nvidia"}}'
"""The device's info series in test input: the exporter reported the device."""
REPORTED = {INFO: "1+0x60"}
"""Input where the exporter has reported the GPU since the start of the test."""


def _no_history_cases(series: str, first: str = "1") -> tuple[Case, ...]:
    """Where `series` is old but Prometheus has no history: must not fire."""
    return (
        Case(
            "Prometheus restarted with no history: an old count is not new",
            {series: f"{first}+0x20", INFO: "1+0x20"},
            "5m",
        ),
        Case(
            "new HA replica sees an old count",
            {series: "3+0x20", INFO: "1+0x20"},
            "9m",
        ),
        Case(
            "scrape gap longer than the window",
            {series: f"{first}+0x5 _x15 {first}+0x10", INFO: "1+0x5 _x15 1+0x10"},
            "22m",
        ),
    )


def _xid_alert(name: str, xid_class: str, severity: str, summary: str, advice: str) -> Alert:
    codes = XID_CLASSES[xid_class]
    other = next(c for k, cs in XID_CLASSES.items() if k != xid_class for c in cs)
    code = codes[0]
    by = f"{DEVICE}, hw.gpu.xid"
    series = f'{XID}{{{GPU}, hw.gpu.xid="{code}"}}'
    return Alert(
        name,
        _new_or_increased(f'{XID}{{hw.gpu.xid=~"{"|".join(codes)}"}}', by),
        "0m",
        severity,
        summary,
        f"XID {{hw.gpu.xid}} on {{hw.model}} {{hw.id}} (node {{k8s.node.name}}): {advice}",
        (
            Case(
                f"a new XID {code} on a device reported for 15m",
                {**REPORTED, series: "_x15 1+0x20"},
                "20m",
                ({**GPU_LABELS, "hw.gpu.xid": code},),
            ),
            Case(
                f"XID {code} count grows",
                {**REPORTED, series: "1+0x5 2+0x10"},
                "8m",
                ({**GPU_LABELS, "hw.gpu.xid": code},),
            ),
            Case(
                f"XID {other} is another class's",
                {**REPORTED, f'{XID}{{{GPU}, hw.gpu.xid="{other}"}}': "_x15 1+0x20"},
                "20m",
            ),
            Case(f"an old XID {code}, nothing new", {**REPORTED, series: "1+0x40"}, "30m"),
            *_no_history_cases(series),
        ),
    )


def _xid_alerts() -> list[Alert]:
    known = "|".join(c for codes in XID_CLASSES.values() for c in codes)
    by = f"{DEVICE}, hw.gpu.xid"
    unclassified = f'{XID}{{{GPU}, hw.gpu.xid="94"}}'
    return [
        _xid_alert(
            "KubeDeviceXidHardware",
            "hardware",
            "critical",
            "GPU {hw.id} on {k8s.node.name} reported hardware XID {hw.gpu.xid}",
            "the GPU is failing; drain its workloads, reset it and, if it recurs, have it "
            "serviced.",
        ),
        _xid_alert(
            "KubeDeviceXidDriver",
            "driver",
            "warning",
            "GPU {hw.id} on {k8s.node.name} reported driver XID {hw.gpu.xid}",
            "a driver or GPU firmware fault; the GPU usually needs a reset, and repeated "
            "ones a driver update.",
        ),
        _xid_alert(
            "KubeDeviceXidApplication",
            "application",
            "info",
            "A program on GPU {hw.id} ({k8s.node.name}) caused XID {hw.gpu.xid}",
            "usually the workload's own fault (bad memory access, killed or hung kernel); "
            "its owner should read its logs.",
        ),
        Alert(
            "KubeDeviceXidError",
            _new_or_increased(f'{XID}{{hw.gpu.xid!~"{known}"}}', by),
            "0m",
            "warning",
            "GPU {hw.id} on {k8s.node.name} reported XID {hw.gpu.xid}",
            "XID {hw.gpu.xid} on {hw.model} {hw.id} (node {k8s.node.name}) is in none of the "
            "kit's classes; look it up in NVIDIA's XID catalog.",
            (
                Case(
                    "a new XID 94, in no class",
                    {**REPORTED, unclassified: "_x15 1+0x20"},
                    "20m",
                    ({**GPU_LABELS, "hw.gpu.xid": "94"},),
                ),
                Case(
                    "classified XID 79 is another alert's",
                    {**REPORTED, f'{XID}{{{GPU}, hw.gpu.xid="79"}}': "_x15 1+0x20"},
                    "20m",
                ),
                Case("an old XID 94, nothing new", {**REPORTED, unclassified: "1+0x40"}, "30m"),
                *_no_history_cases(unclassified),
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
                    "first uncorrected error on a device reported for 15m",
                    {**REPORTED, f'{errors}{{{GPU}, error.type="ecc_uncorrected"}}': "_x15 1+0x20"},
                    "20m",
                    (GPU_LABELS,),
                ),
                *_no_history_cases(f'{errors}{{{GPU}, error.type="ecc_uncorrected"}}', "3"),
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
            f'max by ({by}) ({throttled}{{{reason}="sw_power_cap"}}) == 1',
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
                Case(
                    "a power brake is hardware, not the power limit",
                    {f'{throttled}{{{GPU}, {reason}="hw_power_brake_slowdown"}}': "1+0x45"},
                    "40m",
                ),
            ),
        ),
        Alert(
            "KubeDeviceHardwareSlowdown",
            f'max by ({by}) ({throttled}{{{reason}=~"hw_slowdown|hw_power_brake_slowdown"}}) == 1',
            "5m",
            "warning",
            "{hw.id} on {k8s.node.name} is slowed down by a hardware signal",
            "Clocks of {hw.model} {hw.id} on {k8s.node.name} are cut by "
            "{hw.gpu.clock.throttle_reason}: the board or the system (power supply, power "
            "brake, overheating board) asserted a slowdown.",
            (
                Case(
                    "power brake asserted for 10m",
                    {f'{throttled}{{{GPU}, {reason}="hw_power_brake_slowdown"}}': "1+0x15"},
                    "10m",
                    ({**GPU_LABELS, reason: "hw_power_brake_slowdown"},),
                ),
                Case(
                    "software power cap only",
                    {f'{throttled}{{{GPU}, {reason}="sw_power_cap"}}': "1+0x15"},
                    "10m",
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


def _unrequested_alerts() -> list[Alert]:
    who = "k8s.namespace.name, k8s.pod.name, k8s.container.name"
    base = (
        f'{GPU}, k8s.namespace.name="research", k8s.pod.name="dev-shell",'
        ' k8s.container.name="shell"'
    )
    unrequested = f'hw.gpu.container.processes{{{base}, hw.allocation.requested="false"}}'
    requested = f'hw.gpu.container.processes{{{base}, hw.allocation.requested="true"}}'
    fired = {
        **GPU_LABELS,
        "k8s.namespace.name": "research",
        "k8s.pod.name": "dev-shell",
        "k8s.container.name": "shell",
    }
    return [
        Alert(
            "KubeDeviceUsedWithoutRequest",
            f"max by ({DEVICE}, {who})"
            ' (hw.gpu.container.processes{hw.allocation.requested="false"}) > 0',
            "10m",
            "warning",
            "{k8s.namespace.name}/{k8s.pod.name} uses {hw.id} without holding it",
            "Processes of container {k8s.container.name} in {k8s.namespace.name}/"
            "{k8s.pod.name} use {hw.model} {hw.id} on {k8s.node.name}, which the kubelet did "
            "not give it (nor its parent or a slice of it): it takes time and memory from the "
            "pods that hold the device, and the scheduler does not know.",
            (
                Case("for 15m", {unrequested: "1+0x20"}, "15m", (fired,)),
                Case("the holder itself", {requested: "1+0x20"}, "15m"),
                Case("a few minutes only", {unrequested: "1+0x4 _x16"}, "15m"),
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
            "KubeDeviceExporterKubernetesApiUnavailable",
            "max by (k8s.node.name) (kube_device_exporter.kubernetes.up) == 0",
            "15m",
            "info",
            "kube-device-exporter on {k8s.node.name} cannot watch pods on the Kubernetes API",
            "With --kubernetes.api, the pod watch on {k8s.node.name} has failed for 15 minutes: "
            "k8s_pod_workload_info (pod UIDs, workloads, labels) is missing or stale there. "
            "Devices and pods are still exported from the kubelet.",
            (
                Case(
                    "forbidden",
                    {f"kube_device_exporter.kubernetes.up{{{N1}}}": "0+0x20"},
                    "16m",
                    ({"k8s.node.name": "node-1"},),
                ),
                Case(
                    "a re-list after 410",
                    {f"kube_device_exporter.kubernetes.up{{{N1}}}": "1+0x5 0 1+0x15"},
                    "16m",
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


def _kubelet_view_alerts() -> list[Alert]:
    allocatable = "hw.device.allocatable"
    gpu = f'{N1}, hw.id="GPU-1", hw.allocation.resource="nvidia.com/gpu"'
    series = f"{allocatable}{{{gpu}}}"
    gpu_labels = {
        "k8s.node.name": "node-1",
        "hw.id": "GPU-1",
        "hw.allocation.resource": "nvidia.com/gpu",
    }
    registered = "hw.allocation.resource.registered"
    plugin = f'{registered}{{{N1}, hw.allocation.resource="nvidia.com/gpu"}}'
    plugin_labels = {"k8s.node.name": "node-1", "hw.allocation.resource": "nvidia.com/gpu"}
    aligned = "hw.container.numa.aligned"
    holder = 'k8s.namespace.name="ml", k8s.pod.name="train-0", k8s.container.name="pytorch"'
    container = f"{aligned}{{{N1}, {holder}}}"
    worst = "hw.container.pcie.placement.worst"
    worst_series = f"{worst}{{{N1}, {holder}}}"
    container_labels = {
        "k8s.node.name": "node-1",
        "k8s.namespace.name": "ml",
        "k8s.pod.name": "train-0",
        "k8s.container.name": "pytorch",
    }
    return [
        Alert(
            "KubeDeviceNotAllocatable",
            f"max by (k8s.node.name, hw.id, hw.allocation.resource) ({allocatable}) == 0",
            "1m",
            "warning",
            "{hw.id} on {k8s.node.name} is no longer allocatable as {hw.allocation.resource}",
            "The kubelet on {k8s.node.name} no longer lists {hw.id} as allocatable "
            "{hw.allocation.resource}: its device plugin reported it unhealthy. The exporter "
            "still sees the device; the node has lost its capacity, and a pod that holds it "
            "keeps running on it.",
            (
                Case(
                    "left the list 5m ago",
                    {series: "1+0x5 0+0x10"},
                    "10m",
                    (gpu_labels,),
                ),
                Case("allocatable all along", {series: "1+0x15"}, "10m"),
                Case(
                    "a device plugin restart: gone for one scrape",
                    {series: "1+0x5 0 1+0x10"},
                    "6m",
                ),
                Case("came back", {series: "1+0x5 0+0x3 1+0x10"}, "12m"),
            ),
        ),
        Alert(
            "KubeDevicePluginNotRegistered",
            f"max by (k8s.node.name, hw.allocation.resource) ({registered}) == 0",
            "5m",
            "warning",
            "No device plugin for {hw.allocation.resource} is registered on {k8s.node.name}",
            "The kubelet on {k8s.node.name} lists no allocatable {hw.allocation.resource} "
            "device, although it did before or a container holds one: the resource's device "
            "plugin stopped and has not registered again. No new pod can get these devices "
            "on the node; pods that hold them keep running.",
            (
                Case(
                    "plugin stopped 10m ago",
                    {plugin: "1+0x5 0+0x15"},
                    "15m",
                    (plugin_labels,),
                ),
                Case("registered all along", {plugin: "1+0x20"}, "15m"),
                Case("a plugin upgrade: away for 2m", {plugin: "1+0x5 0+0x2 1+0x10"}, "9m"),
                Case("registered again", {plugin: "1+0x5 0+0x7 1+0x10"}, "15m"),
            ),
        ),
        Alert(
            "KubeDeviceContainerNumaMisaligned",
            "max by (k8s.node.name, k8s.namespace.name, k8s.pod.name, k8s.container.name)"
            f" ({aligned}) == 0",
            "5m",
            "info",
            "{k8s.namespace.name}/{k8s.pod.name} {k8s.container.name} has its devices and "
            "CPUs on different NUMA nodes",
            "Container {k8s.container.name} of {k8s.namespace.name}/{k8s.pod.name} on "
            "{k8s.node.name} holds devices on NUMA nodes other than its exclusive CPUs or its "
            "pinned memory: its host-device traffic crosses the socket interconnect.",
            (
                Case(
                    "misaligned since it started",
                    {container: "0+0x20"},
                    "10m",
                    (container_labels,),
                ),
                Case("aligned", {container: "1+0x20"}, "10m"),
                Case("misaligned pod deleted after 3m", {container: "0+0x3"}, "10m"),
            ),
        ),
        Alert(
            "KubeDeviceGpuNicCrossesCpuInterconnect",
            "max by (k8s.node.name, k8s.namespace.name, k8s.pod.name, k8s.container.name)"
            f" ({worst}) >= 5",
            "5m",
            "warning",
            "{k8s.namespace.name}/{k8s.pod.name} {k8s.container.name} has a GPU whose nearest "
            "NIC is across the CPU interconnect",
            "Container {k8s.container.name} of {k8s.namespace.name}/{k8s.pod.name} on "
            "{k8s.node.name} holds GPUs and RDMA NICs, and at least one of its GPUs has no NIC "
            "on its own CPU socket (nvidia-smi level SYS): GPUDirect RDMA from that GPU "
            "crosses the CPU interconnect, or falls back to copies through host memory. A "
            "multi-node training job runs at the speed of its slowest GPU's network path.",
            (
                Case(
                    "GPUs on one socket, NICs on the other, since it started",
                    {worst_series: "5+0x20"},
                    "10m",
                    (container_labels,),
                ),
                Case("each GPU has a NIC on its PCIe switch", {worst_series: "1+0x20"}, "10m"),
                Case("same socket, other host bridge", {worst_series: "4+0x20"}, "10m"),
                Case("badly placed pod deleted after 3m", {worst_series: "5+0x3"}, "10m"),
            ),
        ),
    ]


KSM_DAEMONSET = 'daemonset=~".*kube-device-exporter.*"'
"""The exporter's DaemonSet in kube-state-metrics' series: `kube-device-exporter` from the
kit, `<release>-kube-device-exporter` from the Helm chart."""


KSM_DEVICE_RESOURCES = (
    'resource=~"nvidia_com_gpu|nvidia_com_mig_.+|amd_com_gpu|gpu_intel_com_.+|habana_ai_gaudi.*"'
)
"""Device-plugin resources in kube-state-metrics' `kube_node_status_allocatable` (it writes
`nvidia.com/gpu` as `nvidia_com_gpu`): NVIDIA's GPUs and MIG strategy `mixed`, AMD's, Intel's
i915 and xe, Habana's Gaudi."""


def _coverage_alert() -> Alert:
    """A device node that the DaemonSet's node affinity does not select gets no pod, and
    nothing else says so: DESIRED counts only the nodes selected (seen on a real 1.36
    cluster, tests/test_real_cluster_kit.py)."""
    allocatable = "kube_node_status_allocatable"
    pod_info = "kube_pod_info"
    gpus = (
        f'{allocatable}{{job="kube-state-metrics", node="gpu-1", resource="nvidia_com_gpu",'
        ' unit="integer"}'
    )
    cpus = f'{allocatable}{{job="kube-state-metrics", node="cpu-1", resource="cpu", unit="core"}}'
    pod = (
        f'{pod_info}{{job="kube-state-metrics", namespace="kube-device-exporter",'
        ' pod="kube-device-exporter-x7k2p", node="gpu-1", created_by_kind="DaemonSet",'
        ' created_by_name="kube-device-exporter"}'
    )
    return Alert(
        "KubeDeviceExporterNodeNotSelected",
        f"count by (node) ({allocatable}{{{KSM_DEVICE_RESOURCES}}} > 0)"
        f' unless on (node) {pod_info}{{created_by_kind="DaemonSet",'
        f' created_by_name=~".*kube-device-exporter.*"}}',
        "15m",
        "warning",
        "{node} has devices but no kube-device-exporter pod",
        "Node {node} advertises devices (kube-state-metrics' kube_node_status_allocatable) "
        "but runs no pod of the kube-device-exporter DaemonSet: its node affinity matches none "
        "of the node's labels (no GPU feature discovery, NFD or cloud GPU label, and not "
        "kube-device-exporter.io/enabled=true), so the DaemonSet does not count the node and "
        "nothing else says so.",
        (
            Case(
                "a GPU node no term selects",
                {gpus: "8+0x30", cpus: "4+0x30"},
                "20m",
                ({"node": "gpu-1"},),
            ),
            Case("the exporter runs there", {gpus: "8+0x30", pod: "1+0x30"}, "20m"),
            Case("scheduled within 5m", {gpus: "8+0x30", pod: "_x5 1+0x25"}, "20m"),
        ),
    )


def _rollout_alerts() -> list[Alert]:
    unavailable = "kube_daemonset_status_number_unavailable"
    series = (
        f'{unavailable}{{job="kube-state-metrics", namespace="monitoring",'
        ' daemonset="kube-device-exporter"}'
    )
    unseen = "kube_device_exporter.devices.unseen"
    unseen_series = f'{unseen}{{{N1}, hw.allocation.resource="nvidia.com/gpu"}}'
    return [
        Alert(
            "KubeDeviceExporterDaemonSetUnavailable",
            f"max by (namespace, daemonset) ({unavailable}{{{KSM_DAEMONSET}}}) > 0",
            "15m",
            "warning",
            "kube-device-exporter pods of {namespace}/{daemonset} are unavailable",
            "DaemonSet {namespace}/{daemonset} has had pods that are not available for 15 "
            "minutes (Pending, crash-looping or not ready). A pod that is not ready leaves "
            "the Service's endpoints, so its target vanishes instead of going down: this "
            "alert, from kube-state-metrics, is what notices.",
            (
                Case(
                    "one pod crash-looping for 20m",
                    {series: "0+0x5 1+0x30"},
                    "25m",
                    ({"namespace": "monitoring", "daemonset": "kube-device-exporter"},),
                ),
                Case("a rollout that finished in 5m", {series: "0+0x5 1+0x5 0+0x20"}, "25m"),
                Case(
                    "another DaemonSet",
                    {
                        f'{unavailable}{{job="kube-state-metrics", namespace="kube-system",'
                        ' daemonset="kube-proxy"}': "1+0x30"
                    },
                    "25m",
                ),
            ),
        ),
        Alert(
            "KubeDeviceExporterDevicesUnseen",
            f"max by (k8s.node.name, hw.allocation.resource) ({unseen}) > 0",
            "10m",
            "warning",
            "{hw.allocation.resource} devices on {k8s.node.name} are invisible to the exporter",
            "The kubelet on {k8s.node.name} lists {hw.allocation.resource} devices that no "
            "source of kube-device-exporter can see: their metrics are missing. Usually the "
            "pod has no NVML (the nvidia RuntimeClass under CDI, or the GKE driver mounts, "
            "are missing).",
            (
                Case(
                    "8 GPUs unseen for 15m",
                    {unseen_series: "8+0x20"},
                    "15m",
                    ({"k8s.node.name": "node-1", "hw.allocation.resource": "nvidia.com/gpu"},),
                ),
                Case("every device seen", {unseen_series: "0+0x20"}, "15m"),
                Case("unseen while starting only", {unseen_series: "8+0x3 0+0x20"}, "15m"),
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
        *_kubelet_view_alerts(),
        *_unrequested_alerts(),
        *dra_alerts(),
    ],
    "kube-device-exporter.exporter": [*_exporter_alerts(), *_rollout_alerts(), _coverage_alert()],
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


def runbook_url(alert: str) -> str:
    """The alert's section of docs/runbooks.md (`## Name` makes the anchor `#name`)."""
    return f"{RUNBOOK_BASE}#{alert.lower()}"


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
                "runbook_url": runbook_url(alert.name),
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
                                "runbook_url": runbook_url(alert.name),
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
