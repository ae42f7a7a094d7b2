"""--metrics.schema=dcgm: dcgm-exporter's names, units, types and labels from one snapshot."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families as parse_text

from exporter.cli.flags import parse_config
from exporter.cli.parser import UsageError
from exporter.metrics import THROTTLE_REASONS
from exporter.model import Device, DeviceReading, Holder, JoinedDevice, Sample, Snapshot
from exporter.sinks.dcgm import FIELDS, THROTTLE_BITS, bus_id
from exporter.sinks.dcgm import THROTTLE_REASONS as DCGM_THROTTLE
from exporter.sinks.prometheus import Renderer, reference, render

GIB = 1024.0**3
IDENTITY = (
    ("hw.gpu.index", "3"),
    ("hw.gpu.minor", "3"),
    ("hw.pci.bus_id", "0000:8d:00.0"),
    ("hw.driver_version", "580.95.05"),
)


def gpu(holder: Holder | None = None) -> JoinedDevice:
    device = Device("GPU-aaaa", "gpu", "nvidia", "NVIDIA H100 80GB HBM3", "nvml",
                    attributes=(*IDENTITY, ("hw.serial_number", "165")))  # fmt: skip
    samples = (
        Sample("hw.gpu.utilization", 0.42, (("hw.gpu.task", "general"),)),
        Sample("hw.gpu.memory.usage", 10 * GIB),
        Sample("hw.gpu.memory.free", 70 * GIB),
        Sample("hw.gpu.clock", 1.98e9, (("hw.gpu.clock.type", "sm"),)),
        Sample("hw.power", 512.5),
        Sample("hw.energy", 1234.5),
        Sample("hw.temperature", 66.0, (("hw.sensor_location", "gpu"),)),
        Sample("hw.errors", 3.0, (("error.type", "pcie_replay"),)),
        Sample("hw.gpu.clock.throttled", 1.0, (("hw.gpu.clock.throttle_reason", "sw_power_cap"),)),
        Sample("hw.gpu.clock.throttled", 1.0, (("hw.gpu.clock.throttle_reason", "hw_slowdown"),)),
        Sample("hw.gpu.clock.throttled", 0.0, (("hw.gpu.clock.throttle_reason", "gpu_idle"),)),
    )
    return JoinedDevice(DeviceReading(device, samples), holder, 1 if holder else 0, True)


def mig(parent: JoinedDevice, holder: Holder) -> JoinedDevice:
    device = Device(
        "MIG-bbbb", "gpu", "nvidia", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", "nvml",
        parent=parent.reading.device.id,
        attributes=(*IDENTITY, ("hw.gpu.mig.profile", "1g.10gb"),
                    ("hw.gpu.mig.gpu_instance_id", "9"), ("hw.gpu.mig.compute_instance_id", "0")),
    )  # fmt: skip
    samples = (
        # GPM's GRAPHICS_UTIL, as the NVML source reads it on a slice (twice: NVML has no
        # utilization under MIG, so it is the slice's hw.gpu.utilization too)
        Sample("hw.gpu.utilization", 0.25, (("hw.gpu.task", "general"),)),
        Sample("hw.gpu.graphics.activity", 0.25),
        Sample("hw.gpu.memory.usage", 2 * GIB),
    )
    return JoinedDevice(DeviceReading(device, samples), holder, 1, True)


def snapshot(*devices: JoinedDevice) -> Snapshot:
    return Snapshot(timestamp=1.8e9, node="node-7", devices=devices)


def series(body: bytes, *, om: bool = False) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> (labels, value), names as Prometheus stores them: prometheus_client's
    text parser would append `_total` to a counter sample that lacks it, Prometheus does not."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in (parse_om if om else parse_text)(body.decode()):
        for s in family.samples:
            name = s.name
            if not om and family.type == "counter" and name.startswith("DCGM_"):
                name = name.removesuffix("_total")
            out.setdefault(name, []).append((s.labels, s.value))
    return out


def test_fields_carry_dcgm_units_and_labels() -> None:
    got = series(render(snapshot(gpu(Holder("ml", "trainer-0", "pytorch"))), ("dcgm",)).text)
    labels = {
        "gpu": "3",
        "UUID": "GPU-aaaa",
        "pci_bus_id": "00000000:8D:00.0",
        "device": "nvidia3",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": "node-7",
        "DCGM_FI_DRIVER_VERSION": "580.95.05",
        "pod": "trainer-0",
        "namespace": "ml",
        "container": "pytorch",
    }
    dcgm = {name: one for name, one in got.items() if name.startswith("DCGM_")}
    values = {name: v for name, ((_, v),) in dcgm.items()}
    assert all(lbl == labels for ((lbl, _),) in dcgm.values())
    assert values == {
        "DCGM_FI_DEV_GPU_UTIL": 42.0,  # percent
        "DCGM_FI_DEV_FB_USED": 10240.0,  # MiB
        "DCGM_FI_DEV_FB_FREE": 71680.0,
        "DCGM_FI_DEV_SM_CLOCK": 1980.0,  # MHz
        "DCGM_FI_DEV_POWER_USAGE": 512.5,  # W
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 1234500.0,  # mJ, no _total
        "DCGM_FI_DEV_GPU_TEMP": 66.0,
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 3.0,
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 0x4 | 0x8,
    }
    assert "hw_gpu_utilization_ratio" not in got  # dcgm alone: no native device series
    assert "kube_device_exporter_cycles_total" in got  # the exporter's own health stays


def test_mig_slice_names_its_parent_and_profile() -> None:
    parent = gpu()
    got = series(
        render(snapshot(parent, mig(parent, Holder("ml", "nb", "jupyter"))), ("dcgm",)).text
    )
    (slice_fb,) = [lbl for lbl, _ in got["DCGM_FI_DEV_FB_USED"] if "GPU_I_ID" in lbl]
    assert slice_fb["UUID"] == "GPU-aaaa"  # the parent's, as dcgm-exporter
    assert slice_fb["modelName"] == "NVIDIA H100 80GB HBM3"
    assert (slice_fb["gpu"], slice_fb["GPU_I_PROFILE"], slice_fb["GPU_I_ID"]) == (
        "3",
        "1g.10gb",
        "9",
    )
    assert slice_fb["pod"] == "nb"
    # NVML has no per-slice utilization: the slice's GPM GRAPHICS_UTIL is GR_ENGINE_ACTIVE (0-1),
    # never DCGM_FI_DEV_GPU_UTIL (a whole GPU's NVML utilization, in percent).
    (gpu_util,) = got["DCGM_FI_DEV_GPU_UTIL"]
    assert "GPU_I_ID" not in gpu_util[0]
    ((engine, value),) = got["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]
    assert (engine["GPU_I_ID"], value) == ("9", 0.25)


def test_shared_gpu_has_no_pod_labels() -> None:
    got = series(render(snapshot(gpu(None)), ("dcgm",)).text)
    ((lbl, _),) = got["DCGM_FI_DEV_GPU_UTIL"]
    assert not {"pod", "namespace", "container"} & set(lbl)


def test_both_schemas_at_once_and_series_count() -> None:
    rendered = render(snapshot(gpu(Holder("ml", "p", "c"))), ("native", "dcgm"))
    got = series(rendered.text)
    assert got["hw_gpu_utilization_ratio"][0][1] == 0.42
    assert got["DCGM_FI_DEV_GPU_UTIL"][0][1] == 42.0
    (count,) = got["kube_device_exporter_series"]
    assert count[1] == rendered.series == sum(len(v) for v in got.values())


def test_bytes_match_the_prometheus_client_reference() -> None:
    snap = snapshot(gpu(Holder("ml", "p", "c")))
    rendered = Renderer(schema=("native", "dcgm")).render(snap)
    text, openmetrics = reference(snap, ("native", "dcgm"))
    # OpenMetrics keeps the DCGM counter's name (no `_total`), typed unknown: byte-identical.
    assert rendered.openmetrics == openmetrics
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" in series(rendered.openmetrics, om=True)
    assert b"# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION unknown\n" in rendered.openmetrics
    # The classic format types it counter under its own name, as dcgm-exporter; the
    # reference cannot write that (it names every counter family `..._total`): same samples.
    assert b"# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n" in rendered.text
    assert b"\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" in rendered.text
    assert series(rendered.text) == series(text)


def test_throttle_bits_are_nvmls_clock_event_reasons() -> None:
    """The metric table's bits (read by the NVML source and this sink) are the binding's
    `nvmlClocksEventReason*` constants, one reason each, together NVML's whole mask."""
    import pynvml

    for reason, bit in THROTTLE_REASONS:
        camel = "".join(
            part.capitalize() for part in reason.split("_")
        )  # sw_power_cap -> SwPowerCap
        assert getattr(pynvml, f"nvmlClocksEventReason{camel}") == bit, reason
    assert dict(THROTTLE_REASONS) == THROTTLE_BITS
    mask = 0
    for _, bit in THROTTLE_REASONS:
        mask |= bit
    assert mask == pynvml.nvmlClocksEventReasonAll


def test_bus_id_is_nvmls_form() -> None:
    assert bus_id("0000:8d:00.0") == "00000000:8D:00.0"
    assert bus_id("0001:1a:00.1") == "00000001:1A:00.1"


def test_flag_and_variable() -> None:
    assert parse_config([], env={}).metrics_schema == ("native",)
    assert parse_config(["--metrics.schema=native,dcgm"], env={}).metrics_schema == (
        "native",
        "dcgm",
    )
    assert parse_config([], env={"KDE_METRICS_SCHEMA": "dcgm"}).metrics_schema == ("dcgm",)
    with pytest.raises(UsageError, match=r"KDE_METRICS_SCHEMA.*native, dcgm"):
        parse_config([], env={"KDE_METRICS_SCHEMA": "dcgm,dcgm"})


DEFAULT_COUNTERS = [
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
]
"""The metrics of dcgm-exporter's etc/default-counters.csv (NVIDIA/dcgm-exporter e61056b,
release 4.5.2-4.8.1 on), without its DCGM_FI_DRIVER_VERSION label."""


def test_readme_comparison_says_exactly_what_the_dcgm_schema_serves() -> None:
    """README's 'Its names' row: the default counters served, the two not served, the opt-in
    ones served; each list equal to the sink's table (exporter/sinks/dcgm.py)."""
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    (row,) = [line for line in readme.splitlines() if line.startswith("| Its names |")]
    served_part, rest = row.split("**not**", 1)
    not_part, opt_in_part = rest.split("Opt-in there, served here:", 1)
    names = re.compile(r"`(DCGM_FI_(?:DEV|PROF)_[A-Z0-9_]+)`")
    served = {f.spec.name for f in FIELDS} | {DCGM_THROTTLE.name}
    assert set(names.findall(served_part)) == served & set(DEFAULT_COUNTERS)
    assert set(names.findall(not_part)) == set(DEFAULT_COUNTERS) - served
    opt_in = set(names.findall(opt_in_part.split("only where NVML has GPM")[0]))
    assert opt_in == served - set(DEFAULT_COUNTERS)
