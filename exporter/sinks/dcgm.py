"""The dcgm-exporter schema (`--metrics.schema=dcgm`): the same snapshot under its names.

dcgm-exporter's dashboards, alerts and recording rules key on `DCGM_FI_*` names, its units
(MiB, MHz, percent, millijoules) and its labels (`gpu`, `UUID`, `pci_bus_id`, `device`,
`modelName`, `Hostname`, `DCGM_FI_DRIVER_VERSION`, MIG `GPU_I_PROFILE`/`GPU_I_ID`, holder
`pod`/`namespace`/`container`). `FIELDS` is the one table from the native metric (and its
metric-specific attributes) to the DCGM field, its type and the unit conversion; the
Prometheus sink renders these points beside, or instead of, the native ones. Nothing here
reads hardware: a DCGM series exists exactly when its native sample does.

Holders, as on native series: a device held by exactly one container carries it. A
time-sliced or MPS GPU carries none (dcgm-exporter's default mode picks one sharing pod
arbitrarily; copying the value per pod, as its `--kubernetes-virtual-gpus` does, makes
every `sum by (namespace)` count a GPU once per pod). See docs/migrating-from-dcgm-exporter.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from exporter.metrics import SPECS, Kind, MetricSpec, Scope
from exporter.metrics import THROTTLE_REASONS as NVML_THROTTLE_REASONS
from exporter.model import Attributes, Device, JoinedDevice, Snapshot
from exporter.points import Point

MIB = 1024.0 * 1024.0


@dataclass(frozen=True, slots=True)
class DcgmSpec(MetricSpec):
    """A dcgm-exporter field: its name as is (a counter keeps its name, no `_total`)."""

    @property
    def prom_name(self) -> str:
        return self.name

    @property
    def prom_family(self) -> str:
        return self.name

    def prom_type(self, *, openmetrics: bool) -> str:
        # OpenMetrics requires `_total` on counter samples; `unknown` keeps the DCGM name
        # (Prometheus negotiates OpenMetrics first and would otherwise store `..._total`).
        if self.kind is Kind.COUNTER and openmetrics:
            return "unknown"
        return MetricSpec.prom_type(self, openmetrics=openmetrics)  # slots: no bare super()


@dataclass(frozen=True, slots=True)
class Field:
    spec: DcgmSpec
    metric: str
    """Native metric name (`exporter.metrics.SPECS`)."""
    match: Attributes = ()
    """Metric-specific attributes the native sample must carry."""
    scale: float = 1.0
    mig: bool | None = None
    """True: MIG slices only; False: whole GPUs only; None: both."""


def _field(
    name: str,
    kind: Kind,
    help_: str,
    metric: str,
    match: Attributes = (),
    *,
    scale: float = 1.0,
    mig: bool | None = None,
) -> Field:
    return Field(DcgmSpec(name, kind, "", help_, Scope.DEVICE), metric, match, scale, mig)


G, C = Kind.GAUGE, Kind.COUNTER
_DIR = "network.io.direction"

# Help texts are dcgm-exporter's (etc/default-counters.csv), so `# HELP` lines match too.
FIELDS: tuple[Field, ...] = (
    _field("DCGM_FI_DEV_SM_CLOCK", G, "SM clock frequency (in MHz).", "hw.gpu.clock",
           (("hw.gpu.clock.type", "sm"),), scale=1e-6),
    _field("DCGM_FI_DEV_MEM_CLOCK", G, "Memory clock frequency (in MHz).", "hw.gpu.clock",
           (("hw.gpu.clock.type", "memory"),), scale=1e-6),
    _field("DCGM_FI_DEV_MEMORY_TEMP", G, "Memory temperature (in C).", "hw.temperature",
           (("hw.sensor_location", "memory"),)),
    _field("DCGM_FI_DEV_GPU_TEMP", G, "GPU temperature (in C).", "hw.temperature",
           (("hw.sensor_location", "gpu"),)),
    _field("DCGM_FI_DEV_POWER_USAGE", G, "Power draw (in W).", "hw.power"),
    _field("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", C,
           "Total energy consumption since boot (in mJ).", "hw.energy", scale=1000.0),
    _field("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", C, "Total number of PCIe retries.",
           "hw.errors", (("error.type", "pcie_replay"),)),
    _field("DCGM_FI_DEV_GPU_UTIL", G, "GPU utilization (in %).", "hw.gpu.utilization",
           (("hw.gpu.task", "general"),), scale=100.0, mig=False),
    _field("DCGM_FI_DEV_MEM_COPY_UTIL", G, "Memory utilization (in %).",
           "hw.gpu.memory.bandwidth.utilization", scale=100.0, mig=False),
    _field("DCGM_FI_DEV_ENC_UTIL", G, "Encoder utilization (in %).", "hw.gpu.utilization",
           (("hw.gpu.task", "encoder"),), scale=100.0, mig=False),
    _field("DCGM_FI_DEV_DEC_UTIL", G, "Decoder utilization (in %).", "hw.gpu.utilization",
           (("hw.gpu.task", "decoder"),), scale=100.0, mig=False),
    _field("DCGM_FI_DEV_XID_ERRORS", G, "Value of the last XID error encountered.",
           "hw.gpu.xid.last"),
    _field("DCGM_FI_DEV_FB_FREE", G, "Framebuffer memory free (in MiB).",
           "hw.gpu.memory.free", scale=1 / MIB),
    _field("DCGM_FI_DEV_FB_USED", G, "Framebuffer memory used (in MiB).",
           "hw.gpu.memory.usage", scale=1 / MIB),
    _field("DCGM_FI_DEV_FB_RESERVED", G, "Framebuffer memory reserved (in MiB).",
           "hw.gpu.memory.reserved", scale=1 / MIB),
    _field("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", C,
           "Number of remapped rows for uncorrectable errors", "hw.gpu.memory.remapped_rows",
           (("hw.gpu.memory.remap_cause", "uncorrectable"),)),
    _field("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", C,
           "Number of remapped rows for correctable errors", "hw.gpu.memory.remapped_rows",
           (("hw.gpu.memory.remap_cause", "correctable"),)),
    _field("DCGM_FI_DEV_ROW_REMAP_FAILURE", G, "Whether remapping of rows has failed",
           "hw.gpu.memory.row_remap.failed"),
    _field("DCGM_FI_DEV_ROW_REMAP_PENDING", G, "Whether remapping of rows is pending",
           "hw.gpu.memory.row_remap.pending"),
    _field("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", C, "Total number of single-bit volatile ECC errors.",
           "hw.errors", (("error.type", "ecc_corrected"),)),
    _field("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", C, "Total number of double-bit volatile ECC errors.",
           "hw.errors", (("error.type", "ecc_uncorrected"),)),
    # GPM (Hopper and later; the NVML source, whole GPUs and MIG slices): the engine counters
    # DCGM reads for these fields on Hopper. Help texts and units from dcgm-exporter's
    # etc/dcp-metrics-included.csv: ratios 0-1, PCIe/NVLink in bytes per second (gauges).
    _field("DCGM_FI_PROF_GR_ENGINE_ACTIVE", G, "Ratio of time the graphics engine is active.",
           "hw.gpu.graphics.activity"),
    _field("DCGM_FI_PROF_SM_ACTIVE", G, "The ratio of cycles an SM has at least 1 warp "
           "assigned (computed from the number of cycles and elapsed cycles)",
           "hw.gpu.sm.activity"),
    _field("DCGM_FI_PROF_SM_OCCUPANCY", G, "The ratio of number of warps resident on an SM.",
           "hw.gpu.sm.occupancy"),
    _field("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", G, "Ratio of cycles the tensor (HMMA) pipe is "
           "active.", "hw.gpu.tensor.activity"),
    _field("DCGM_FI_PROF_PIPE_FP64_ACTIVE", G, "Ratio of cycles the fp64 pipes are active.",
           "hw.gpu.pipe.activity", (("hw.gpu.pipe", "fp64"),)),
    _field("DCGM_FI_PROF_PIPE_FP32_ACTIVE", G, "Ratio of cycles the fp32 pipes are active.",
           "hw.gpu.pipe.activity", (("hw.gpu.pipe", "fp32"),)),
    _field("DCGM_FI_PROF_PIPE_FP16_ACTIVE", G, "Ratio of cycles the fp16 pipes are active.",
           "hw.gpu.pipe.activity", (("hw.gpu.pipe", "fp16"),)),
    _field("DCGM_FI_PROF_DRAM_ACTIVE", G, "Ratio of cycles the device memory interface is "
           "active sending or receiving data.", "hw.gpu.dram.activity"),
    _field("DCGM_FI_PROF_PCIE_TX_BYTES", G, "The rate of data transmitted over the PCIe bus - "
           "including both protocol headers and data payloads - in bytes per second.",
           "hw.gpu.pcie.throughput", ((_DIR, "transmit"),)),
    _field("DCGM_FI_PROF_PCIE_RX_BYTES", G, "The rate of data received over the PCIe bus - "
           "including both protocol headers and data payloads - in bytes per second.",
           "hw.gpu.pcie.throughput", ((_DIR, "receive"),)),
    # No NVLink line in dcgm-exporter's csv files: help worded as its PCIe ones; a gauge in
    # bytes per second like them (DCGM's PROF byte fields are rates).
    _field("DCGM_FI_PROF_NVLINK_TX_BYTES", G, "The rate of data transmitted over NVLink, in "
           "bytes per second.", "hw.gpu.nvlink.throughput", ((_DIR, "transmit"),)),
    _field("DCGM_FI_PROF_NVLINK_RX_BYTES", G, "The rate of data received over NVLink, in "
           "bytes per second.", "hw.gpu.nvlink.throughput", ((_DIR, "receive"),)),
)  # fmt: skip

THROTTLE_REASONS = DcgmSpec(
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    G,
    "",
    "Current clock throttle reasons (bitmask of nvmlClocksEventReason*).",
)
THROTTLE_BITS: dict[str, int] = dict(NVML_THROTTLE_REASONS)
"""`nvmlClocksEventReason*` bits by reason (the metric table's): the mask is rebuilt from
the NVML source's `hw.gpu.clock.throttled` samples."""

DEFAULT_COUNTERS = (
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
)  # fmt: skip
"""The counters of dcgm-exporter's `etc/default-counters.csv` (its `--collectors` default), in
the file's order, without its `DCGM_FI_DRIVER_VERSION` label: what a dcgm-exporter user's
dashboards and alerts read (tests/data holds the file; a test checks this against it). Not in
`FIELDS`, so not served: NVLINK_BANDWIDTH_TOTAL (`hw_gpu_nvlink_io_bytes_total` says it per
link) and VGPU_LICENSE_STATUS (vGPU guests)."""


def default_groups() -> frozenset[str]:
    """The metric groups the default counters are made from: with `--metrics.schema=dcgm`,
    each is on unless its `--metrics.group.NAME` says otherwise (cli/flags.py), so the flag
    alone serves dcgm-exporter's default set whatever the native defaults are."""
    return frozenset(
        SPECS[f.metric].group_of(f.match) for f in FIELDS if f.spec.name in DEFAULT_COUNTERS
    )


_BY_METRIC: dict[str, list[Field]] = {}
for _f in FIELDS:
    _BY_METRIC.setdefault(_f.metric, []).append(_f)


def bus_id(address: str) -> str:
    """`0000:18:00.0` -> `00000000:18:00.0`, NVML's `busId` form that dcgm-exporter shows."""
    domain, sep, rest = address.partition(":")
    if not sep:
        return address
    return f"{int(domain, 16):08X}:{rest.upper()}"


def labels(device: Device, parent: Device | None, joined: JoinedDevice, node: str) -> Attributes:
    """dcgm-exporter's GPU label set, in its order; a MIG slice names its parent GPU."""
    attrs = dict(device.attributes)
    gpu = parent or device
    index = attrs.get("hw.gpu.index", "")
    pairs: list[tuple[str, str]] = [
        ("gpu", index),
        ("UUID", gpu.id),
        ("pci_bus_id", bus_id(attrs.get("hw.pci.bus_id", ""))),
        ("device", f"nvidia{index}" if index else ""),
        ("modelName", gpu.model),
    ]
    if parent is not None:
        pairs += [
            ("GPU_I_PROFILE", attrs.get("hw.gpu.mig.profile", "")),
            ("GPU_I_ID", attrs.get("hw.gpu.mig.gpu_instance_id", "")),
        ]
    pairs += [("Hostname", node), ("DCGM_FI_DRIVER_VERSION", attrs.get("hw.driver_version", ""))]
    holder = joined.holder
    if holder is not None:
        pairs += [
            ("pod", holder.pod),
            ("namespace", holder.namespace),
            ("container", holder.container),
        ]
    return tuple((k, v) for k, v in pairs if v)


def dcgm_points(snapshot: Snapshot) -> Iterator[Point]:
    """Every DCGM point of the snapshot's NVIDIA GPUs, grouped by field in table order."""
    nvidia = [j for j in snapshot.devices if j.reading.device.vendor == "nvidia"]
    by_id = {j.reading.device.id: j.reading.device for j in nvidia}
    by_field: dict[str, list[Point]] = {f.spec.name: [] for f in FIELDS}
    throttle: list[Point] = []
    for joined in nvidia:
        device = joined.reading.device
        parent = by_id.get(device.parent) if device.parent else None
        if device.parent and parent is None:
            continue  # a slice whose GPU is not in this snapshot has no `gpu`/`UUID`
        attrs = labels(device, parent, joined, snapshot.node)
        mask, reasons = 0, 0
        for sample in joined.reading.samples:
            if sample.metric == "hw.gpu.clock.throttled":
                reason = dict(sample.attributes).get("hw.gpu.clock.throttle_reason", "")
                reasons += reason in THROTTLE_BITS
                mask |= THROTTLE_BITS.get(reason, 0) if sample.value else 0
                continue
            for f in _BY_METRIC.get(sample.metric, ()):
                if f.mig is not None and f.mig != (parent is not None):
                    continue
                if all(a in sample.attributes for a in f.match):
                    by_field[f.spec.name].append(Point(f.spec, attrs, sample.value * f.scale))
        if reasons:
            throttle.append(Point(THROTTLE_REASONS, attrs, float(mask)))
    for f in FIELDS:
        yield from by_field[f.spec.name]
    yield from throttle
