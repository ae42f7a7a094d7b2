"""The `nvidia:` scenario section parsed: the raw YAML validated into frozen specs.

`parse_nvidia` checks every key and value, fills in an H100's defaults (`GPU_DEFAULTS`), and
raises ScenarioError naming the scenario, the key path and the problem. `nvml_state.render`
turns the specs into the simulated driver's state file; docs/simulation.md documents the
section.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any

from exporter.ids import pci_address
from simulator.nvml_spec import (
    FAULT_KINDS,
    FEATURES,
    GIB,
    MIB,
    NO_ID,
    THROTTLE_BITS,
    Fault,
    GpuSpec,
    MigSpec,
    NvidiaSpec,
    ProcessSpec,
    XidSpec,
    mig_profile,
)
from simulator.scenario import ScenarioError, _Where
from simulator.signals import Signal, parse_signal

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
    "mig_mode": False,
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
    migs = _placed(
        tuple(
            _mig(doc, m, f"{where}.mig[{i}]")
            for i, m in enumerate(doc.items(g.get("mig"), f"{where}.mig"))
        )
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
        mig_enabled=bool(g["mig_mode"]),
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
        {"uuid", "profile", "gi", "ci", "memory", "utilization", "memory_utilization", "processes",
         "profile_id", "placement"},
    )  # fmt: skip
    for key in ("uuid", "profile", "gi"):
        if key not in m:
            raise doc.fail(where, f"needs {key!r}")
    if not str(m["uuid"]).startswith("MIG-"):
        raise doc.fail(f"{where}.uuid", "must start with MIG-")
    profile = str(m["profile"])
    size = re.search(r"\.(\d+)gb", profile)
    # nvidia-smi shows a 1g.10gb slice of an H100 80GB as 9984MiB: 97.5% of the name.
    default_memory = int(int(size[1]) * 1024 * 0.975) * MIB if size else 10 * GIB
    profile_id, size_default = mig_profile(profile)
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
        profile_id=int(doc.num(m.get("profile_id", profile_id), f"{where}.profile_id")),
        placement=_placement(doc, m.get("placement"), size_default, f"{where}.placement"),
    )


def _placement(doc: _Doc, value: Any, size: int, where: str) -> tuple[int, int]:
    """`placement: {start: S, size: N}` (memory slices); the size defaults to the profile's,
    the start to -1: the GPU's block places it (`_placed`)."""
    if value is None:
        return (-1, size)
    p = doc.fields(value, where, {"start", "size"})
    return (int(doc.num(p.get("start", -1), f"{where}.start")),
            int(doc.num(p.get("size", size), f"{where}.size")))  # fmt: skip


def _placed(migs: tuple[MigSpec, ...]) -> tuple[MigSpec, ...]:
    """Slices without a start take the first free start that is a multiple of their size (as
    the driver's placements are: 2g at 0, 2, 4; 3g at 0, 4), in the order listed."""
    placed = [m.placement for m in migs if m.placement[0] >= 0]
    taken = {s for start, size in placed for s in range(start, start + size)}
    out = []
    for m in migs:
        start, size = m.placement
        if start < 0:
            start = next(s for s in range(0, 64, max(size, 1))
                         if not taken & set(range(s, s + size)))  # fmt: skip
            taken |= set(range(start, start + size))
            m = replace(m, placement=(start, size))
        out.append(m)
    return tuple(out)


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
