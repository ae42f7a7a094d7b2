"""The NVML stand-in (simulator's libnvidia-ml.so.1) showing the devices our
device plugin advertises, with real host PIDs of real containers as its processes.

The exporter process loads the stand-in through `LD_LIBRARY_PATH` and reads the state
file named by `KDE_FAKENVML_STATE` (simulator/nvml.py); `show()` rewrites that
file, so a test changes what "the driver" reports while the exporter runs. With
`pid_namespace: host` the stand-in lists processes as a driver does for a DaemonSet with
hostPID: host PIDs, which the exporter resolves through the host's /proc and cgroups.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from simulator.nvml import NvmlPart, library_path
from simulator.nvml_scenario import parse_nvidia

GIB = 1 << 30


def nvidia_section(
    gpus: Sequence[str],
    mig_parent: str,
    migs: Sequence[str | Mapping[str, Any]],
    processes: Mapping[str, Sequence[int]],
) -> dict[str, Any]:
    """A scenario `nvidia:` section: `gpus` whole GPUs, `mig_parent` split into `migs`
    (a UUID: a 1g.10gb slice; a mapping: a scenario `mig:` entry, e.g. one a DRA driver made
    at prepare with its profile, GPU instance and placement), and on each device ID of
    `processes` those PIDs, each using 1 GiB and keeping the device half busy."""

    def procs(device: str) -> list[dict[str, Any]]:
        return [
            {"pid": pid, "memory": GIB, "utilization": 0.5} for pid in processes.get(device, ())
        ]

    entries: list[dict[str, Any]] = [
        {"uuid": uuid, "pci_bus_id": f"0000:{0x10 + i:02x}:00.0", "processes": procs(uuid)}
        for i, uuid in enumerate(gpus)
    ]
    entries.append(
        {
            "uuid": mig_parent,
            "pci_bus_id": f"0000:{0x10 + len(gpus):02x}:00.0",
            "mig_mode": True,
            "mig": [
                {**m, "processes": procs(str(m["uuid"]))}
                if isinstance(m, Mapping)
                else {"uuid": m, "profile": "1g.10gb", "gi": 7 + i, "processes": procs(m)}
                for i, m in enumerate(migs)
            ],
        }
    )
    return {"driver_version": "580.95.05", "pid_namespace": "host", "gpus": entries}


class StandInNvml:
    def __init__(
        self,
        workdir: Path,
        gpus: Sequence[str],
        mig_parent: str,
        migs: Sequence[str | Mapping[str, Any]],
    ) -> None:
        library_path()  # FakeNvmlNotBuilt says how to build it
        self.devices = (tuple(gpus), mig_parent, tuple(migs))
        self.processes: Mapping[str, Sequence[int]] = {}
        self.t = 0.0
        self.part = NvmlPart(parse_nvidia(nvidia_section(*self.devices, {})), workdir)
        self.part.advance(0.0)

    def env(self) -> dict[str, str]:
        return self.part.env()

    def show(self, processes: Mapping[str, Sequence[int]], t: float = 1.0) -> None:
        """Report `processes` (device ID -> host PIDs) from now on."""
        self.processes = processes
        self.t = t
        self.part.spec = parse_nvidia(nvidia_section(*self.devices, processes))
        self.part.advance(t)

    def set_migs(self, migs: Sequence[str | Mapping[str, Any]]) -> None:
        """The MIG parent's slices from now on (a DRA driver made or destroyed one)."""
        self.devices = (self.devices[0], self.devices[1], tuple(migs))
        self.show(self.processes, self.t + 1.0)

    def close(self) -> None:
        self.part.close()
