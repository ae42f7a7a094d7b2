"""The DRA alerts (`--kubernetes.dra`): a pod on a tainted, unhealthy or not ready device, and
a device whose taints disagree with what its hardware says. Each with its promtool cases."""

from __future__ import annotations

from monitoring.alert_rule import N1, Alert, Case

BLOCKING = 'hw.dra.taint.effect=~"NoSchedule|NoExecute"'
DEVICE = "k8s.node.name, hw.allocation.resource, hw.allocation.pool, hw.allocation.device_id"
NAMES = (
    'hw.allocation.resource="gpu.nvidia.com", hw.allocation.pool="node-1", '
    'hw.allocation.device_id="gpu-2"'
)
DEVICE_LABELS = {
    "k8s.node.name": "node-1",
    "hw.allocation.resource": "gpu.nvidia.com",
    "hw.allocation.pool": "node-1",
    "hw.allocation.device_id": "gpu-2",
}
HOLDER = 'k8s.namespace.name="serving", k8s.pod.name="infer-a", k8s.container.name="vllm"'
HELD = f'hw.allocation.info{{{N1}, hw.id="GPU-2", hw.allocation.kind="dra", {NAMES}, {HOLDER}}}'
TAINT = (
    f'hw.dra.device.taint{{{N1}, hw.id="GPU-2", {NAMES}, hw.dra.taint.key="gpu.nvidia.com/'
    'unhealthy", hw.dra.taint.value="xid-79", hw.dra.taint.source="slice"'
)
INFO = f'hw.dra.device.info{{{N1}, hw.id="GPU-2", {NAMES}, hw.dra.kind="gpu"}}'
STATUS = f'hw.status{{{N1}, hw.id="GPU-2", hw.type="gpu", hw.vendor="nvidia"'
CONDITION = (
    f'hw.dra.allocation.condition{{{N1}, k8s.namespace.name="serving", k8s.pod.name="infer-a", '
    f'hw.allocation.claim="serving/infer-a-gpu", hw.id="GPU-2", {NAMES}, '
    'hw.dra.condition="Ready", hw.dra.condition.reason="NetworkDeviceNotReady"'
)


def alerts() -> list[Alert]:
    taint_labels = {
        **DEVICE_LABELS,
        "hw.id": "GPU-2",
        "hw.dra.taint.key": "gpu.nvidia.com/unhealthy",
        "hw.dra.taint.effect": "NoExecute",
    }
    health = (
        f'hw.dra.allocation.health{{{N1}, {HOLDER}, hw.allocation.claim="infer-a-gpu", '
        f'hw.id="GPU-2", {NAMES}'
    )
    health_labels = {
        **DEVICE_LABELS,
        "hw.id": "GPU-2",
        "k8s.namespace.name": "serving",
        "k8s.pod.name": "infer-a",
        "k8s.container.name": "vllm",
        "hw.allocation.claim": "infer-a-gpu",
    }
    condition_labels = {
        **DEVICE_LABELS,
        "hw.id": "GPU-2",
        "k8s.namespace.name": "serving",
        "k8s.pod.name": "infer-a",
        "hw.allocation.claim": "serving/infer-a-gpu",
        "hw.dra.condition": "Ready",
        "hw.dra.condition.reason": "NetworkDeviceNotReady",
    }
    by_taint = f"{DEVICE}, hw.id, hw.dra.taint.key, hw.dra.taint.effect"
    by_holder = f"{DEVICE}, hw.id, k8s.namespace.name, k8s.pod.name, k8s.container.name, "
    by_holder += "hw.allocation.claim"
    return [
        Alert(
            "KubeDeviceDraPodOnTaintedDevice",
            f"max by ({by_taint}) (hw.dra.device.taint{{{BLOCKING}}}"
            f' and on({DEVICE}) hw.allocation.info{{hw.allocation.kind="dra"}})',
            "5m",
            "warning",
            "DRA device {hw.allocation.device_id} on {k8s.node.name} is tainted "
            "{hw.dra.taint.effect} and still held",
            "{hw.allocation.resource} device {hw.allocation.device_id} ({hw.id}) on "
            "{k8s.node.name} carries taint {hw.dra.taint.key} ({hw.dra.taint.effect}) while a "
            "container still holds it: the pod tolerates the taint or its eviction is stuck.",
            (
                Case(
                    "tainted NoExecute, pod still on it",
                    {HELD: "1+0x20", f'{TAINT}, hw.dra.taint.effect="NoExecute"}}': "_x3 1+0x20"},
                    "10m",
                    (taint_labels,),
                ),
                Case(
                    "an effect None taint is informational",
                    {HELD: "1+0x20", f'{TAINT}, hw.dra.taint.effect="None"}}': "1+0x20"},
                    "10m",
                ),
                Case(
                    "tainted, nobody holds it",
                    {f'{TAINT}, hw.dra.taint.effect="NoExecute"}}': "1+0x20"},
                    "10m",
                ),
            ),
        ),
        Alert(
            "KubeDeviceDraAllocationUnhealthy",
            f'max by ({by_holder}) (hw.dra.allocation.health{{hw.dra.health="Unhealthy"}})',
            "2m",
            "warning",
            "Pod {k8s.namespace.name}/{k8s.pod.name} runs on an unhealthy DRA device",
            "The kubelet reports device {hw.allocation.device_id} ({hw.id}) of claim "
            "{hw.allocation.claim} Unhealthy for container {k8s.container.name} of "
            "{k8s.namespace.name}/{k8s.pod.name} on {k8s.node.name} (allocatedResourcesStatus, "
            "from its DRA driver's health stream); the pod keeps running and stays Ready.",
            (
                Case(
                    "unhealthy for 5m",
                    {f'{health}, hw.dra.health="Unhealthy"}}': "_x2 1+0x10"},
                    "8m",
                    (health_labels,),
                ),
                Case(
                    "healthy",
                    {f'{health}, hw.dra.health="Healthy"}}': "1+0x10"},
                    "8m",
                ),
                Case(
                    "unknown (a driver without a health stream) is not unhealthy",
                    {f'{health}, hw.dra.health="Unknown"}}': "1+0x10"},
                    "8m",
                ),
            ),
        ),
        Alert(
            "KubeDeviceDraDeviceNotReady",
            f"max by ({DEVICE}, hw.id, k8s.namespace.name, k8s.pod.name, hw.allocation.claim,"
            " hw.dra.condition, hw.dra.condition.reason)"
            ' (hw.dra.allocation.condition{hw.dra.condition.status="False"})',
            "5m",
            "warning",
            "DRA device {hw.allocation.device_id} of {k8s.namespace.name}/{k8s.pod.name} is "
            "not {hw.dra.condition}",
            "The {hw.allocation.resource} driver reports condition {hw.dra.condition} False "
            "({hw.dra.condition.reason}) for device {hw.allocation.device_id} ({hw.id}) of "
            "claim {hw.allocation.claim}, held by {k8s.namespace.name}/{k8s.pod.name} on "
            "{k8s.node.name} (the claim's status.devices, KEP-4817): the pod runs with a device "
            "its driver did not set up (a NIC without its network, for DRANET).",
            (
                Case(
                    "not ready for 10m",
                    {f'{CONDITION}, hw.dra.condition.status="False"}}': "_x2 1+0x10"},
                    "8m",
                    (condition_labels,),
                ),
                Case(
                    "ready",
                    {f'{CONDITION}, hw.dra.condition.status="True"}}': "1+0x10"},
                    "8m",
                ),
                Case(
                    "unknown is not false",
                    {f'{CONDITION}, hw.dra.condition.status="Unknown"}}': "1+0x10"},
                    "8m",
                ),
            ),
        ),
        Alert(
            "KubeDeviceDraTaintedButHealthy",
            f'max by ({by_taint}) (hw.dra.device.taint{{{BLOCKING}, hw.id!=""}})'
            f' unless on(k8s.node.name, hw.id) (hw.status{{hw.state!="ok"}} == 1)',
            "30m",
            "info",
            "DRA device {hw.allocation.device_id} on {k8s.node.name} is tainted but its "
            "hardware reports ok",
            "{hw.allocation.resource} device {hw.allocation.device_id} ({hw.id}) on "
            "{k8s.node.name} has carried taint {hw.dra.taint.key} ({hw.dra.taint.effect}) for "
            "30 minutes while the exporter reads its hardware as ok: capacity is held back; "
            "remove the taint (or its DeviceTaintRule) if the cause is gone.",
            (
                Case(
                    "tainted for an hour, hardware ok",
                    {
                        f'{TAINT}, hw.dra.taint.effect="NoSchedule"}}': "1+0x60",
                        f'{STATUS}, hw.state="ok"}}': "1+0x60",
                    },
                    "45m",
                    ({**taint_labels, "hw.dra.taint.effect": "NoSchedule"},),
                ),
                Case(
                    "tainted and failed: the taint is right",
                    {
                        f'{TAINT}, hw.dra.taint.effect="NoExecute"}}': "1+0x60",
                        f'{STATUS}, hw.state="failed"}}': "1+0x60",
                    },
                    "45m",
                ),
            ),
        ),
        Alert(
            "KubeDeviceDraFailedNotTainted",
            f'max by (k8s.node.name, hw.id) (hw.status{{hw.state="failed"}} == 1)'
            " and on(k8s.node.name, hw.id) hw.dra.device.info"
            f" unless on(k8s.node.name, hw.id) hw.dra.device.taint{{{BLOCKING}}}",
            "5m",
            "warning",
            "Failed device {hw.id} on {k8s.node.name} is offered by DRA untainted",
            "{hw.id} on {k8s.node.name} reports a failed state, yet its DRA driver's "
            "ResourceSlice offers it with no NoSchedule/NoExecute taint: new claims can land "
            "on it. Taint it (a DeviceTaintRule) until it is repaired.",
            (
                Case(
                    "failed, offered untainted",
                    {f'{STATUS}, hw.state="failed"}}': "1+0x20", INFO: "1+0x20"},
                    "10m",
                    ({"k8s.node.name": "node-1", "hw.id": "GPU-2"},),
                ),
                Case(
                    "failed and tainted",
                    {
                        f'{STATUS}, hw.state="failed"}}': "1+0x20",
                        INFO: "1+0x20",
                        f'{TAINT}, hw.dra.taint.effect="NoExecute"}}': "1+0x20",
                    },
                    "10m",
                ),
                Case(
                    "failed, no DRA driver offers it",
                    {f'{STATUS}, hw.state="failed"}}': "1+0x20"},
                    "10m",
                ),
            ),
        ),
    ]
