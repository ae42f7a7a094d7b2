"""XidEvents.drain calls nvmlEventSetWait_v2 itself and compares its return code: a timeout
ends a drain, an event is counted on its device, and any other code is the failure the
binding would raise, logged once per kind of failure. The wait here is a stand-in C function
with the library's arguments, answering the codes under test."""

from __future__ import annotations

import ctypes
import logging
from typing import Any

import pynvml
import pytest

from exporter.model import Device
from exporter.sources.nvml.calls import Calls
from exporter.sources.nvml.discovery import Gpu
from exporter.sources.nvml.xid import XidCounts, XidEvents

HANDLE = 0x1000


class _Wait:
    """nvmlEventSetWait_v2(set, data, timeoutms): answers `codes` in turn, each SUCCESS with
    an XID event on the GPU at HANDLE; TIMEOUT once they are spent."""

    def __init__(self, codes: list[int]) -> None:
        self.codes = codes
        self.calls = 0

    def __call__(self, event_set: Any, data_ref: Any, timeout: ctypes.c_uint) -> int:
        self.calls += 1
        assert timeout.value == 0
        if not self.codes:
            return int(pynvml.NVML_ERROR_TIMEOUT)
        code = self.codes.pop(0)
        if code == pynvml.NVML_SUCCESS:
            data = data_ref._obj
            data.device = ctypes.cast(HANDLE, pynvml.c_nvmlDevice_t)
            data.eventType = pynvml.nvmlEventTypeXidCriticalError
            data.eventData = 79 + self.calls
            data.gpuInstanceId = data.computeInstanceId = 0xFFFFFFFF
        return code


def _events(monkeypatch: pytest.MonkeyPatch, wait: _Wait) -> tuple[XidEvents, XidCounts]:
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", lambda name: wait)
    gpu = Gpu(ctypes.c_void_p(HANDLE), 0, Device("GPU-1", "gpu", "nvidia", "t", "nvml"), False)
    counts = XidCounts()
    log = logging.getLogger("test")
    events = XidEvents(object(), [], counts, Calls(log), log)
    events.update([gpu])
    return events, counts


def test_events_are_counted_until_the_wait_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    success = int(pynvml.NVML_SUCCESS)
    wait = _Wait([success, success])
    events, counts = _events(monkeypatch, wait)
    assert events.drain() == 2
    assert counts.snapshot() == {("GPU-1", 80): 1, ("GPU-1", 81): 1}
    assert wait.calls == 3  # the third timed out
    assert events.drain() == 0


def test_a_failing_wait_ends_the_drain_and_is_logged_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    unknown, success = int(pynvml.NVML_ERROR_UNKNOWN), int(pynvml.NVML_SUCCESS)
    wait = _Wait([success, unknown, unknown, success])
    events, counts = _events(monkeypatch, wait)
    assert events.drain() == 1  # the event before the failure counts; the failure ends it
    assert events.drain() == 0
    assert events.drain() == 1  # working again
    assert sum(counts.snapshot().values()) == 2
    failures = [r.getMessage() for r in caplog.records if "reading XID events" in r.getMessage()]
    assert failures == [f"reading XID events failed: {pynvml.NVMLError(unknown)}"]
