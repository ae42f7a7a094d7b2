"""The one place NVML errors are interpreted (see behaviour.py for why each code means
what it means here)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import pynvml

from exporter.sources.nvml.behaviour import MISSING, NOT_HERE, REINIT, STALE_HANDLE


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used this cycle (no driver, driver reloaded); retried next cycle."""


class GpuLost(Exception):
    """GPU_IS_LOST: that GPU fails, the others go on."""


class DriverGone(Exception):
    """UNINITIALIZED, DRIVER_NOT_LOADED, LIB_RM_VERSION_MISMATCH: shut down, init again."""


class Calls:
    """Calls NVML and turns its return codes into values, None, or one of the above."""

    def __init__(self, logger: logging.Logger) -> None:
        self.log = logger
        self.errors = 0
        """Field errors this cycle."""
        self.stale = False
        """A known handle answered INVALID_ARGUMENT/NOT_FOUND this cycle: rediscover."""
        self.missing: set[str] = set()
        """NVML functions this library lacks (logged once)."""
        self.forbidden: set[str] = set()
        """NVML functions this pod may not call (NO_PERMISSION; logged once)."""

    def get(
        self,
        fn: Callable[..., Any],
        *args: Any,
        quiet: Iterable[int] = (),
        name: str = "",
        handle: bool = False,
    ) -> Any:
        """fn(*args), or None when the value does not exist here (NOT_SUPPORTED, function
        missing, no permission, a code in `quiet`) or could not be read (a field error).
        `name` is the NVML function, where it is not the wrapper's name; `handle` marks a
        call on a handle from discovery, whose INVALID_ARGUMENT/NOT_FOUND means stale."""
        name = name or fn.__name__
        if name in self.missing or name in self.forbidden:
            return None
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            if handle and exc.value in STALE_HANDLE:
                self.stale = True
            self.interpret(exc, name, quiet)
            return None

    def newest(self, calls: tuple[tuple[str, Callable[..., Any]], ...], *args: Any) -> Any:
        """call(*args) of the first (NVML function, call) this driver has: newer functions
        first, older drivers fall through to the older ones."""
        for name, call in calls:
            value = self.get(call, *args, name=name)
            if name not in self.missing:
                return value
        return None

    def interpret(self, exc: pynvml.NVMLError, what: str, quiet: Iterable[int] = ()) -> None:
        code = exc.value
        if code == pynvml.NVML_ERROR_GPU_IS_LOST:
            raise GpuLost(what) from exc
        if code in REINIT:
            raise DriverGone(f"{what}: {exc}") from exc
        if code in MISSING and what not in self.missing:
            self.missing.add(what)
            self.log.info("NVML here has no %s (an older driver): not calling it again", what)
        if code == pynvml.NVML_ERROR_NO_PERMISSION:
            if what not in self.forbidden:
                self.forbidden.add(what)
                self.log.info(
                    "NVML denies %s to this pod (NO_PERMISSION: it needs privileges the "
                    "DaemonSet does not grant); that data is not exported",
                    what,
                )
            return
        if code not in NOT_HERE and code not in quiet:
            self.errors += 1
            self.log.debug("%s failed: %s", what, exc)


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
