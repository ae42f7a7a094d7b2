"""XID errors: the NVML event set, emptied by each collect(), counts each event once."""

from __future__ import annotations

import ctypes
import logging
from collections import Counter
from collections.abc import Iterable
from typing import Any

import pynvml

from exporter.sources.nvml.calls import Calls, DriverGone
from exporter.sources.nvml.discovery import Gpu

NO_INSTANCE = 0xFFFFFFFF
_SUCCESS, _TIMEOUT = pynvml.NVML_SUCCESS, pynvml.NVML_ERROR_TIMEOUT
_NO_WAIT = ctypes.c_uint(0)
"""The wait's timeout: none (events queue in the set between cycles)."""


def handle_address(handle: Any) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


def handle_key(gpus: Iterable[Gpu]) -> frozenset[tuple[int, str]]:
    return frozenset((handle_address(g.handle), g.device.id) for g in gpus)


class XidCounts:
    """XID events per (device id, xid), filled and read by collect()."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[str, int]] = Counter()
        self._last: dict[str, tuple[int, int]] = {}
        """Per device: (arrival number, XID) of its latest event."""
        self._arrived = 0

    def add(self, device_id: str, xid: int) -> None:
        self._counts[(device_id, xid)] += 1
        self._arrived += 1
        self._last[device_id] = (self._arrived, xid)

    def snapshot(self) -> dict[tuple[str, int], int]:
        return dict(self._counts)

    def snapshot_with_latest(
        self,
    ) -> tuple[dict[tuple[str, int], int], dict[str, tuple[int, int]]]:
        """The counts, and per device (arrival number, XID) of its latest event, at one
        moment (a cycle's counts and last XIDs agree)."""
        return dict(self._counts), dict(self._last)


def last_xid(latest: dict[str, tuple[int, int]], device_ids: Iterable[str]) -> int:
    """The XID of the latest event on any of these devices; 0 before any (as dcgm-exporter's
    DCGM_FI_DEV_XID_ERRORS reads on a GPU that had none)."""
    events = [latest[d] for d in device_ids if d in latest]
    return max(events)[1] if events else 0


class XidEvents:
    """The NVML event set the GPUs' XID events queue in, emptied at the start of each
    collect() (no thread of its own).

    An event set keeps what arrives between waits: nvml.h's nvmlEventSetWait_v2 "returns
    immediately" when "some events are ready to be delivered at the time of the call", and
    the kernel module queues each event with its data on the open file (`nv_post_event`,
    kernel-open/nvidia/nv.c: a list with no bound). So a wait with a zero timeout, repeated
    until it times out, takes every event since the last cycle, each once, in the thread
    that collects anyway: the counts reach the snapshot exactly when a waiting thread's
    would (the next cycle), without a thread that wakes every second (or at every event)
    for nothing. A wait that hangs (a driver in trouble) hangs collect(), which the poller
    isolates like any other NVML call."""

    MAX_PER_CYCLE = 4096
    """Events taken per cycle at most: an XID storm cannot stretch one cycle without bound;
    the rest stay queued for the next."""

    def __init__(
        self,
        event_set: Any,
        gpus: list[Gpu],
        counts: XidCounts,
        calls: Calls,
        logger: logging.Logger,
    ) -> None:
        self.counts = counts
        self.log = logger
        self.handles = handle_key(gpus)
        self._gpus = {handle_address(g.handle): g for g in gpus}
        self._set = event_set
        self._failing = ""
        self._wait: Any = None
        """nvmlEventSetWait_v2, looked up through the binding at the first drain."""
        self._data = pynvml.c_nvmlEventData_t()
        self._data_ref = ctypes.byref(self._data)
        # Registered on the collecting thread at discovery: events from the moment
        # discovery returns are in the set, none is lost.
        try:
            for gpu in gpus:
                self._register(gpu, calls)
        except DriverGone:
            self.close()
            raise

    def _register(self, gpu: Gpu, calls: Calls) -> None:
        try:
            pynvml.nvmlDeviceRegisterEvents(
                gpu.handle, pynvml.nvmlEventTypeXidCriticalError, self._set
            )
        except pynvml.NVMLError as exc:
            if exc.value != pynvml.NVML_ERROR_GPU_IS_LOST:  # a lost GPU sends no events
                calls.interpret(exc, "nvmlDeviceRegisterEvents")

    def update(self, gpus: list[Gpu]) -> None:
        """A new MIG layout on the same GPUs: events now count on the new slices."""
        self._gpus = {handle_address(g.handle): g for g in gpus}

    def drain(self) -> int:
        """Count every event queued since the last call; how many were taken. A failing
        wait is logged once per kind of failure (the readings say more) and ends the drain.

        The wait is the C function, called with its arguments made once, and its return
        code compared: a timeout (nothing queued, every cycle but the few with an event)
        ends the drain without the binding's exception; any other code is the error the
        binding would raise."""
        taken = 0
        data = self._data
        while taken < self.MAX_PER_CYCLE:
            try:
                wait = self._wait or self._resolve()
            except pynvml.NVMLError as exc:
                self._failed(exc)
                return taken
            ret = wait(self._set, self._data_ref, _NO_WAIT)
            if ret == _TIMEOUT:
                break
            if ret != _SUCCESS:
                self._failed(pynvml.NVMLError(ret))
                return taken
            taken += 1
            device_id = self._device_id(data)
            if device_id and data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                self.counts.add(device_id, int(data.eventData))
        self._failing = ""
        return taken

    def _resolve(self) -> Any:
        self._wait = pynvml._nvmlGetFunctionPointer("nvmlEventSetWait_v2")
        return self._wait

    def _failed(self, exc: pynvml.NVMLError) -> None:
        if str(exc) != self._failing:
            self._failing = str(exc)
            self.log.warning("reading XID events failed: %s", exc)

    def close(self) -> None:
        try:
            pynvml.nvmlEventSetFree(self._set)
        except pynvml.NVMLError as exc:
            self.log.debug("nvmlEventSetFree: %s", exc)

    def _device_id(self, data: Any) -> str:
        """The MIG slice the event names when it names one, else the GPU."""
        gpu = self._gpus.get(handle_address(data.device))
        if gpu is None:
            return ""
        for mig in gpu.migs:
            if mig.gi == data.gpuInstanceId and data.computeInstanceId in (mig.ci, NO_INSTANCE):
                return mig.device.id
        return gpu.device.id
