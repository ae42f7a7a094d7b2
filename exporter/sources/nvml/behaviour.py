"""What the NVML source relies on, each with the `nvml.h` passage that says so.

This is the one place where a driver behaviour becomes a rule of the source. The
stand-in library (exporter/simulate/fakenvml) follows these rows and nothing kinder:
`tests/test_nvml_behaviour.py` checks that every `header` quote is in the real `nvml.h`
(PyPI `nvidia-nvml-dev`) and that the stand-in behaves as `stand_in` says.
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
    stand_in: str
    """What the simulated library does, so tests see what a driver would do."""


TABLE: tuple[Behaviour, ...] = (
    Behaviour(
        "init-driver-not-loaded",
        ("nvmlInit_v2", "nvmlInitWithFlags"),
        "NVML_ERROR_DRIVER_NOT_LOADED   if the NVIDIA driver is not running.",
        "Before NVML has ever worked in this process: no NVIDIA hardware here, success with "
        "zero devices (said once, at info). After it has worked: a failure, retried every "
        "cycle; past `restart-after`, /healthz fails so the kubelet restarts the container.",
        "No state file, or `loaded 0`: nvmlInit answers DRIVER_NOT_LOADED.",
    ),
    Behaviour(
        "library-not-found",
        ("nvmlInit_v2",),
        "NVML_ERROR_LIBRARY_NOT_FOUND = 12,         //!< NVML Shared Library couldn't be "
        "found or loaded",
        "No libnvidia-ml.so.1 in the container (no GPU, or no runtime class / driver mounts): "
        "success with zero devices, said once; `kube_device_exporter_devices_unseen` is what "
        "makes a GPU node without NVML loud.",
        "Raised by nvidia-ml-py itself when dlopen fails; the stand-in is simply not on the path.",
    ),
    Behaviour(
        "init-no-permission",
        ("nvmlInit_v2",),
        "NVML_ERROR_NO_PERMISSION       if the NVML Library does not have permission to talk "
        "to the driver.",
        "The hardware is there and cannot be read: a failure every cycle, never 'absent'.",
        "`init_error 4` makes nvmlInit answer NO_PERMISSION.",
    ),
    Behaviour(
        "rm-version-mismatch",
        ("nvmlInit_v2",),
        "NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,   //!< RM detects a driver/library version "
        "mismatch",
        "The library this process mapped is older or newer than the kernel module (a driver "
        "upgrade under a running pod): a failure that only a new process fixes, so /healthz "
        "fails after `restart-after`.",
        "The library remembers the driver version of its first successful init; a state file "
        "with another `driver` makes nvmlInit and every call answer LIB_RM_VERSION_MISMATCH.",
    ),
    Behaviour(
        "count-is-all-devices",
        ("nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2"),
        "returns count of all devices in the system even if nvmlDeviceGetHandleByIndex_v2 "
        "returns NVML_ERROR_NO_PERMISSION for such device.",
        "A GPU whose handle answers NO_PERMISSION (not mounted into this container) is skipped "
        "and named once at info; it is not an error.",
        "A GPU with `no_access` is counted but its handle answers NO_PERMISSION.",
    ),
    Behaviour(
        "index-order",
        ("nvmlDeviceGetHandleByIndex_v2",),
        "The order in which NVML enumerates devices has no guarantees of consistency between "
        "reboots.",
        "Devices are identified by UUID; the index is an attribute, never a key.",
        "Indices follow the scenario's list.",
    ),
    Behaviour(
        "enumerated-at-init",
        ("nvmlDeviceGetCount_v2", "nvmlInit_v2"),
        "This will initialize the NVML Library state without enumerating any discovered devices.",
        "Rediscovery never waits for the count to change: it runs on a timer, after "
        "GPU_IS_LOST, NOT_FOUND or INVALID_ARGUMENT on a known handle, and when a GPU's MIG "
        "mode reads differently. A new GPU is found by the next rediscovery.",
        "The count is taken when the library initializes (refcount 0 -> 1) and stays until "
        "the last nvmlShutdown: a GPU added to the state file later is not counted.",
    ),
    Behaviour(
        "gpu-is-lost",
        ("*",),
        "NVML_ERROR_GPU_IS_LOST = 15,               //!< The GPU has fallen off the bus or has "
        "otherwise become inaccessible",
        "That GPU (and its MIG slices) report `hw.status{hw.state=failed}` and nothing else; "
        "a GPU seen once stays listed as failed for `lost-retention`, across rediscovery and "
        "driver reloads, so its alert does not resolve by itself.",
        "`lost` on a GPU makes every call on it answer GPU_IS_LOST.",
    ),
    Behaviour(
        "mig-handle-invalid",
        ("nvmlDeviceGetMigDeviceHandleByIndex",),
        "the MIG device handle would remain invalid and must be requested again using this "
        "API. Handles may be reused and their properties can change in the process.",
        "A MIG handle that answers INVALID_ARGUMENT or NOT_FOUND triggers a rediscovery in the "
        "next cycle; the MIG layout is read again through these handles (unprivileged).",
        "A MIG handle names one slice; after the slot is reconfigured it answers INVALID_ARGUMENT.",
    ),
    Behaviour(
        "mig-slot-empty",
        ("nvmlDeviceGetMigDeviceHandleByIndex",),
        "NVML_ERROR_NOT_FOUND         if no valid MIG device was found at \\a index",
        "An empty slot is not an error.",
        "Slots without a MIG device answer NOT_FOUND.",
    ),
    Behaviour(
        "gpu-instances-privileged",
        ("nvmlDeviceGetGpuInstances",),
        "Get GPU instances for given profile ID.  For Ampere &tm; or newer fully supported "
        "devices. Supported on Linux only. Requires privileged user.",
        "Never called: the DaemonSet drops capabilities. MIG slices are found through MIG "
        "device handles, which need no privilege.",
        "Not implemented (a call would fail as a missing symbol).",
    ),
    Behaviour(
        "mig-aggregate-processes",
        ("nvmlDeviceGetComputeRunningProcesses_v3",),
        "In MIG mode, if device handle is provided, the API returns aggregate information, "
        "only if the caller has appropriate privileges. Per-instance information can be "
        "queried by using specific MIG device handles.",
        "In MIG mode processes are read per MIG handle. NO_PERMISSION from any call means "
        "that data is not available to this pod: no series, said once, not a field error.",
        "Unprivileged (`privileged 0`): a parent GPU handle in MIG mode answers NO_PERMISSION.",
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
        "As measured on an H100 (580.159.04): one sample per busy process, the newest, "
        "whatever lastSeenTimeStamp; NOT_FOUND when none is newer. The source averages "
        "per PID all the same, should a driver return several.",
    ),
    Behaviour(
        "process-utilization-mig",
        ("nvmlDeviceGetProcessUtilization",),
        "On MIG-enabled GPUs, querying process utilization is not currently supported.",
        "Never asked for under MIG: per-process utilization of MIG slices is not exported.",
        "A GPU in MIG mode answers NOT_SUPPORTED.",
    ),
    Behaviour(
        "events-mig-unprivileged",
        ("nvmlEventSetWait_v2",),
        "In absence of required privileges, only the events which affect all the instances "
        "(i.e. whole device) are reported.",
        "Unprivileged on a MIG GPU, XIDs of one slice are not seen; whole-GPU XIDs are counted "
        "on the GPU (documented in docs/metrics.md).",
        "Unprivileged: events of one GPU/compute instance are not delivered.",
    ),
    Behaviour(
        "events-from-registration",
        ("nvmlDeviceRegisterEvents",),
        "All events that occurred before this call are not recorded.",
        "The event set is kept across rediscoveries while the GPU handles are the same.",
        "A new event set starts after the newest event in the state file.",
    ),
    Behaviour(
        "not-supported",
        ("*",),
        "NVML_ERROR_NOT_SUPPORTED = 3,              //!< The requested operation is not "
        "available on target device",
        "No series (never 0), not an error.",
        "A key missing from a device block answers NOT_SUPPORTED.",
    ),
    Behaviour(
        "function-not-found",
        ("*",),
        "NVML_ERROR_FUNCTION_NOT_FOUND = 13,        //!< Local version of NVML doesn't "
        "implement this function",
        "An older driver: the older function is used, this one is not called again.",
        "`missing <function>` answers FUNCTION_NOT_FOUND.",
    ),
    Behaviour(
        "uninitialized",
        ("*",),
        "NVML_ERROR_UNINITIALIZED = 1,              //!< NVML was not first initialized with "
        "nvmlInit()",
        "The driver went away under us: nvmlShutdown, then nvmlInit again next cycle.",
        "While the driver is unloaded, or after a reload, old handles answer UNINITIALIZED.",
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


# Real-driver figures, quoted from docs/measured.json (`make docs` renders the current ones).
_ENERGY = "<!-- measured:real_gpu.energy_field_call -->3.1 ms<!-- /measured -->"
_CORE_SHARE = "<!-- measured:real_gpu.core_share_1s -->0.90 %<!-- /measured -->"
_RSS = "<!-- measured:real_gpu.rss_1s -->74 MiB<!-- /measured -->"
_SIGTERM = "<!-- measured:real_gpu.sigterm_exit -->0.32 s<!-- /measured -->"

MEASURED = f"""\
## Measured on a real driver

`python -m bench.nvml_probe --load 16` and `bench/real_gpu.sh` on one H100 80GB HBM3
(driver 580.159.04, CUDA 13.0), 2026-11-23:

| call | cost per call |
|---|---|
| `nvmlDeviceGetFieldValues`, the 17 fields of one GPU | 3.2-4.0 ms |
| of which `NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION` alone | {_ENERGY} |
| `NVML_FI_DEV_PCIE_REPLAY_COUNTER` / `PCIE_COUNT_TX/RX_BYTES` | 0.35 / 0.15 / 0.15 ms |
| every other field, utilization, memory, power, clocks, temperature | 1-14 us |
| `nvmlDeviceGetProcessUtilization` (with or without processes) | 1.9-2.6 ms |
| `nvmlDeviceGetMigMode` | 0.16 ms |
| `nvmlGpmSampleGet` (MIG off: GPM works on the whole GPU too) | 0.04 ms |
| `nvmlGpmMetricsGet`, 5 metrics between two samples | 1.5 ms |

So the costly values are read every `--collector.nvml.slow-interval` (10s) and held in
between: one NVML collect went from 4.5 ms to 0.18 ms (median of 20, the real-driver test),
and the whole exporter at a 1 s interval used
{_CORE_SHARE} of one core
(60 s, RSS {_RSS}, no kubelet); SIGTERM ended it
in {_SIGTERM} (the figures: docs/measured.json).

From a process in its own PID namespace (a pod without `hostPID`; `bench/pidns_probe.sh`,
`unshare --pid --fork --mount-proc`): `nvmlDeviceGetComputeRunningProcesses` lists **no**
process of the host's namespace (the driver hides PIDs the caller cannot see), while
`nvmlDeviceGetProcessUtilization` still returns the host's PID (416 for a load the host
saw as 416). So per-process GPU memory needs `hostPID`; per-process utilization comes with
host PIDs, which only the host's `/proc` (`--path.procfs`) can resolve to containers.
`nvml.h` says nothing of PID namespaces, so this is a measured row, not a quoted one:

- **Source**: the process lists give memory per PID; the utilization samples (whole GPUs,
  every `slow-interval`) give utilization per host PID, also for PIDs the lists do not
  show, whose memory is then unknown (no series), never 0. Under MIG neither memory
  (lists empty) nor utilization (not supported) is seen without `hostPID`.
- **Stand-in**: `nvidia.pid_namespace: own` (the default, as the DaemonSet ships) makes
  `nvmlDeviceGetComputeRunningProcesses_v3` and `..GraphicsRunningProcesses_v3` list
  nothing while `nvmlDeviceGetProcessUtilization` keeps host PIDs; `host` (a `hostPID`
  pod) lists every process.

Per-process utilization under a CUDA load: one sample per busy process per call, the newest,
whether `lastSeenTimeStamp` is 0 or a second old; `NOT_FOUND` with no process. An index past
the count answers `INVALID_ARGUMENT`; `nvmlDeviceGetMigDeviceHandleByIndex` on a GPU with MIG
off answers `NOT_FOUND`.
"""


def markdown() -> str:
    """docs/nvml.md: the table above, for people."""
    out = [
        "# What the NVML source relies on\n\n",
        "Generated from `exporter/sources/nvml/behaviour.py` by `make docs`; each row quotes\n",
        "`nvml.h` (PyPI `nvidia-nvml-dev`), says what the source does about it and what the\n",
        "simulated library does (tests/test_nvml_behaviour.py checks both).\n\n",
    ]
    for row in TABLE:
        out.append(f"## `{row.key}`\n\n")
        out.append(f"Functions: {', '.join(f'`{f}`' for f in row.functions)}\n\n")
        out.append(f"> {row.header}\n\n")
        out.append(f"- **Source**: {row.rule}\n- **Stand-in**: {row.stand_in}\n\n")
    out.append(MEASURED)
    return "".join(out)
