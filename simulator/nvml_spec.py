"""The `nvidia:` scenario section as frozen specs: GPUs, MIG slices, processes, XIDs, faults.

What `nvml_scenario.parse_nvidia` produces and `nvml_state.render` reads; the names the
section may use for features and throttle reasons, and the fault kinds.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from simulator.signals import Signal

MIB = 1024**2
GIB = 1024**3
NO_ID = 0xFFFFFFFF

FEATURES: dict[str, tuple[str, ...]] = {
    "utilization": ("util_gpu", "util_memory"),
    "encoder_utilization": ("util_encoder",),
    "decoder_utilization": ("util_decoder",),
    "memory": ("memory_total", "memory_reserved", "memory_used"),
    "power": ("power_mw",),
    "power_limit": ("power_limit_mw",),
    "energy": ("energy_mj",),
    "temperature": ("temp_gpu",),
    "memory_temperature": ("temp_memory",),
    "clocks": ("clock_graphics", "clock_sm", "clock_memory", "clock_video"),
    "throttle_reasons": ("throttle",),
    "pcie": ("pcie_tx_bytes", "pcie_rx_bytes", "pcie_tx_rate", "pcie_rx_rate"),
    "pcie_replay": ("pcie_replay",),
    "ecc": ("ecc_corrected", "ecc_uncorrected"),
    "remapped_rows": ("remapped_cor", "remapped_unc", "remapped_pending", "remapped_failure"),
    "nvlink": (
        "nvlink_links",
        "nvlink_tx_kib",
        "nvlink_rx_kib",
        "nvlink_crc_data",
        "nvlink_crc_flit",
        "nvlink_replay",
        "nvlink_recovery",
    ),
    "processes": ("processes",),
    "process_utilization": ("process_utilization",),
    "gpm": (
        "gpm",
        "gpm_busy_s",
        "gpm_sm_s",
        "gpm_occupancy_s",
        "gpm_tensor_s",
        "gpm_fp64_s",
        "gpm_fp32_s",
        "gpm_fp16_s",
        "gpm_dram_s",
        "gpm_pcie_tx_bytes",
        "gpm_pcie_rx_bytes",
        "gpm_nvlink_tx_bytes",
        "gpm_nvlink_rx_bytes",
    ),
    "serial": ("serial",),
}
"""Names usable in `unsupported:` and `not_supported` faults -> the state keys they hide
(a hidden key is NVML_ERROR_NOT_SUPPORTED for every call and field that reads it)."""

GPM_SHARES = {
    "gpm_sm_s": 0.85,
    "gpm_occupancy_s": 0.4,
    "gpm_tensor_s": 0.6,
    "gpm_fp64_s": 0.05,
    "gpm_fp32_s": 0.3,
    "gpm_fp16_s": 0.2,
    "gpm_dram_s": 0.5,
}
"""The simulated GPM engines: each is busy this share of the time its device is busy (DRAM:
unless the scenario gives the device a `memory_utilization`), so a GPM ratio between two
samples is share x mean utilization. Byte rates (PCIe, NVLink) follow `nvml_state`."""

THROTTLE_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    pid: int
    memory: int
    utilization: Signal
    start: float = 0.0
    end: float = math.inf

    def alive(self, t: float) -> bool:
        return self.start <= t < self.end


MIG_PROFILES: dict[str, tuple[int, int]] = {"1g": (19, 1), "2g": (14, 2), "3g": (9, 4),
                                             "4g": (5, 4), "7g": (0, 8)}  # fmt: skip
"""A GPU instance profile's compute part -> (its profile ID, the memory slices a placement
of it occupies), as `nvidia-smi mig -lgip` lists them on an A100 and an H100 (NVIDIA's MIG
user guide, "Supported MIG Profiles": 19 is 1g.5gb/1g.10gb, 14 2g, 9 3g, 5 4g, 0 7g, on 8
memory slices). The variants (1g with twice the memory, ID 15, 2 slices; `+me`, ID 20) are
given by a scenario's `profile_id` and `placement`. `nvmlGpuInstanceGetInfo` answers them
(nvml.h `nvmlGpuInstanceInfo_t`: `profileId`, `placement {start, size}`)."""


def mig_profile(profile: str) -> tuple[int, int]:
    """(profile ID, placement size) of a profile name by its compute part (`3g.40gb`)."""
    return MIG_PROFILES.get(profile.split(".", 1)[0], (19, 1))


@dataclass(frozen=True, slots=True)
class MigSpec:
    uuid: str
    profile: str
    gi: int
    ci: int
    memory: int
    utilization: Signal
    memory_utilization: Signal | None
    processes: tuple[ProcessSpec, ...] = ()
    profile_id: int = 19
    """The GPU instance profile ID (MIG_PROFILES)."""
    placement: tuple[int, int] = (0, 1)
    """(start, size) in memory slices: where the GPU instance sits on its GPU."""

    @property
    def slices(self) -> int:
        """Compute slices out of seven (`3g.40gb` -> 3)."""
        m = re.match(r"(\d+)g\.", self.profile)
        return int(m[1]) if m else 1


@dataclass(frozen=True, slots=True)
class GpuSpec:
    index: int
    uuid: str
    name: str
    serial: str
    pci_bus_id: str
    minor: int
    memory: int
    memory_reserved: int
    memory_used: int
    power_limit: float
    power_idle: float
    power_max: float
    utilization: Signal
    memory_utilization: Signal | None
    encoder_utilization: Signal
    decoder_utilization: Signal
    temperature_idle: float
    temperature_max: float
    sm_clock_idle: int
    sm_clock_max: int
    memory_clock: int
    pcie_peak: float
    pcie_replays_per_hour: float
    ecc_corrected_per_hour: float
    ecc_uncorrected_at: tuple[float, ...]
    remapped_rows: tuple[int, int, bool, bool]
    nvlink_links: int
    nvlink_peak: float
    nvlink_crc_per_hour: float
    max_mig_devices: int
    gpm: bool
    unsupported: frozenset[str]
    pci_device_id: int
    pci_subsystem_id: int
    mig: tuple[MigSpec, ...] = ()
    processes: tuple[ProcessSpec, ...] = ()
    mig_enabled: bool = False
    """MIG mode on with no slice made yet (`mig_mode: true`): how a GPU waits for a DRA
    driver to make its partitions at prepare (dra-driver-nvidia-gpu nvlib.go)."""

    @property
    def mig_mode(self) -> bool:
        return bool(self.mig) or self.mig_enabled

    def busy(self, t: float) -> float:
        """Fraction of the GPU busy at t (a MIG GPU: its slices weighted by size)."""
        if not self.mig:
            return self.utilization.value(t)
        return sum(m.utilization.value(t) * m.slices for m in self.mig) / 7

    def busy_seconds(self, t: float) -> float:
        if not self.mig:
            return self.utilization.integral(t)
        return sum(m.utilization.integral(t) * m.slices for m in self.mig) / 7


@dataclass(frozen=True, slots=True)
class XidSpec:
    at: float
    gpu: int
    xid: int
    gi: int = NO_ID
    ci: int = NO_ID


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    start: float = 0.0
    end: float = math.inf
    gpus: frozenset[int] | None = None
    """None: every GPU."""
    features: frozenset[str] = frozenset()
    reasons: int = 0
    function: str = "*"
    ms: int = 0
    code: int = 999
    """NVML return code of an `error` fault (999: NVML_ERROR_UNKNOWN)."""
    version: str = ""
    """The driver version a `driver_upgraded` fault loads at its end."""

    def active(self, t: float) -> bool:
        return self.start <= t < self.end

    def hits(self, gpu: int, t: float) -> bool:
        return self.active(t) and (self.gpus is None or gpu in self.gpus)


FAULT_KINDS = (
    "lost",
    "not_supported",
    "error",
    "slow",
    "missing",
    "driver_unloaded",
    "driver_upgraded",
    "throttle",
    "no_access",
)
"""`driver_upgraded`: the driver is unloaded from start to end, then another `version` loads
(a process that mapped the old library gets LIB_RM_VERSION_MISMATCH); `no_access`: the
GPUs are counted but this pod may not open them (NO_PERMISSION)."""


@dataclass(frozen=True, slots=True)
class NvidiaSpec:
    driver_version: str = "580.95.05"
    gpus: tuple[GpuSpec, ...] = ()
    xids: tuple[XidSpec, ...] = ()
    faults: tuple[Fault, ...] = ()
    privileged: bool = True
    """False: NVML answers NO_PERMISSION where nvml.h says a call needs privileges."""
    pid_namespace: str = "own"
    """The exporter's PID namespace as the driver sees it. `own` (the DaemonSet as shipped,
    no hostPID): the process lists are empty, utilization samples keep host PIDs, as
    measured on a real driver (docs/nvml.md). `host`: hostPID, everything listed."""

    def device_index(self) -> dict[str, tuple[int, int, int]]:
        """Every UUID -> (gpu index, gi, ci); full GPUs have no instance ids."""
        out: dict[str, tuple[int, int, int]] = {}
        for gpu in self.gpus:
            out[gpu.uuid] = (gpu.index, NO_ID, NO_ID)
            for mig in gpu.mig:
                out[mig.uuid] = (gpu.index, mig.gi, mig.ci)
        return out
