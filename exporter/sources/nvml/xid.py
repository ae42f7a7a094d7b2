"""XID errors: a thread blocked in nvmlEventSetWait_v2 counts each event once."""

from __future__ import annotations

import ctypes
import logging
import threading
from collections import Counter
from collections.abc import Iterable
from typing import Any

import pynvml

from exporter.sources.nvml.calls import Calls, DriverGone
from exporter.sources.nvml.discovery import Gpu
from exporter.threads import Thread

NO_INSTANCE = 0xFFFFFFFF


def handle_address(handle: Any) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


def handle_key(gpus: Iterable[Gpu]) -> frozenset[tuple[int, str]]:
    return frozenset((handle_address(g.handle), g.device.id) for g in gpus)


class XidCounts:
    """XID events per (device id, xid), filled by the event thread, read by collect()."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[str, int]] = Counter()
        self._last: dict[str, tuple[int, int]] = {}
        """Per device: (arrival number, XID) of its latest event."""
        self._arrived = 0
        self._lock = threading.Lock()

    def add(self, device_id: str, xid: int) -> None:
        with self._lock:
            self._counts[(device_id, xid)] += 1
            self._arrived += 1
            self._last[device_id] = (self._arrived, xid)

    def snapshot(self) -> dict[tuple[str, int], int]:
        with self._lock:
            return dict(self._counts)

    def snapshot_with_latest(
        self,
    ) -> tuple[dict[tuple[str, int], int], dict[str, tuple[int, int]]]:
        """The counts, and per device (arrival number, XID) of its latest event, at one
        moment (a cycle's counts and last XIDs agree)."""
        with self._lock:
            return dict(self._counts), dict(self._last)


def last_xid(latest: dict[str, tuple[int, int]], device_ids: Iterable[str]) -> int:
    """The XID of the latest event on any of these devices; 0 before any (as dcgm-exporter's
    DCGM_FI_DEV_XID_ERRORS reads on a GPU that had none)."""
    events = [latest[d] for d in device_ids if d in latest]
    return max(events)[1] if events else 0


class XidWatcher:
    """A thread blocked in nvmlEventSetWait_v2, counting each XID event once."""

    WAIT_MS = 1000
    """Each wait that times out wakes the thread for nothing, so the wait is long (what a
    shorter one cost: docs/design-figures.md). The price is stop(): it waits for the wait
    in progress, up to this long (the device plugin's own loop waits 5 s)."""

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
        self._stop = threading.Event()
        self._gpus = {handle_address(g.handle): g for g in gpus}
        # Registration happens here, on the collecting thread: events from the moment
        # discovery returns are in the set, none is lost to thread start-up.
        self._set = event_set
        try:
            for gpu in gpus:
                self._register(gpu, calls)
        except DriverGone:
            self._free()
            raise
        self._thread = Thread(self._run, "nvml-xid-events")
        self._thread.start()

    def _register(self, gpu: Gpu, calls: Calls) -> None:
        try:
            pynvml.nvmlDeviceRegisterEvents(
                gpu.handle, pynvml.nvmlEventTypeXidCriticalError, self._set
            )
        except pynvml.NVMLError as exc:
            if exc.value != pynvml.NVML_ERROR_GPU_IS_LOST:  # a lost GPU sends no events
                calls.interpret(exc, "nvmlDeviceRegisterEvents")

    def _free(self) -> None:
        try:
            pynvml.nvmlEventSetFree(self._set)
        except pynvml.NVMLError as exc:
            self.log.debug("nvmlEventSetFree: %s", exc)

    def update(self, gpus: list[Gpu]) -> None:
        self._gpus = {handle_address(g.handle): g for g in gpus}  # one atomic swap

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        failing = ""
        try:
            while not self._stop.is_set():
                try:
                    data = pynvml.nvmlEventSetWait_v2(self._set, self.WAIT_MS)
                except pynvml.NVMLError_Timeout:
                    continue
                except pynvml.NVMLError as exc:
                    if str(exc) != failing:
                        failing = str(exc)
                        self.log.warning("waiting for XID events failed: %s", exc)
                    self._stop.wait(1.0)
                    continue
                failing = ""
                device_id = self._device_id(data)
                if device_id and data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                    self.counts.add(device_id, int(data.eventData))
        finally:
            self._free()

    def _device_id(self, data: Any) -> str:
        """The MIG slice the event names when it names one, else the GPU."""
        gpu = self._gpus.get(handle_address(data.device))
        if gpu is None:
            return ""
        for mig in gpu.migs:
            if mig.gi == data.gpuInstanceId and data.computeInstanceId in (mig.ci, NO_INSTANCE):
                return mig.device.id
        return gpu.device.id
