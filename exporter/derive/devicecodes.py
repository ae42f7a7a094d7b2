"""What device error codes mean: XIDs by class, and the other events the exporter reports.

One table for the alert rules (monitoring/alerts.py takes its XID classes from here), the
OTLP log records and the Kubernetes Events of device events (exporter/derive/events.py). XID
meanings are NVIDIA's (the XID catalog, docs.nvidia.com/deploy/xid-errors); the classes say
who acts: `hardware` (reset or service the GPU now), `driver` (the driver, its firmware or
the GPU's micro-controllers; usually a reset, repeated ones a driver update), `application`
(usually the program's own fault: its owner reads its logs).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class Severity(IntEnum):
    """OpenTelemetry log SeverityNumber (logs data model): the first of each range."""

    INFO = 9
    WARN = 13
    ERROR = 17
    FATAL = 21


CLASS_SEVERITY = {
    "hardware": Severity.ERROR,
    "driver": Severity.WARN,
    "application": Severity.INFO,
    "network": Severity.WARN,
    "unknown": Severity.WARN,
}


@dataclass(frozen=True, slots=True)
class Code:
    """One kind of device event: its class, what it is, and what it usually means."""

    klass: str
    title: str
    meaning: str

    @property
    def severity(self) -> Severity:
        return CLASS_SEVERITY[self.klass]


XIDS: dict[int, Code] = {
    13: Code("application", "Graphics engine exception", "usually a bug in the program "
             "(an illegal address, an out-of-range access); its own logs say which"),
    31: Code("application", "GPU memory page fault", "usually the program accessed memory "
             "it does not own; a driver bug less often"),
    43: Code("application", "GPU stopped processing", "the program's channel was stopped "
             "after an error in it; other programs on the GPU go on"),
    45: Code("application", "Preemptive cleanup", "the driver cleaned up after an earlier "
             "error (the program ended or was killed)"),
    32: Code("driver", "Invalid or corrupted push buffer stream", "the command stream to "
             "the GPU was corrupted (driver, PCIe, or memory); the GPU may need a reset"),
    38: Code("driver", "Driver firmware error", "the driver's firmware failed; the GPU "
             "usually needs a reset"),
    62: Code("driver", "Internal micro-controller halt", "a micro-controller of the GPU "
             "halted; the GPU needs a reset"),
    109: Code("driver", "Context switch timeout", "the GPU did not switch between programs "
              "in time; the GPU may need a reset"),
    119: Code("driver", "GSP RPC timeout", "the GPU System Processor did not answer the "
              "driver; the GPU needs a reset, repeated ones a driver update"),
    120: Code("driver", "GSP error", "the GPU System Processor failed; the GPU needs a "
              "reset"),
    48: Code("hardware", "Double-bit ECC error", "device memory returned corrupted data; "
             "programs on the GPU are ended and the GPU needs a reset"),
    64: Code("hardware", "Row-remapper failure", "a failing memory row could not be "
             "remapped; the GPU needs service"),
    74: Code("hardware", "NVLink error", "an NVLink failed; jobs across the GPUs it joins "
             "fail or slow down, the GPU needs a reset"),
    79: Code("hardware", "GPU has fallen off the bus", "the GPU no longer answers on PCIe; "
             "every program on it fails and the node needs a reboot or service"),
    95: Code("hardware", "Uncontained ECC error", "device memory corruption that could not "
             "be confined to one program; every program on the GPU is ended, reset needed"),
}  # fmt: skip

EVENTS: dict[str, Code] = {
    "ecc_uncorrected": Code(
        "hardware",
        "Uncorrectable ECC error",
        "device memory returned data it could not correct; the program that read it is "
        "usually ended, and the GPU needs a reset to remap the row",
    ),
    "gpu_failed": Code(
        "hardware",
        "Device failed",
        "the device no longer answers its driver (lost, fallen off the bus); every "
        "program on it has failed",
    ),
    "row_remap_failed": Code(
        "hardware",
        "Row remapping failed",
        "the GPU ran out of spare memory rows; it needs service",
    ),
    "link_down": Code(
        "network",
        "Network link down",
        "the port's link went down (cable, transceiver, switch port); RDMA and network "
        "traffic on it stopped or failed over",
    ),
}
"""Device events other than XIDs, by the code the event carries."""


def xid_code(xid: int) -> Code:
    return XIDS.get(xid) or Code(
        "unknown", f"XID {xid}", "not in the exporter's table; see NVIDIA's XID catalog"
    )


def xids_of(klass: str) -> tuple[str, ...]:
    """The XIDs of one class as strings, in the table's order (the alert rules' regexes)."""
    return tuple(str(x) for x, code in XIDS.items() if code.klass == klass)
