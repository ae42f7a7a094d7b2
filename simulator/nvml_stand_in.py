"""What the NVML stand-in (fakenvml/fakenvml.c) does for each row of the NVML source's
behaviour table (exporter/sources/nvml/behaviour.py), and docs/nvml.md from both.

The notes live with the stand-in, not in the product: a row's rule says what the source
does about a driver behaviour; the note here says how the simulated library makes that
behaviour happen, so the tests see what a driver would do. tests/test_nvml_behaviour.py
checks that every row has a note and runs the stand-in against the rows.

    python -m simulator.nvml_stand_in docs/nvml.md     (make docs) rewrites the generated
    part of docs/nvml.md: everything above its "## Measured on a real driver" section,
    which is written by hand from bench runs on a real GPU.
"""

from __future__ import annotations

import sys
from pathlib import Path

from exporter.sources.nvml.behaviour import TABLE

STAND_IN: dict[str, str] = {
    "init-driver-not-loaded": "No state file, or `loaded 0`: nvmlInit answers DRIVER_NOT_LOADED.",
    "library-not-found": (
        "Raised by nvidia-ml-py itself when dlopen fails; the stand-in is simply not on the path."
    ),
    "init-no-permission": "`init_error 4` makes nvmlInit answer NO_PERMISSION.",
    "rm-version-mismatch": (
        "The library remembers the driver version of its first successful init; a state file "
        "with another `driver` makes nvmlInit and every call answer LIB_RM_VERSION_MISMATCH."
    ),
    "count-is-all-devices": (
        "A GPU with `no_access` is counted but its handle answers NO_PERMISSION."
    ),
    "index-order": "Indices follow the scenario's list.",
    "enumerated-at-init": (
        "The count is taken when the library initializes (refcount 0 -> 1) and stays until "
        "the last nvmlShutdown: a GPU added to the state file later is not counted."
    ),
    "gpu-is-lost": "`lost` on a GPU makes every call on it answer GPU_IS_LOST.",
    "mig-handle-invalid": (
        "A MIG handle names one slice; after the slot is reconfigured it answers INVALID_ARGUMENT."
    ),
    "mig-slot-empty": "Slots without a MIG device answer NOT_FOUND.",
    "gpu-instances-privileged": "Not implemented (a call would fail as a missing symbol).",
    "gpu-instance-by-id-privileged": (
        "A MIG block's `gi` finds its GPU instance; `profile_id`, `placement_start` and "
        "`placement_size` are its info. Unprivileged (`privileged 0`) both calls answer "
        "NO_PERMISSION; a GPU not in MIG mode NOT_SUPPORTED, an unknown ID NOT_FOUND."
    ),
    "mig-aggregate-processes": (
        "Unprivileged (`privileged 0`): a parent GPU handle in MIG mode answers NO_PERMISSION."
    ),
    "process-utilization-samples": (
        "As measured on an H100 (580.159.04): one sample per busy process, the newest, "
        "whatever lastSeenTimeStamp; NOT_FOUND when none is newer. The source averages per "
        "PID all the same, should a driver return several."
    ),
    "process-utilization-mig": "A GPU in MIG mode answers NOT_SUPPORTED.",
    "events-mig-unprivileged": (
        "Unprivileged: events of one GPU/compute instance are not delivered."
    ),
    "events-ready-at-once": (
        "A wait hands over the oldest undelivered event at once, whatever its timeout; with "
        "none, a zero timeout times out at once."
    ),
    "events-from-registration": "A new event set starts after the newest event in the state file.",
    "not-supported": "A key missing from a device block answers NOT_SUPPORTED.",
    "function-not-found": "`missing <function>` answers FUNCTION_NOT_FOUND.",
    "uninitialized": (
        "While the driver is unloaded, or after a reload, old handles answer UNINITIALIZED."
    ),
}
"""Behaviour key -> what the simulated library does for it."""

MEASURED_HEADING = "## Measured on a real driver"
"""Where docs/nvml.md's hand-written part starts."""


def generated() -> str:
    """docs/nvml.md above the measured part: each row, its rule and the stand-in's note."""
    out = [
        "# What the NVML source relies on\n\n",
        "Generated from `exporter/sources/nvml/behaviour.py` and the stand-in's notes\n",
        "(`simulator/nvml_stand_in.py`) by `make docs`; each row quotes `nvml.h` (PyPI\n",
        "`nvidia-nvml-dev`), says what the source does about it and what the simulated\n",
        "library does (tests/test_nvml_behaviour.py checks both). The measured part at the\n",
        "end is written by hand.\n\n",
    ]
    for row in TABLE:
        out.append(f"## `{row.key}`\n\n")
        out.append(f"Functions: {', '.join(f'`{f}`' for f in row.functions)}\n\n")
        out.append(f"> {row.header}\n\n")
        out.append(f"- **Source**: {row.rule}\n- **Stand-in**: {STAND_IN[row.key]}\n\n")
    return "".join(out)


def render(current: str) -> str:
    """`current` (docs/nvml.md) with its generated part made anew, its measured part kept."""
    at = current.find(MEASURED_HEADING)
    if at < 0:
        raise ValueError(f"no {MEASURED_HEADING!r} section: the measured part is missing")
    return generated() + current[at:]


def main(argv: list[str]) -> int:
    (path,) = (Path(a) for a in argv)
    path.write_text(render(path.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
