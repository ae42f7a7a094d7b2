"""The `nvidia:` scenario section: GPUs, MIG slices, processes, XID events and faults.

`parse_nvidia` validates the raw section into frozen specs; `render` turns a spec and a
scenario time into the state file that the simulated libnvidia-ml.so.1
(`fakenvml/fakenvml.c`) serves. Every counter is computed from time (integrals of
`signals.Signal`s), so it never goes backwards except where the real driver's does: on a
driver reload, when the "since the driver loaded" counters start again from zero.
The format is documented in docs/simulation.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from exporter.join import pci_address
from exporter.simulate.scenario import ScenarioError, _Where
from exporter.simulate.signals import Signal, parse_signal

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
    "gpm": ("gpm", "gpm_busy_s", "gpm_sm_s", "gpm_dram_s", "gpm_tensor_s"),
    "serial": ("serial",),
}
"""Names usable in `unsupported:` and `not_supported` faults -> the state keys they hide
(a hidden key is NVML_ERROR_NOT_SUPPORTED for every call and field that reads it)."""

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

DGX_BUS_IDS = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
"""PCI buses of the eight GPUs of a DGX H100, used when a GPU names none."""

GPU_DEFAULTS: dict[str, Any] = {
    "name": "NVIDIA H100 80GB HBM3",
    "memory": 81559 * MIB,
    "memory_reserved": 491 * MIB,
    "memory_used": 0,
    "power_limit": 700.0,
    "power_idle": 70.0,
    "utilization": 0.0,
    "encoder_utilization": 0.0,
    "decoder_utilization": 0.0,
    "temperature_idle": 32.0,
    "temperature_max": 78.0,
    "sm_clock_idle": 345,
    "sm_clock_max": 1980,
    "memory_clock": 2619,
    "pcie_peak": 12e9,
    "pcie_replays_per_hour": 0.0,
    "ecc_corrected_per_hour": 0.0,
    "ecc_uncorrected_at": [],
    "remapped_rows": {},
    "nvlink_links": 18,
    "nvlink_peak": 120e9,
    "nvlink_crc_per_hour": 0.0,
    "max_mig_devices": 7,
    "gpm": True,
    "unsupported": [],
    "pci_device_id": 0x233010DE,
    "pci_subsystem_id": 0x16C110DE,
}
"""An H100 SXM5 80GB; `gpu_defaults:` and each GPU entry override these."""

GPU_KEYS = {
    *GPU_DEFAULTS,
    "uuid",
    "serial",
    "pci_bus_id",
    "minor",
    "power_max",
    "memory_utilization",
    "mig",
    "processes",
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

    @property
    def mig_mode(self) -> bool:
        return bool(self.mig)

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
_RELOADS = ("driver_unloaded", "driver_upgraded")


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
    measured on a real driver (behaviour.py, MEASURED). `host`: hostPID, everything listed."""

    def device_index(self) -> dict[str, tuple[int, int, int]]:
        """Every UUID -> (gpu index, gi, ci); full GPUs have no instance ids."""
        out: dict[str, tuple[int, int, int]] = {}
        for gpu in self.gpus:
            out[gpu.uuid] = (gpu.index, NO_ID, NO_ID)
            for mig in gpu.mig:
                out[mig.uuid] = (gpu.index, mig.gi, mig.ci)
        return out


# --- parsing --------------------------------------------------------------------------


class _Doc(_Where):
    """The scenario parser's validation helpers, extended to values: every error names the
    scenario, the key path and the problem."""

    def fields(self, value: Any, where: str, allowed: set[str]) -> dict[str, Any]:
        doc = self.mapping(value, where)
        self.keys(doc, where, allowed)
        return doc

    def items(self, value: Any, where: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(where, f"expected a list, got {type(value).__name__}")
        return value

    def num(self, value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(where, f"expected a number, got {value!r}")
        return float(value)

    def size(self, value: Any, where: str) -> int:
        """Bytes: a number or a string like `80GiB`, `9984MiB`."""
        if isinstance(value, str):
            m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|TiB)?\s*", value)
            if not m:
                raise self.fail(where, f"expected a size like 80GiB, got {value!r}")
            unit = {"B": 1, "KiB": 1024, "MiB": MIB, "GiB": GIB, "TiB": 1024 * GIB, None: 1}
            return int(float(m[1]) * unit[m[2]])
        return int(self.num(value, where))

    def signal(self, value: Any, where: str) -> Signal:
        try:
            return parse_signal(value, where)
        except ValueError as exc:
            raise ScenarioError(f"{self.name}: {exc}") from exc

    def features(self, value: Any, where: str) -> frozenset[str]:
        names = [str(n) for n in self.items(value, where)]
        unknown = sorted(set(names) - set(FEATURES))
        if unknown:
            raise self.fail(where, f"unknown features {unknown} (known: {sorted(FEATURES)})")
        return frozenset(names)


def parse_nvidia(section: Any, scenario: str = "scenario") -> NvidiaSpec:
    doc = _Doc(scenario)
    top = doc.fields(
        section,
        "nvidia",
        {"driver_version", "gpu_defaults", "gpus", "xid", "faults", "privileged", "pid_namespace"},
    )
    privileged = top.get("privileged", True)
    if not isinstance(privileged, bool):
        raise doc.fail("nvidia.privileged", f"expected true or false, got {privileged!r}")
    pid_namespace = top.get("pid_namespace", "own")
    if pid_namespace not in ("own", "host"):
        raise doc.fail("nvidia.pid_namespace", f"expected own or host, got {pid_namespace!r}")
    defaults = dict(GPU_DEFAULTS)
    defaults.update(doc.fields(top.get("gpu_defaults") or {}, "nvidia.gpu_defaults", GPU_KEYS))
    gpus = tuple(
        _gpu(doc, i, defaults | doc.fields(g, f"nvidia.gpus[{i}]", GPU_KEYS))
        for i, g in enumerate(doc.items(top.get("gpus"), "nvidia.gpus"))
    )
    uuids = [g.uuid for g in gpus] + [m.uuid for g in gpus for m in g.mig]
    duplicates = sorted({u for u in uuids if uuids.count(u) > 1})
    if duplicates:
        raise doc.fail("nvidia.gpus", f"UUIDs used twice: {duplicates}")
    spec = NvidiaSpec(driver_version=str(top.get("driver_version", "580.95.05")), gpus=gpus)
    xids = tuple(
        _xid(doc, spec, x, f"nvidia.xid[{i}]")
        for i, x in enumerate(doc.items(top.get("xid"), "xid"))
    )
    faults = tuple(
        _fault(doc, spec, f, f"nvidia.faults[{i}]")
        for i, f in enumerate(doc.items(top.get("faults"), "nvidia.faults"))
    )
    return NvidiaSpec(
        spec.driver_version,
        gpus,
        tuple(sorted(xids, key=lambda x: x.at)),
        faults,
        privileged,
        pid_namespace,
    )


def _gpu(doc: _Doc, index: int, g: dict[str, Any]) -> GpuSpec:
    where = f"nvidia.gpus[{index}]"
    if "uuid" not in g or not str(g["uuid"]).startswith("GPU-"):
        raise doc.fail(where, "needs a uuid starting with GPU-")
    remap = doc.fields(
        g["remapped_rows"],
        f"{where}.remapped_rows",
        {"correctable", "uncorrectable", "pending", "failure"},
    )
    limit = doc.num(g["power_limit"], f"{where}.power_limit")
    migs = tuple(
        _mig(doc, m, f"{where}.mig[{i}]")
        for i, m in enumerate(doc.items(g.get("mig"), f"{where}.mig"))
    )
    if len(migs) > int(g["max_mig_devices"]):
        raise doc.fail(f"{where}.mig", f"more slices than max_mig_devices ({g['max_mig_devices']})")
    return GpuSpec(
        index=index,
        uuid=str(g["uuid"]),
        name=str(g["name"]),
        serial=str(g.get("serial", f"16509230{index:05d}")),
        pci_bus_id=_bus_id(doc, g.get("pci_bus_id", f"0000:{DGX_BUS_IDS[index % 8]}:00.0"), where),
        minor=int(doc.num(g.get("minor", index), f"{where}.minor")),
        memory=doc.size(g["memory"], f"{where}.memory"),
        memory_reserved=doc.size(g["memory_reserved"], f"{where}.memory_reserved"),
        memory_used=doc.size(g["memory_used"], f"{where}.memory_used"),
        power_limit=limit,
        power_idle=doc.num(g["power_idle"], f"{where}.power_idle"),
        power_max=doc.num(g.get("power_max", 0.95 * limit), f"{where}.power_max"),
        utilization=doc.signal(g["utilization"], f"{where}.utilization"),
        memory_utilization=(
            doc.signal(g["memory_utilization"], f"{where}.memory_utilization")
            if "memory_utilization" in g
            else None
        ),
        encoder_utilization=doc.signal(g["encoder_utilization"], f"{where}.encoder_utilization"),
        decoder_utilization=doc.signal(g["decoder_utilization"], f"{where}.decoder_utilization"),
        temperature_idle=doc.num(g["temperature_idle"], f"{where}.temperature_idle"),
        temperature_max=doc.num(g["temperature_max"], f"{where}.temperature_max"),
        sm_clock_idle=int(doc.num(g["sm_clock_idle"], f"{where}.sm_clock_idle")),
        sm_clock_max=int(doc.num(g["sm_clock_max"], f"{where}.sm_clock_max")),
        memory_clock=int(doc.num(g["memory_clock"], f"{where}.memory_clock")),
        pcie_peak=doc.num(g["pcie_peak"], f"{where}.pcie_peak"),
        pcie_replays_per_hour=doc.num(g["pcie_replays_per_hour"], f"{where}.pcie_replays_per_hour"),
        ecc_corrected_per_hour=doc.num(
            g["ecc_corrected_per_hour"], f"{where}.ecc_corrected_per_hour"
        ),
        ecc_uncorrected_at=tuple(
            doc.num(x, f"{where}.ecc_uncorrected_at")
            for x in doc.items(g["ecc_uncorrected_at"], f"{where}.ecc_uncorrected_at")
        ),
        remapped_rows=(
            int(remap.get("correctable", 0)),
            int(remap.get("uncorrectable", 0)),
            bool(remap.get("pending", False)),
            bool(remap.get("failure", False)),
        ),
        nvlink_links=int(doc.num(g["nvlink_links"], f"{where}.nvlink_links")),
        nvlink_peak=doc.num(g["nvlink_peak"], f"{where}.nvlink_peak"),
        nvlink_crc_per_hour=doc.num(g["nvlink_crc_per_hour"], f"{where}.nvlink_crc_per_hour"),
        max_mig_devices=int(doc.num(g["max_mig_devices"], f"{where}.max_mig_devices")),
        gpm=bool(g["gpm"]),
        unsupported=doc.features(g["unsupported"], f"{where}.unsupported"),
        pci_device_id=int(g["pci_device_id"]),
        pci_subsystem_id=int(g["pci_subsystem_id"]),
        mig=migs,
        processes=_processes(doc, g.get("processes"), f"{where}.processes"),
    )


def _bus_id(doc: _Doc, value: Any, where: str) -> str:
    address = pci_address(str(value))
    if address is None:
        raise doc.fail(f"{where}.pci_bus_id", f"not a PCI address: {value!r}")
    return address


def _mig(doc: _Doc, value: Any, where: str) -> MigSpec:
    m = doc.fields(
        value,
        where,
        {"uuid", "profile", "gi", "ci", "memory", "utilization", "memory_utilization", "processes"},
    )
    for key in ("uuid", "profile", "gi"):
        if key not in m:
            raise doc.fail(where, f"needs {key!r}")
    if not str(m["uuid"]).startswith("MIG-"):
        raise doc.fail(f"{where}.uuid", "must start with MIG-")
    profile = str(m["profile"])
    size = re.search(r"\.(\d+)gb", profile)
    # nvidia-smi shows a 1g.10gb slice of an H100 80GB as 9984MiB: 97.5% of the name.
    default_memory = int(int(size[1]) * 1024 * 0.975) * MIB if size else 10 * GIB
    return MigSpec(
        uuid=str(m["uuid"]),
        profile=profile,
        gi=int(doc.num(m["gi"], f"{where}.gi")),
        ci=int(doc.num(m.get("ci", 0), f"{where}.ci")),
        memory=doc.size(m.get("memory", default_memory), f"{where}.memory"),
        utilization=doc.signal(m.get("utilization", 0.0), f"{where}.utilization"),
        memory_utilization=(
            doc.signal(m["memory_utilization"], f"{where}.memory_utilization")
            if "memory_utilization" in m
            else None
        ),
        processes=_processes(doc, m.get("processes"), f"{where}.processes"),
    )


def _processes(doc: _Doc, value: Any, where: str) -> tuple[ProcessSpec, ...]:
    out = []
    for i, p in enumerate(doc.items(value, where)):
        p = doc.fields(p, f"{where}[{i}]", {"pid", "memory", "utilization", "start", "end"})
        if "pid" not in p:
            raise doc.fail(f"{where}[{i}]", "needs 'pid'")
        out.append(
            ProcessSpec(
                pid=int(doc.num(p["pid"], f"{where}[{i}].pid")),
                memory=doc.size(p.get("memory", 0), f"{where}[{i}].memory"),
                utilization=doc.signal(p.get("utilization", 0.0), f"{where}[{i}].utilization"),
                start=doc.num(p.get("start", 0), f"{where}[{i}].start"),
                end=doc.num(p["end"], f"{where}[{i}].end") if "end" in p else math.inf,
            )
        )
    return tuple(out)


def _device(doc: _Doc, spec: NvidiaSpec, value: Any, where: str) -> tuple[int, int, int]:
    """A GPU index, GPU UUID or MIG UUID -> (gpu index, gi, ci)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < len(spec.gpus):
            raise doc.fail(where, f"no GPU with index {value}")
        return value, NO_ID, NO_ID
    found = spec.device_index().get(str(value))
    if found is None:
        raise doc.fail(where, f"no GPU or MIG device {value!r}")
    return found


def _xid(doc: _Doc, spec: NvidiaSpec, value: Any, where: str) -> XidSpec:
    x = doc.fields(value, where, {"at", "device", "xid"})
    for key in ("at", "device", "xid"):
        if key not in x:
            raise doc.fail(where, f"needs {key!r}")
    gpu, gi, ci = _device(doc, spec, x["device"], f"{where}.device")
    return XidSpec(doc.num(x["at"], f"{where}.at"), gpu, int(x["xid"]), gi, ci)


def _fault(doc: _Doc, spec: NvidiaSpec, value: Any, where: str) -> Fault:
    f = doc.fields(
        value,
        where,
        {
            "kind",
            "start",
            "end",
            "gpus",
            "features",
            "reasons",
            "function",
            "ms",
            "code",
            "version",
        },
    )
    kind = f.get("kind")
    if kind not in FAULT_KINDS:
        raise doc.fail(f"{where}.kind", f"expected one of {', '.join(FAULT_KINDS)}, got {kind!r}")
    if kind == "driver_upgraded" and not f.get("version"):
        raise doc.fail(f"{where}.version", "a driver_upgraded fault needs the new version")
    gpus = None
    if "gpus" in f:
        gpus = frozenset(
            _device(doc, spec, g, f"{where}.gpus")[0] for g in doc.items(f["gpus"], f"{where}.gpus")
        )
    reasons = [str(r) for r in doc.items(f.get("reasons"), f"{where}.reasons")]
    unknown = sorted(set(reasons) - set(THROTTLE_BITS))
    if unknown:
        raise doc.fail(f"{where}.reasons", f"unknown {unknown} (known: {sorted(THROTTLE_BITS)})")
    return Fault(
        kind=kind,
        start=doc.num(f.get("start", 0), f"{where}.start"),
        end=doc.num(f["end"], f"{where}.end") if "end" in f else math.inf,
        gpus=gpus,
        features=doc.features(f.get("features"), f"{where}.features"),
        reasons=sum(THROTTLE_BITS[r] for r in reasons),
        function=str(f.get("function", "*")),
        ms=int(doc.num(f.get("ms", 0), f"{where}.ms")),
        code=int(doc.num(f.get("code", 999), f"{where}.code")),
        version=str(f.get("version", "")),
    )


# --- rendering ------------------------------------------------------------------------


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
    if not gpu.mig:
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
        values |= _gpm(gpu.busy_seconds(t))
    return values


def _mig_values(gpu: GpuSpec, mig: MigSpec, t: float) -> dict[str, object]:
    used = 13 * MIB + sum(p.memory for p in mig.processes if p.alive(t))
    values: dict[str, object] = {
        "uuid": mig.uuid,
        "name": f"{gpu.name} MIG {mig.profile}",
        "gi": mig.gi,
        "ci": mig.ci,
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
    """Cumulative busy seconds: the fake's GPM metrics are their rates between two samples."""
    return {
        "gpm": 1,
        "gpm_busy_s": f"{busy_s:.6f}",
        "gpm_sm_s": f"{0.85 * busy_s:.6f}",
        "gpm_dram_s": f"{(0.5 * busy_s if dram_s is None else dram_s):.6f}",
        "gpm_tensor_s": f"{0.6 * busy_s:.6f}",
    }


def _nvml_bus_id(address: str) -> str:
    """Canonical `0000:18:00.0` -> NVML's `00000000:18:00.0` (8-digit domain, upper-case)."""
    domain, bus, rest = address.split(":")
    return f"{int(domain, 16):08X}:{bus.upper()}:{rest.upper()}"
