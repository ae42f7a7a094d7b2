"""What the HTTP server counts, and how it logs what hostile clients do.

Malformed requests, handler errors and accept errors (EMFILE) can come thousands of times a
second: each is counted for the `kube_device_exporter_http_*` self-metrics and logged when a
spell starts and when it has ended, never once per event. aiohttp's per-request error log
goes through the same filter (`request_logger`).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

from aiohttp.http_exceptions import HttpProcessingError

from exporter.model import Sample
from exporter.web.reload import WebConfigWatcher

log = logging.getLogger("exporter.web")


class _Throttled:
    """Something bad that can happen thousands of times a second: counted every time,
    logged when it starts and when it has stopped for `quiet_after` seconds."""

    def __init__(self, what: str, quiet_after: float, clock: Callable[[], float]) -> None:
        self.what = what
        self.quiet_after = quiet_after
        self._clock = clock
        self.total = 0
        self._since_logged = 0
        self._last: float | None = None

    def hit(self, detail: str, exc: BaseException | None = None) -> None:
        """One more; logged (with `exc`'s traceback, if given) only when a spell starts."""
        now = self._clock()
        self.total += 1
        if self._last is None or now - self._last >= self.quiet_after:
            if self._last is not None and self._since_logged:
                log.info("%s: %d more before a quiet spell", self.what, self._since_logged)
            log.warning(
                "%s (first: %s); logged again only after %.0fs without one; counted in "
                "self-metrics",
                self.what,
                detail,
                self.quiet_after,
                exc_info=exc,
            )
            self._since_logged = 0
        else:
            self._since_logged += 1
        self._last = now


class ServerStats:
    """Counts for the self-metrics (read by the poller once per cycle)."""

    def __init__(self, quiet_after: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.closed: Counter[str] = Counter()
        self.open = 0
        self.malformed = _Throttled("malformed HTTP requests", quiet_after, clock)
        self.handler_errors = _Throttled("HTTP handler errors", quiet_after, clock)
        self.accept_errors = _Throttled(
            "accepting connections fails (file descriptors exhausted?)", quiet_after, clock
        )
        self.unauthorized = 0
        self.rate_limited = 0
        self.watcher: WebConfigWatcher | None = None

    def self_samples(self) -> tuple[Sample, ...]:
        out = [Sample("kube_device_exporter.http.connections", float(self.open))]
        for reason in sorted(self.closed):
            out.append(
                Sample(
                    "kube_device_exporter.http.connections.closed",
                    float(self.closed[reason]),
                    (("reason", reason),),
                )
            )
        rejected = (
            ("malformed", self.malformed.total),
            ("unauthorized", self.unauthorized),
            ("rate_limited", self.rate_limited),
        )
        for reason, count in rejected:
            out.append(
                Sample(
                    "kube_device_exporter.http.requests.rejected",
                    float(count),
                    (("reason", reason),),
                )
            )
        out.append(
            Sample("kube_device_exporter.http.accept_errors", float(self.accept_errors.total))
        )
        if self.watcher is not None:
            for result in ("success", "failure"):
                out.append(
                    Sample(
                        "kube_device_exporter.web_config.reloads",
                        float(self.watcher.reloads[result]),
                        (("result", result),),
                    )
                )
            out.append(
                Sample(
                    "kube_device_exporter.web_config.last_reload_successful",
                    float(self.watcher.last_reload_ok),
                )
            )
        return tuple(out)


class _RequestLogFilter(logging.Filter):
    """aiohttp's per-request error log -> one line per state change, and a count."""

    def __init__(self, stats: ServerStats) -> None:
        super().__init__()
        self.stats = stats

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        detail = f"{type(exc).__name__}: {exc}" if exc is not None else record.getMessage()
        detail = detail.splitlines()[0][:200] if detail else ""
        if isinstance(exc, HttpProcessingError):
            self.stats.malformed.hit(detail)
        elif record.levelno >= logging.WARNING:
            # a bug in a handler: its first traceback is worth a log line, the next 10,000 not
            self.stats.handler_errors.hit(detail, exc)
        return False  # _Throttled has logged what is worth logging


def request_logger(stats: ServerStats) -> logging.Logger:
    """The logger aiohttp's request handlers get: one per server (not in the logging tree, so
    two servers in one process keep their own counts); every record reaches the filter."""
    logger = logging.Logger("exporter.web.requests", logging.DEBUG)
    logger.addFilter(_RequestLogFilter(stats))
    return logger
