"""The simulated driver's state file: a scenario's NVIDIA specs rendered at one moment.

`render` turns a spec and a scenario time into the file that the simulated libnvidia-ml.so.1
(`fakenvml/fakenvml.c`) serves; the keys of each GPU and MIG block are `_gpu_values` and
`_mig_values` here. Every counter is computed from time (integrals of `signals.Signal`s), so
it never goes backwards except where the real driver's does: on a driver reload, when the
"since the driver loaded" counters start again from zero. The format is documented in
docs/simulation.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from simulator.nvml_spec import (
    FEATURES,
    GPM_SHARES,
    MIB,
    NO_ID,
    THROTTLE_BITS,
    GpuSpec,
    MigSpec,
    NvidiaSpec,
    ProcessSpec,
)

_RELOADS = ("driver_unloaded", "driver_upgraded")


def driver_history(spec: NvidiaSpec, t: float) -> tuple[bool, int, float, str]:
    """(driver loaded at t, reloads completed by t, time the current driver loaded, its
    version)."""
    unloads = [f for f in spec.faults if f.kind in _RELOADS and f.start <= t]
    done = sorted((f for f in unloads if f.end <= t), key=lambda f: f.end)
    loaded = not any(f.active(t) for f in unloads)
    version = spec.driver_version
    for f in done:
        version = f.version or version
    return loaded, len(done), max((f.end for f in done), default=0.0), version


def render(spec: NvidiaSpec, t: float, epoch_us: int) -> str:
    """The state file for scenario time t (see fakenvml.c for the format)."""
    loaded, generation, loaded_at, version = driver_history(spec, t)
    lines = [
        "# kube-device-exporter simulated NVML state",
        f"time {t:.6f}",
        f"timestamp_us {epoch_us + round(t * 1e6)}",
        f"driver {version}",
        f"loaded {int(loaded)}",
        f"privileged {int(spec.privileged)}",
        f"pid_namespace {spec.pid_namespace}",
        f"generation {generation}",
    ]
    lines += [f"slow {f.function} {f.ms}" for f in spec.faults if f.kind == "slow" and f.active(t)]
    lines += [f"missing {f.function}" for f in spec.faults if f.kind == "missing" and f.active(t)]
    for gpu in spec.gpus:
        lines += _render_gpu(spec, gpu, t, loaded_at)
    for seq, x in enumerate(spec.xids, start=1):
        if x.at <= t:
            lines.append(f"xid {seq} {x.gpu} {x.xid} {x.gi} {x.ci}")
    return "\n".join(lines) + "\n"


def _render_gpu(spec: NvidiaSpec, gpu: GpuSpec, t: float, since: float) -> Iterator[str]:
    hidden = set(gpu.unsupported)
    for fault in spec.faults:
        if fault.kind == "not_supported" and fault.hits(gpu.index, t):
            hidden |= fault.features
    hidden_keys = {key for feature in hidden for key in FEATURES[feature]}
    failing = {
        key: f"!{fault.code}"
        for fault in spec.faults
        if fault.kind == "error" and fault.hits(gpu.index, t)
        for feature in fault.features
        for key in FEATURES[feature]
    }
    yield f"gpu {gpu.index}"
    values = _gpu_values(spec, gpu, t, since) | failing
    if any(f.kind == "no_access" and f.hits(gpu.index, t) for f in spec.faults):
        values["no_access"] = 1
    if any(f.kind == "lost" and f.hits(gpu.index, t) for f in spec.faults):
        values = {k: values[k] for k in ("uuid", "name", "pci", "minor")} | {"lost": 1}
    for key, value in values.items():
        if key not in hidden_keys:
            yield f"{key} {value}"
    for proc, gi, ci in _all_processes(gpu, t):
        util = proc.utilization.value(t)
        yield f"proc {proc.pid} {proc.memory} {gi} {ci} {round(100 * util)} {round(50 * util)}"
    for slot, mig in enumerate(gpu.mig):
        yield f"mig {gpu.index} {slot}"
        for key, value in _mig_values(gpu, mig, t).items():
            if key not in hidden_keys:
                yield f"{key} {value}"


def _all_processes(gpu: GpuSpec, t: float) -> Iterator[tuple[ProcessSpec, int, int]]:
    """Processes alive at t, with the GPU/compute instance they run in."""
    for proc in gpu.processes:
        if proc.alive(t):
            yield proc, NO_ID, NO_ID
    for mig in gpu.mig:
        for proc in mig.processes:
            if proc.alive(t):
                yield proc, mig.gi, mig.ci


def _gpu_values(spec: NvidiaSpec, gpu: GpuSpec, t: float, since: float) -> dict[str, object]:
    busy = gpu.busy(t)
    busy_s = gpu.busy_seconds(t) - gpu.busy_seconds(since)
    uptime = t - since
    power = gpu.power_idle + (gpu.power_max - gpu.power_idle) * busy
    energy = gpu.power_idle * uptime + (gpu.power_max - gpu.power_idle) * busy_s
    temperature = gpu.temperature_idle + (gpu.temperature_max - gpu.temperature_idle) * busy
    sm_clock = gpu.sm_clock_idle + (gpu.sm_clock_max - gpu.sm_clock_idle) * min(1.0, 2 * busy)
    throttle = (THROTTLE_BITS["gpu_idle"] if busy < 0.05 else 0) | (
        THROTTLE_BITS["sw_power_cap"] if busy > 0.9 else 0
    )
    for fault in spec.faults:
        if fault.kind == "throttle" and fault.hits(gpu.index, t):
            throttle |= fault.reasons
    used = gpu.memory_used + sum(p.memory for p, _, _ in _all_processes(gpu, t))
    used += len(gpu.mig) * 13 * MIB if gpu.mig else 0
    corrected = math.floor(gpu.ecc_corrected_per_hour * uptime / 3600)
    uncorrected = sum(1 for at in gpu.ecc_uncorrected_at if since <= at <= t)
    cor, unc, pending, failure = gpu.remapped_rows
    values: dict[str, object] = {
        "uuid": gpu.uuid,
        "name": gpu.name,
        "serial": gpu.serial,
        "pci": _nvml_bus_id(gpu.pci_bus_id),
        "pci_device_id": gpu.pci_device_id,
        "pci_subsystem_id": gpu.pci_subsystem_id,
        "minor": gpu.minor,
        "mig_mode": int(gpu.mig_mode),
        "max_mig_devices": gpu.max_mig_devices,
        "memory_total": gpu.memory,
        "memory_reserved": gpu.memory_reserved,
        "memory_used": min(used, gpu.memory - gpu.memory_reserved),
        "power_mw": round(power * 1000),
        "power_limit_mw": round(gpu.power_limit * 1000),
        "energy_mj": math.floor(energy * 1000),
        "temp_gpu": round(temperature),
        "temp_memory": round(temperature) + 6,
        "clock_graphics": round(sm_clock),
        "clock_sm": round(sm_clock),
        "clock_memory": gpu.memory_clock,
        "clock_video": round(sm_clock * 0.9),
        "throttle": throttle,
        "pcie_tx_bytes": math.floor(1e6 * uptime + gpu.pcie_peak * busy_s),
        "pcie_rx_bytes": math.floor(2e6 * uptime + 1.3 * gpu.pcie_peak * busy_s),
        "pcie_tx_rate": round(1e6 + gpu.pcie_peak * busy),
        "pcie_rx_rate": round(2e6 + 1.3 * gpu.pcie_peak * busy),
        "pcie_replay": math.floor(gpu.pcie_replays_per_hour * uptime / 3600),
        "ecc_corrected": corrected,
        "ecc_uncorrected": uncorrected,
        "remapped_cor": cor,
        "remapped_unc": unc,
        "remapped_pending": int(pending),
        "remapped_failure": int(failure),
        "processes": 1,
    }
    if not gpu.mig_mode:
        memory_util = gpu.memory_utilization.value(t) if gpu.memory_utilization else 0.5 * busy
        values |= {
            "util_gpu": round(100 * busy),
            "util_memory": round(100 * memory_util),
            "util_encoder": round(100 * gpu.encoder_utilization.value(t)),
            "util_decoder": round(100 * gpu.decoder_utilization.value(t)),
            "process_utilization": 1,
        }
    if gpu.nvlink_links:
        nvlink_bytes = gpu.nvlink_peak * busy_s
        values |= {
            "nvlink_links": gpu.nvlink_links,
            "nvlink_tx_kib": math.floor(nvlink_bytes / 1024),
            "nvlink_rx_kib": math.floor(0.9 * nvlink_bytes / 1024),
            "nvlink_crc_data": math.floor(gpu.nvlink_crc_per_hour * uptime / 3600),
            "nvlink_crc_flit": 0,
            "nvlink_replay": 0,
            "nvlink_recovery": 0,
        }
    if gpu.gpm:
        values |= _gpm(gpu.busy_seconds(t), _dram_seconds(gpu, t))
        busy_s = gpu.busy_seconds(t)
        values |= {  # cumulative since scenario start: GPM only reads their rates
            "gpm_pcie_tx_bytes": f"{1e6 * t + gpu.pcie_peak * busy_s:.3f}",
            "gpm_pcie_rx_bytes": f"{2e6 * t + 1.3 * gpu.pcie_peak * busy_s:.3f}",
        }
        if gpu.nvlink_links:
            values |= {
                "gpm_nvlink_tx_bytes": f"{gpu.nvlink_peak * busy_s:.3f}",
                "gpm_nvlink_rx_bytes": f"{0.9 * gpu.nvlink_peak * busy_s:.3f}",
            }
    return values


def _dram_seconds(gpu: GpuSpec, t: float) -> float | None:
    """A whole GPU's DRAM-busy seconds: its memory utilization where the scenario gives
    one (MIG off), else GPM_SHARES' share of its busy time."""
    if gpu.mig_mode or gpu.memory_utilization is None:
        return None
    return gpu.memory_utilization.integral(t)


def _mig_values(gpu: GpuSpec, mig: MigSpec, t: float) -> dict[str, object]:
    used = 13 * MIB + sum(p.memory for p in mig.processes if p.alive(t))
    values: dict[str, object] = {
        "uuid": mig.uuid,
        "name": f"{gpu.name} MIG {mig.profile}",
        "gi": mig.gi,
        "ci": mig.ci,
        "profile_id": mig.profile_id,
        "placement_start": mig.placement[0],
        "placement_size": mig.placement[1],
        "memory_total": mig.memory,
        "memory_reserved": 0,
        "memory_used": min(used, mig.memory),
        "processes": 1,
    }
    if gpu.gpm:
        busy_s = mig.utilization.integral(t)
        dram_s = mig.memory_utilization.integral(t) if mig.memory_utilization else None
        values |= _gpm(busy_s, dram_s)
    return values


def _gpm(busy_s: float, dram_s: float | None = None) -> dict[str, object]:
    """Cumulative busy seconds: the fake's GPM metrics are their rates between two samples.
    Each engine is busy its `GPM_SHARES` share of the device's busy time."""
    values: dict[str, object] = {"gpm": 1, "gpm_busy_s": f"{busy_s:.6f}"}
    for key, share in GPM_SHARES.items():
        values[key] = f"{share * busy_s:.6f}"
    if dram_s is not None:
        values["gpm_dram_s"] = f"{dram_s:.6f}"
    return values


def _nvml_bus_id(address: str) -> str:
    """Canonical `0000:18:00.0` -> NVML's `00000000:18:00.0` (8-digit domain, upper-case)."""
    domain, bus, rest = address.split(":")
    return f"{int(domain, 16):08X}:{bus.upper()}:{rest.upper()}"
