"""Whose processes use a device, each cycle: NVML's process lists and utilization samples.

Memory from the compute, graphics and MPS-client lists (nvml.h: "processes with a
Multi-Process Service (MPS) compute context"), which show only processes of the caller's
PID namespace (docs/nvml.md, measured: a pod without hostPID sees none); utilization, for
a whole GPU and never under MIG, from the driver's samples, which carry host PIDs whatever
the caller's namespace.
"""

from __future__ import annotations

from typing import Any

import pynvml

from exporter.model import ProcessUsage
from exporter.sources.nvml.calls import Calls
from exporter.sources.nvml.direct import Direct
from exporter.sources.nvml.discovery import Gpu

PROCESS_LISTS = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
)
"""Compute first: it is read every cycle, the other two while they list anyone."""
_COMPUTE_ONLY: tuple[str, ...] = PROCESS_LISTS[:1]
_NONE_LISTED: frozenset[str] = frozenset()


class ProcessLists:
    """The process lists each device listed a process in at its last read, and the last
    utilization samples per GPU (between slow reads)."""

    def __init__(self, calls: Calls, direct: Direct) -> None:
        self.calls = calls
        self.direct = direct
        self._busy: dict[str, dict[int, float] | None] = {}
        """The last per-process utilization read per GPU (between slow reads)."""
        self._lists_used: dict[str, frozenset[str]] = {}
        """Per device, the process lists that listed a process at their last read."""

    def slices(self, gpu: Gpu, out: list[ProcessUsage]) -> None:
        """`read` of every MIG slice of `gpu`, into `out`: a slice whose lists were
        all empty is asked its compute list only, here, and goes no further while it stays
        empty (most slices of most cycles)."""
        slow, used_of, processes = gpu.slow_now, self._lists_used, self.direct.processes
        compute = PROCESS_LISTS[0]
        for mig in gpu.migs:
            device_id, listing = mig.device.id, None
            if not slow and used_of.get(device_id) is _NONE_LISTED:
                listing = processes(compute, mig.handle)
                if not listing:
                    continue
            for pid, memory, util in self.read(
                device_id, mig.handle, None, slow=slow, compute=listing
            ):
                out.append(ProcessUsage(device_id, pid, memory, util))

    def read(
        self,
        device_id: str,
        handle: Any,
        gpu: Gpu | None,
        *,
        slow: bool,
        compute: list[tuple[int, float | None]] | None = None,
    ) -> list[tuple[int, float | None, float | None]]:
        """(host PID, memory bytes, SM utilization) of the processes on a GPU or MIG handle.

        Memory from the compute, graphics and MPS-client lists (nvml.h: "processes with a
        Multi-Process Service (MPS) compute context"), which show only processes of the
        caller's PID namespace (docs/nvml.md, measured: a pod without hostPID sees none);
        utilization, for a whole GPU (`gpu`) and never under MIG, from the driver's
        samples, which carry host PIDs whatever the caller's namespace. A PID only sampled
        has no memory reading (None, not 0).

        The compute list is read every cycle. The graphics and MPS lists, empty on most
        nodes (no graphics under MIG; MPS only where a plugin shares a GPU through it),
        are read every cycle only while they list a process, and otherwise on the slow
        interval: on a dense MIG node that is two calls in three saved, and a graphics or MPS
        process on a device whose list was empty shows within `slow-interval`.
        `compute`: the compute list, when this cycle has read it already."""
        used = self._lists_used.get(device_id)
        names: tuple[str, ...]
        if slow or used is None:  # (and before a device's first read, every list is read)
            names = PROCESS_LISTS
        elif used:
            names = tuple(n for n in PROCESS_LISTS if n == PROCESS_LISTS[0] or n in used)
        else:  # (most devices, most cycles)
            names = _COMPUTE_ONLY
        memory: dict[int, float | None] = {}
        listed = _NONE_LISTED
        for name in names:
            if compute is not None and name == PROCESS_LISTS[0]:
                listing: list[tuple[int, float | None]] | None = compute
            else:
                listing = self.direct.processes(name, handle)
            if listing:
                for pid, used_memory in listing:
                    # A process in several lists has one allocation, not two.
                    memory[pid] = _largest(memory.get(pid), used_memory)
                listed |= {name}
        self._lists_used[device_id] = listed
        if gpu is None and not memory:  # (a MIG slice has no utilization samples)
            return []
        busy: dict[int, float] | None = None
        if gpu is not None:
            if gpu.slow_now or gpu.device.id not in self._busy:
                self._busy[gpu.device.id] = self.utilization(gpu)
            busy = self._busy[gpu.device.id]
        if not memory and not busy:
            return []
        found = []
        for pid in sorted(memory.keys() | (busy or {}).keys()):
            # When the driver returned samples, a listed process without one was idle in
            # those periods (behaviour `process-utilization-samples`): 0, not unknown.
            utilization = None if busy is None else busy.get(pid, 0.0)
            found.append((pid, memory.get(pid), utilization))
        return found

    def utilization(self, gpu: Gpu) -> dict[int, float] | None:
        """Mean SM utilization per PID over the driver's samples since the last cycle;
        None when the driver cannot say."""
        try:
            found = pynvml.nvmlDeviceGetProcessUtilization(gpu.handle, gpu.process_seen_us)
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_NOT_FOUND:
                # No sample since the last read: no period ended, or every process was
                # idle. The driver does not say which, so nothing is reported.
                return None
            self.calls.interpret(exc, "nvmlDeviceGetProcessUtilization")
            return None
        per_pid: dict[int, list[int]] = {}
        for s in found:
            per_pid.setdefault(int(s.pid), []).append(int(s.smUtil))
            gpu.process_seen_us = max(gpu.process_seen_us, int(s.timeStamp))
        return {pid: sum(pcts) / len(pcts) / 100 for pid, pcts in per_pid.items()}


def _largest(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return a if b is None else b
    return max(a, b)
