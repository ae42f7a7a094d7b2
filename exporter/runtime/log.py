"""Logging: text or JSON lines, and a logger that speaks once per state change."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


class StateLog:
    """Log a thing's state only when it changes (errors are values, not log floods)."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self._states: dict[str, str] = {}

    def ok(self, key: str, message: str) -> None:
        if self._states.get(key, "ok") != "ok":
            self.logger.info("%s", message)
        self._states[key] = "ok"

    def failed(self, key: str, message: str, *, trace: BaseException | None = None) -> None:
        """Warn of `message` when `key` was not failing already; `trace`: with its traceback."""
        if key not in self._states or self._states[key] == "ok":
            self.logger.warning("%s", message, exc_info=trace)
        self._states[key] = message

    def ok_all(self, prefix: str, message: str) -> None:
        """Clear every failed state under `prefix` (e.g. all kubelet error codes) at once."""
        failed = [k for k, v in self._states.items() if k.startswith(prefix) and v != "ok"]
        if failed:
            self.logger.info("%s", message)
        for key in failed:
            self._states[key] = "ok"
