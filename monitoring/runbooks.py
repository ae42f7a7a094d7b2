"""What to do when an alert fires: one runbook per alert, written to docs/runbooks.md; every
rule's `runbook_url` points at its section.

Kept apart from the rule expressions (monitoring/alerts.py) so the words and the PromQL can
change separately; `runbooks_md` refuses an alert without a runbook and a runbook without an
alert.
"""

from __future__ import annotations

from dataclasses import dataclass

from monitoring import alerts, devices, efficiency, workloads

EXEC = "kubectl -n kube-device-exporter exec ds/kube-device-exporter --"
LOGS = "kubectl -n kube-device-exporter logs ds/kube-device-exporter"


@dataclass(frozen=True, slots=True)
class Runbook:
    meaning: str
    actions: tuple[str, ...]


def _xid_table() -> str:
    rows = "".join(
        f"| {name} | {', '.join(codes)} |\n" for name, codes in alerts.XID_CLASSES.items()
    )
    return f"| Class | XIDs |\n|---|---|\n{rows}"


def see(title: str, *, row: str = "", panel: str = "") -> str:
    """A pointer to a dashboard and one of its rows or panels, by the generated titles
    (tests/test_runbook_dashboards.py checks each exists in dashboards/*.json): written as
    `dashboard *TITLE*, row *ROW*` or `..., panel *PANEL*`."""
    part = f", row *{row}*" if row else f", panel *{panel}*" if panel else ""
    return f"dashboard *{title}*{part}"


_DRAIN = "Cordon the node (`kubectl cordon NODE`) so no new work lands on the GPU."
_WHO = (
    'Find the pods on the GPU: `hw_allocation_info{k8s_node_name="NODE", hw_id="ID"}` '
    f"({see(workloads.TITLE, row='Who uses what')})."
)
_RESET = (
    "When its workloads are gone, reset the GPU (`nvidia-smi -r -i INDEX` on the node, or "
    "reboot it); uncordon once the exporter shows it healthy."
)

RUNBOOKS: dict[str, Runbook] = {
    "KubeDeviceXidHardware": Runbook(
        "The GPU reported an XID of failing hardware (ECC double-bit or uncontained error, "
        "row-remap failure, NVLink error, fallen off the bus). Jobs on it have failed or "
        "will; their results may be corrupt.",
        (
            _DRAIN,
            _WHO,
            _RESET,
            "If the same GPU reports it again after the reset, open a hardware ticket with the "
            "XID, the serial (`hw_info`) and `nvidia-bug-report.sh` from the node.",
            "The XID is read from NVML events; the kernel log (`dmesg | grep -i xid`) on the "
            "node has the full message.",
        ),
    ),
    "KubeDeviceXidDriver": Runbook(
        "The driver or the GPU's firmware (GSP, micro-controllers) reported a fault. The GPU "
        "often stops taking work until it is reset.",
        (
            _WHO,
            "Check whether the workload on it still progresses; if not, cordon the node and "
            "reset the GPU as for KubeDeviceXidHardware.",
            "Repeated driver XIDs across nodes point at the driver version (`hw_info`'s driver "
            "label): compare with NVIDIA's release notes and upgrade.",
        ),
    ),
    "KubeDeviceXidApplication": Runbook(
        "A program on the GPU faulted: an illegal memory access, a killed or hung kernel. "
        "The GPU itself is fine. This is info, for the workload's owner.",
        (
            _WHO,
            "Tell the owner: the container's logs show the CUDA error; run with "
            "`CUDA_LAUNCH_BLOCKING=1` or compute-sanitizer to find the kernel.",
            "Only if one GPU reports these for many different workloads, treat it as "
            "KubeDeviceXidDriver.",
        ),
    ),
    "KubeDeviceXidError": Runbook(
        "The GPU reported an XID in none of the kit's classes:\n\n" + "XIDCLASSES",
        (
            "Look the code up in NVIDIA's XID catalog (docs.nvidia.com, *XID Errors*); it says "
            "whether it is hardware, driver or application, and the action.",
            "If it recurs, add it to a class in `monitoring/alerts.py` so it pages the right way.",
        ),
    ),
    "KubeDeviceUncorrectableEccErrors": Runbook(
        "The device's memory had errors ECC could not correct: data in it may be corrupt.",
        (
            _DRAIN,
            _WHO,
            _RESET,
            "Check `hw_gpu_memory_row_remap_*`: a pending remap is applied by the reset; a "
            "failed one means the GPU needs service.",
        ),
    ),
    "KubeDeviceRowRemapFailed": Runbook(
        "The GPU has no spare memory rows left to replace failing ones.",
        (_DRAIN, "Open a hardware ticket: the GPU needs replacing."),
    ),
    "KubeDeviceRowRemapPending": Runbook(
        "Failing memory rows were remapped; the remap takes effect at the next GPU reset.",
        ("Plan a reset when the GPU's workloads allow: " + _RESET,),
    ),
    "KubeDeviceThermalThrottling": Runbook(
        "The GPU's clocks are held down by temperature: work runs slower.",
        (
            "Compare `hw_temperature_celsius` with other GPUs in the node and the rack.",
            "Check fans, airflow and the data-centre cooling; a single hot GPU in a cool node "
            "points at its heat sink.",
        ),
    ),
    "KubeDevicePowerThrottling": Runbook(
        "The GPU has been at its software power limit for 30 minutes: normal for a busy "
        "GPU, a loss if the limit is set lower than the board's default.",
        (
            "Check the limit (`nvidia-smi -q -d POWER`) against the board's default.",
            "If it was lowered on purpose, silence this alert for the node.",
        ),
    ),
    "KubeDeviceHardwareSlowdown": Runbook(
        "A hardware signal cuts the GPU's clocks: the power brake (the system's power supply "
        "or BMC asks GPUs to draw less) or HW slowdown (board over temperature or power).",
        (
            "Check the node's power supplies and BMC event log.",
            "If every GPU in a node shows it, it is the node's power; if one, the board.",
        ),
    ),
    "KubeDeviceFailed": Runbook(
        "The device reports a failed state to its driver.",
        (_DRAIN, _WHO, _RESET, "If it stays failed, open a hardware ticket."),
    ),
    "KubeDeviceDegraded": Runbook(
        "The device has reported a degraded state for 15 minutes.",
        (
            "Look at the other alerts for the device (XIDs, ECC, throttling) for the cause.",
            "Plan a reset when its workloads allow.",
        ),
    ),
    "KubeDeviceLost": Runbook(
        "A device seen in the last hour is gone while the exporter and its sources run: it "
        "fell off the bus, was unbound from its driver, or was removed.",
        (
            "On the node: `lspci -d 10de:` (or the vendor's id) and `dmesg` for the device.",
            "A GPU that fell off the bus needs a node reboot and, if it recurs, service.",
        ),
    ),
    "KubeDeviceAllocatedIdle": Runbook(
        "A container holds a device it has not used for an hour: capacity others wait for.",
        (
            "Tell the owner (namespace and pod in the alert); for how long it has been idle: "
            f"{see(efficiency.TITLE, panel='Allocated but idle')}.",
            "Notebooks and stuck jobs are the usual cause; an idle-culling policy fixes them "
            "for good.",
        ),
    ),
    "KubeDeviceDraPodOnTaintedDevice": Runbook(
        "A DRA device carries a NoSchedule or NoExecute taint (its driver's, in the "
        "ResourceSlice, or a DeviceTaintRule) while a container still holds it (docs/dra.md). "
        "NoExecute evicts pods that do not tolerate it within about a second on Kubernetes "
        "1.36; a pod still there tolerates it, or the eviction failed.",
        (
            "The taint's key and value say why (NVIDIA and Intel drivers taint unhealthy "
            "devices; `hw_dra_device_taint` shows who set it: `slice` or the rule's name).",
            "`kubectl get resourceclaim -n NS` and the pod's events "
            "(`DeviceTaintManagerEviction`) show whether an eviction was tried.",
            "Move the workload (delete the pod) or, if the device is fine, remove the taint.",
        ),
    ),
    "KubeDeviceDraAllocationUnhealthy": Runbook(
        "The kubelet reports a claimed DRA device Unhealthy in the pod's "
        "`allocatedResourcesStatus` (KEP-4680): the DRA driver's health stream said so. The "
        "pod keeps running and stays Ready; nothing restarts it (docs/dra.md).",
        (
            "`kubectl get pod -n NS POD -o jsonpath='{.status.containerStatuses[*]."
            "allocatedResourcesStatus}'` shows the driver's message.",
            "Compare with the hardware series of the same `hw_id` (XIDs, ECC, `hw_status`).",
            "Restart the workload elsewhere; have the device checked or reset.",
        ),
    ),
    "KubeDeviceDraDeviceNotReady": Runbook(
        "A DRA driver wrote a condition False for a device of a running pod's claim "
        "(`status.devices[].conditions`, KEP-4817; DRANET writes `Ready` and `NetworkReady` "
        "once it has moved the NIC into the pod and configured it). The pod was started all "
        "the same: nothing in Kubernetes acts on these conditions (docs/dra.md).",
        (
            "`kubectl get resourceclaim -n NS CLAIM -o jsonpath='{.status.devices}'` shows the "
            "driver's conditions, message and network data.",
            "The driver's logs on the node say why (for DRANET: its `RunPodSandbox` hook).",
            "Recreate the pod once the driver is fixed; the claim's status is rewritten on "
            "the next prepare.",
        ),
    ),
    "KubeDeviceDraTaintedButHealthy": Runbook(
        "A DRA device has been tainted NoSchedule/NoExecute for 30 minutes while the exporter "
        "reads its hardware as ok: capacity held back, perhaps by a taint nobody removed.",
        (
            "Find the taint's source (`hw_dra_taint_source`: `slice` is the driver's; "
            "otherwise the DeviceTaintRule's name: `kubectl get devicetaintrule NAME`).",
            "If the reason is gone, delete the rule; a driver's own taint clears when its "
            "health check passes again (restart the driver's kubelet plugin if it does not).",
        ),
    ),
    "KubeDeviceDraFailedNotTainted": Runbook(
        "The exporter reads a device as failed, yet its DRA driver offers it in a "
        "ResourceSlice without a NoSchedule/NoExecute taint: the scheduler can hand it to new "
        "claims.",
        (
            "Taint it: a DeviceTaintRule selecting driver, pool and device with effect "
            "NoSchedule (or NoExecute to move its pods), where the cluster serves "
            "resource.k8s.io/v1beta2 DeviceTaintRules.",
            "Check why the driver did not: its health checks, its version (NVIDIA's taints "
            "unhealthy GPUs).",
        ),
    ),
    "KubeDeviceUsedWithoutRequest": Runbook(
        "A container runs processes on a device the kubelet did not allocate to it "
        "(docs/attribution.md): usually an image or pod that sets `NVIDIA_VISIBLE_DEVICES=all`"
        " (or mounts `/dev/dri`, or runs privileged) and so bypasses the device plugin. It "
        "competes with the pods that hold the device, unseen by the scheduler and quotas.",
        (
            "Find the pod (namespace and pod in the alert) and its owner; `kubectl get pod "
            "-o yaml` shows the environment, privileged flag and host-path mounts.",
            "What it uses on the device (memory and utilization per container), next to the "
            f"pods that hold it: {see(workloads.TITLE, panel='Used without a request')}.",
            "Stop it for good on NVIDIA nodes: the container toolkit's "
            "`accept-nvidia-visible-devices-envvar-when-unprivileged = false` with the device "
            "plugin's `deviceListStrategy: volume-mounts` (GPU Operator defaults on recent "
            "releases); elsewhere, an admission policy against privileged pods and `/dev` "
            "host paths.",
        ),
    ),
    "KubeDeviceExporterDown": Runbook(
        "Prometheus cannot scrape one exporter pod: that node's device metrics are missing.",
        (
            f"`{LOGS} -c exporter` (pick the pod on the node) for why it fails.",
            "Check the port (9405), NetworkPolicies between Prometheus and the pod, and with "
            "TLS on, the monitors' `scheme: https` and CA.",
        ),
    ),
    "KubeDeviceExporterAbsent": Runbook(
        'Prometheus has no target with `job="kube-device-exporter"`.',
        (
            "`kubectl -n kube-device-exporter get ds,pods` shows whether the DaemonSet runs.",
            "Check that Prometheus selects the ServiceMonitor/PodMonitor (kube-prometheus-stack "
            "selects by its `release` label: docs/deploy.md) and that the job label is kept.",
        ),
    ),
    "KubeDeviceExporterKubeletUnreachable": Runbook(
        "The exporter cannot call the kubelet's PodResources API: devices lose their pods.",
        (
            f"`{EXEC} kube-device-exporter podresources` prints what the kubelet answers.",
            "A kubelet root directory other than /var/lib/kubelet needs an overlay "
            "(docs/deploy.md, kubelet root directories); SELinux needs type spc_t.",
        ),
    ),
    "KubeDeviceExporterKubernetesApiUnavailable": Runbook(
        "With `--kubernetes.api`, the exporter's pod watch has failed for 15 minutes: pod "
        "UIDs, workloads and labels (`k8s_pod_workload_info`) are missing on that node; device "
        "metrics and pod names from the kubelet are not affected.",
        (
            f"`{LOGS}` says once why: `403` means the ServiceAccount lacks the RBAC of "
            "deploy/components/kubernetes-api (or the chart's `kubernetesApi.enabled`), `401` a "
            "token that is not mounted or not accepted, a connection error a NetworkPolicy "
            "between the pod and the API server.",
            "`kube_device_exporter_kubernetes_requests_total` by `code` shows what the API "
            "server answers (docs/kubernetes-api.md).",
        ),
    ),
    "KubeDeviceExporterSourceFailing": Runbook(
        "One collector (source) has failed for 10 minutes: its devices are missing.",
        (
            f"`{LOGS}` names the source and the error.",
            "For nvml: the driver may be wedged (`nvidia-smi` on the node hangs or errors).",
        ),
    ),
    "KubeDeviceExporterCycleStalled": Runbook(
        "The exporter answers, but its collection has not finished for 5 minutes: /metrics "
        "serves old values. A hung driver call is the usual cause.",
        (
            f"`{LOGS}` shows which source times out.",
            "Restart the pod; if it stalls again, check the driver on the node.",
        ),
    ),
    "KubeDeviceNotAllocatable": Runbook(
        "The device plugin reported the device unhealthy to the kubelet (ListAndWatch), so "
        "the kubelet dropped it from the devices it can allocate (GetAllocatableResources "
        "answers only healthy devices). The exporter still sees it. The node has lost that "
        "capacity; a pod holding it keeps running on it: the kubelet does not fail it (with "
        "the ResourceHealthStatus gate it only reports the device's health in the pod's "
        "status, `allocatedResourcesStatus`). The NVIDIA plugin does this after XIDs "
        "other than application ones (48 double-bit ECC, 79 fallen off the bus...).",
        (
            _WHO,
            f"Look at the device's XIDs and status ({see(devices.TITLE, row='Errors')}), and at "
            "the plugin's log (`kubectl -n <plugin namespace> logs "
            "<device plugin pod on the node>`) for the reason it gave.",
            _DRAIN,
            _RESET,
            "A plugin that stops or restarts (an upgrade) does not fire this alert: the "
            "kubelet then drops all of the plugin's devices at once, which the exporter reads "
            "as the plugin gone: the resource's `hw_device_allocatable` series end and "
            "`hw_allocation_resource_registered` reads 0, which fires "
            "KubeDevicePluginNotRegistered when the plugin stays away for 5 minutes "
            "(docs/podresources.md). A resource of a single device that turns unhealthy "
            "looks the same: it fires KubeDevicePluginNotRegistered, not this alert.",
        ),
    ),
    "KubeDevicePluginNotRegistered": Runbook(
        "The kubelet lists no allocatable device of the resource although it did before "
        "(this exporter process saw it) or a container holds one: the device plugin is not "
        "registered with the kubelet. It crashed, was deleted or is stuck in an upgrade, or "
        "did not register again after a kubelet restart (a plugin must watch for the "
        "kubelet's new socket). The kubelet drops all of a plugin's devices at once then "
        "(docs/podresources.md, behaviour 10): no new pod can get them on this node, while "
        "pods that hold them keep running. A resource of a single device that its plugin "
        "marks unhealthy reads the same.",
        (
            "`kubectl -n <plugin namespace> get pods -o wide --field-selector "
            "spec.nodeName=<node>`: is the plugin's pod running on the node, and restarting?",
            "The plugin's log (`kubectl -n <plugin namespace> logs <device plugin pod on the "
            "node>`) says whether it registered (`Registered device plugin` for the NVIDIA "
            "plugin) or why not; the kubelet's log on the node says whether it accepted it.",
            "Restart the plugin's pod; if it registers again, the series reads 1 within one "
            "allocatable interval (5 s). A one-device resource whose device is unhealthy: "
            "see KubeDeviceNotAllocatable's steps.",
            "A plugin removed from the node on purpose: the exporter remembers the resource "
            "for as long as it runs; restart its pod on the node once no container holds "
            "the resource's devices any more.",
        ),
    ),
    "KubeDeviceContainerNumaMisaligned": Runbook(
        "The container's devices sit on NUMA nodes other than its exclusive CPUs or its "
        "pinned memory (docs/podresources.md says exactly what aligned means): copies "
        "between host memory and the device, and the CPU threads feeding it, cross the "
        "socket interconnect. The kubelet placed it so because the node's Topology Manager "
        "policy is `none` or `best-effort`, or the aligned node had no room.",
        (
            'See where each part sits: `hw_container_numa_node{k8s_pod_name="POD"}` '
            f"({see(workloads.TITLE, row='NUMA placement')}).",
            "For a node that must align, set the kubelet's `topologyManagerPolicy: "
            "single-numa-node` (or `restricted`) with `cpuManagerPolicy: static`; a pod that "
            "cannot be aligned is then rejected with TopologyAffinityError instead of running "
            "slowly.",
            "Re-create the pod (delete it; its controller makes a new one) when the node has "
            "room on the devices' node.",
        ),
    ),
    "KubeDeviceGpuNicCrossesCpuInterconnect": Runbook(
        "One of the container's GPUs has its nearest NIC on the other CPU socket "
        "(docs/placement.md says how the level is read from the PCIe tree): RDMA traffic "
        "between that GPU and the network crosses the CPU interconnect, or NCCL falls back "
        "to staging through host memory. The device plugins handed out GPUs and NICs "
        "independently: nothing in the default kubelet aligns a NIC with a GPU.",
        (
            'See every pair: `hw_container_pcie_placement{k8s_pod_name="POD"}` (the '
            "`hw_pcie_placement` label is nvidia-smi's PIX/PXB/PHB/NODE/SYS).",
            "Align them at admission: the Topology Manager with `single-numa-node` (or "
            "`restricted`) aligns devices whose plugins report NUMA topology; a DRA driver "
            "that publishes PCIe root attributes lets a claim ask for a GPU and a NIC under "
            "one root (`matchAttribute`).",
            "Re-create the pod when GPUs and NICs of one socket are free.",
        ),
    ),
    "KubeDeviceExporterDaemonSetUnavailable": Runbook(
        "Exporter pods are Pending, crash-looping or not ready. Behind a ServiceMonitor a pod "
        "that is not ready drops out of the endpoints, so no `up == 0` shows it: this alert, "
        "on kube-state-metrics' series, does.",
        (
            "`kubectl -n kube-device-exporter get pods -o wide` and `describe pod` for the reason.",
            "Pending: a missing RuntimeClass (`nvidia` without the GPU Operator), or on GKE "
            "the ResourceQuota for the priority class (docs/deploy.md, GKE).",
            f"CrashLoopBackOff: `{LOGS} --previous`.",
        ),
    ),
    "KubeDeviceExporterNodeNotSelected": Runbook(
        "A node advertises devices but the DaemonSet has no pod there: its required node "
        "affinity selects nodes by device labels (GPU feature discovery, Node Feature "
        "Discovery, the vendor operators, the managed clouds' GPU labels) and this node has "
        "none of them. The DaemonSet does not count such a node, so `kubectl get ds` shows "
        "DESIRED without it and no event is written.",
        (
            "`kubectl get node NODE --show-labels` lists what the node carries; docs/deploy.md "
            "(Node selection) lists what the DaemonSet selects.",
            "Label it: `kubectl label node NODE kube-device-exporter.io/enabled=true`, or deploy "
            "GPU feature discovery or NFD, which label every device node.",
            "Chart: `affinity` replaces the selection; `nodeSelector` adds to it.",
        ),
    ),
    "KubeDeviceExporterDevicesUnseen": Runbook(
        "The kubelet lists devices as allocatable for a resource (e.g. nvidia.com/gpu) that "
        "no source of the exporter can see: the pod has no NVML, so those devices have no "
        "metrics.",
        (
            "GPU Operator with CDI: the pod needs `runtimeClassName: nvidia` (overlay "
            "`gpu-operator`, or the chart's `runtimeClassName`).",
            "GKE: use the `gke` overlay or the chart's `gke.enabled`; the driver lives under "
            "/home/kubernetes/bin/nvidia on the host.",
            "Toolkit as default runtime: the driver is not mounted when "
            "`NVIDIA_VISIBLE_DEVICES` is missing from the pod.",
            f"Check: `{EXEC} kube-device-exporter podresources` lists what the kubelet "
            f"advertises; `{LOGS}` says why NVML did not load.",
        ),
    ),
}


INTRO = """\
# Runbooks

What to do when a kube-device-exporter alert fires. Each alert's `runbook_url` annotation
points at its section here. Generated by `python -m monitoring` from
`monitoring/runbooks.py`; the rules themselves are in [alerts.md](alerts.md).
"""


def runbooks_md() -> str:
    names = [a.name for rules in alerts.GROUPS.values() for a in rules]
    missing = set(names) - set(RUNBOOKS)
    extra = set(RUNBOOKS) - set(names)
    if missing or extra:
        raise ValueError(f"runbooks without alerts: {extra}; alerts without runbooks: {missing}")
    by_name = {a.name: a for rules in alerts.GROUPS.values() for a in rules}
    out = [INTRO]
    for name in names:
        book = RUNBOOKS[name]
        meaning = book.meaning.replace("XIDCLASSES", _xid_table())
        out.append(f"\n## {name}\n\n*Severity {by_name[name].severity}.* {meaning}\n\n")
        out.append("".join(f"{i}. {step}\n" for i, step in enumerate(book.actions, 1)))
    out.append("\n## XID classes\n\n" + _xid_table())
    return "".join(out)
