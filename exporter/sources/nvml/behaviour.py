"""What the NVML source relies on, each with the `nvml.h` passage that says so.

This is the one place where a driver behaviour becomes a rule of the source.
`tests/test_nvml_behaviour.py` checks that every `header` quote is in the real `nvml.h`
(PyPI `nvidia-nvml-dev`). The simulated library follows these rows and nothing kinder; what
it does for each row is written beside it (simulator/nvml_stand_in.py), and docs/nvml.md
shows both, with what was measured on a real driver.
"""

from __future__ import annotations

from dataclasses import dataclass

import pynvml


@dataclass(frozen=True, slots=True)
class Behaviour:
    key: str
    functions: tuple[str, ...]
    header: str
    """Verbatim from nvml.h (whitespace aside)."""
    rule: str
    """What the source does about it."""


TABLE: tuple[Behaviour, ...] = (
    Behaviour(
        "init-driver-not-loaded",
        ("nvmlInit_v2", "nvmlInitWithFlags"),
        "NVML_ERROR_DRIVER_NOT_LOADED   if the NVIDIA driver is not running.",
        "Before NVML has ever worked in this process: no NVIDIA hardware here, success with "
        "zero devices (said once, at info). After it has worked: a failure, retried every "
        "cycle; past `restart-after`, /healthz fails so the kubelet restarts the container.",
    ),
    Behaviour(
        "library-not-found",
        ("nvmlInit_v2",),
        "NVML_ERROR_LIBRARY_NOT_FOUND = 12,         //!< NVML Shared Library couldn't be "
        "found or loaded",
        "No libnvidia-ml.so.1 in the container (no GPU, or no runtime class / driver mounts): "
        "success with zero devices, said once; `kube_device_exporter_devices_unseen` is what "
        "makes a GPU node without NVML loud.",
    ),
    Behaviour(
        "init-no-permission",
        ("nvmlInit_v2",),
        "NVML_ERROR_NO_PERMISSION       if the NVML Library does not have permission to talk "
        "to the driver.",
        "The hardware is there and cannot be read: a failure every cycle, never 'absent'.",
    ),
    Behaviour(
        "rm-version-mismatch",
        ("nvmlInit_v2",),
        "NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,   //!< RM detects a driver/library version "
        "mismatch",
        "The library this process mapped is older or newer than the kernel module (a driver "
        "upgrade under a running pod): a failure that only a new process fixes, so /healthz "
        "fails after `restart-after`.",
    ),
    Behaviour(
        "count-is-all-devices",
        ("nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2"),
        "returns count of all devices in the system even if nvmlDeviceGetHandleByIndex_v2 "
        "returns NVML_ERROR_NO_PERMISSION for such device.",
        "A GPU whose handle answers NO_PERMISSION (not mounted into this container) is skipped "
        "and named once at info; it is not an error.",
    ),
    Behaviour(
        "index-order",
        ("nvmlDeviceGetHandleByIndex_v2",),
        "The order in which NVML enumerates devices has no guarantees of consistency between "
        "reboots.",
        "Devices are identified by UUID; the index is an attribute, never a key.",
    ),
    Behaviour(
        "enumerated-at-init",
        ("nvmlDeviceGetCount_v2", "nvmlInit_v2"),
        "This will initialize the NVML Library state without enumerating any discovered devices.",
        "Rediscovery never waits for the count to change: it runs on a timer, after "
        "GPU_IS_LOST, NOT_FOUND or INVALID_ARGUMENT on a known handle, when a GPU's MIG "
        "mode reads differently, and when a MIG slot empty at discovery holds a device (a "
        "DRA driver makes one at prepare). A new GPU is found by the next rediscovery.",
    ),
    Behaviour(
        "gpu-is-lost",
        ("*",),
        "NVML_ERROR_GPU_IS_LOST = 15,               //!< The GPU has fallen off the bus or has "
        "otherwise become inaccessible",
        "That GPU (and its MIG slices) report `hw.status{hw.state=failed}` and nothing else; "
        "a GPU seen once stays listed as failed for `lost-retention`, across rediscovery and "
        "driver reloads, so its alert does not resolve by itself.",
    ),
    Behaviour(
        "mig-handle-invalid",
        ("nvmlDeviceGetMigDeviceHandleByIndex",),
        "the MIG device handle would remain invalid and must be requested again using this "
        "API. Handles may be reused and their properties can change in the process.",
        "A MIG handle that answers INVALID_ARGUMENT or NOT_FOUND triggers a rediscovery in the "
        "next cycle; the MIG layout is read again through these handles (unprivileged).",
    ),
    Behaviour(
        "mig-slot-empty",
        ("nvmlDeviceGetMigDeviceHandleByIndex",),
        "NVML_ERROR_NOT_FOUND         if no valid MIG device was found at \\a index",
        "An empty slot is not an error.",
    ),
    Behaviour(
        "gpu-instances-privileged",
        ("nvmlDeviceGetGpuInstances",),
        "Get GPU instances for given profile ID.  For Ampere &tm; or newer fully supported "
        "devices. Supported on Linux only. Requires privileged user.",
        "Never called: the DaemonSet drops capabilities. MIG slices are found through MIG "
        "device handles, which need no privilege.",
    ),
    Behaviour(
        "gpu-instance-by-id-privileged",
        ("nvmlDeviceGetGpuInstanceById", "nvmlGpuInstanceGetInfo"),
        "Get GPU instances for given instance ID.  For Ampere &tm; or newer fully supported "
        "devices. Supported on Linux only. Requires privileged user.",
        "Called for each MIG device at discovery, for its GPU instance's profile ID and "
        "placement: what a DRA driver's partition names (docs/dra.md). NO_PERMISSION: said "
        "once, not an error; partitions made at prepare then stay unidentified (counted in "
        "`kube_device_exporter_dra_unidentified`).",
    ),
    Behaviour(
        "mig-aggregate-processes",
        ("nvmlDeviceGetComputeRunningProcesses_v3",),
        "In MIG mode, if device handle is provided, the API returns aggregate information, "
        "only if the caller has appropriate privileges. Per-instance information can be "
        "queried by using specific MIG device handles.",
        "In MIG mode processes are read per MIG handle. NO_PERMISSION from any call means "
        "that data is not available to this pod: no series, said once, not a field error.",
    ),
    Behaviour(
        "process-utilization-samples",
        ("nvmlDeviceGetProcessUtilization",),
        "If no valid sample entries are found since the lastSeenTimeStamp, "
        "NVML_ERROR_NOT_FOUND is returned.",
        "All samples since the last cycle are read; a process's utilization is the mean of its "
        "samples; when there are samples, a running process without one was idle (0); "
        "NOT_FOUND (no period ended, or all idle: the driver cannot tell) reports nothing "
        "and is not an error.",
    ),
    Behaviour(
        "process-utilization-mig",
        ("nvmlDeviceGetProcessUtilization",),
        "On MIG-enabled GPUs, querying process utilization is not currently supported.",
        "Never asked for under MIG: per-process utilization of MIG slices is not exported.",
    ),
    Behaviour(
        "events-mig-unprivileged",
        ("nvmlEventSetWait_v2",),
        "In absence of required privileges, only the events which affect all the instances "
        "(i.e. whole device) are reported.",
        "Unprivileged on a MIG GPU, XIDs of one slice are not seen; whole-GPU XIDs are counted "
        "on the GPU (documented in docs/metrics.md).",
    ),
    Behaviour(
        "events-ready-at-once",
        ("nvmlEventSetWait_v2",),
        "If some events are ready to be delivered at the time of the call, function returns "
        "immediately.",
        "XID events are taken once a cycle, by waits with a zero timeout until one times out: "
        "no thread blocks in the wait, and what arrives between cycles waits in the set.",
    ),
    Behaviour(
        "events-from-registration",
        ("nvmlDeviceRegisterEvents",),
        "All events that occurred before this call are not recorded.",
        "The event set is kept across rediscoveries while the GPU handles are the same.",
    ),
    Behaviour(
        "not-supported",
        ("*",),
        "NVML_ERROR_NOT_SUPPORTED = 3,              //!< The requested operation is not "
        "available on target device",
        "No series (never 0), not an error.",
    ),
    Behaviour(
        "function-not-found",
        ("*",),
        "NVML_ERROR_FUNCTION_NOT_FOUND = 13,        //!< Local version of NVML doesn't "
        "implement this function",
        "An older driver: the older function is used, this one is not called again.",
    ),
    Behaviour(
        "uninitialized",
        ("*",),
        "NVML_ERROR_UNINITIALIZED = 1,              //!< NVML was not first initialized with "
        "nvmlInit()",
        "The driver went away under us: nvmlShutdown, then nvmlInit again next cycle.",
    ),
)

BY_KEY = {b.key: b for b in TABLE}

# The codes, grouped by what the source does with them (rows above say why).
REINIT = frozenset(
    {
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    }
)
ABSENT_AT_INIT = frozenset(
    {pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED}
)
MISSING = frozenset(
    {
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,  # the function, but not this struct version
    }
)
NOT_HERE = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, *MISSING})
STALE_HANDLE = frozenset({pynvml.NVML_ERROR_INVALID_ARGUMENT, pynvml.NVML_ERROR_NOT_FOUND})
