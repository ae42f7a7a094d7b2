"""The OTLP/HTTP session: one deadline per exchange, the collector's answer read within a cap.

The collector's answer is untrusted input. `requests` bounds each read of a socket, not the
exchange, and reads a body whole: a collector that drips its answer held an export past
its timeout uncounted, one that answers 200 with a body without end grew the heap by 1.5 GiB
in 18 s (issue 41). This session, the metrics' and the log records' alike, gives each
exchange one deadline, the time the SDK hands it, from the request to the answer's last
byte (a watchdog shuts the connection's socket down when it passes; the pool notes which
connection the exchange took), and reads at most `ANSWER_BYTES` of the answer; past either
the answer is dropped (`AnswerRefused`), the export fails (counted), and one line says so.
A session of the user's own (`OTEL_PYTHON_EXPORTER_OTLP_HTTP_*_CREDENTIAL_PROVIDER`) is used
as it is. Also here: `requests` lets REQUESTS_CA_BUNDLE override the session's CA file, and
OTEL_EXPORTER_OTLP_CERTIFICATE must win.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)

from exporter.runtime.log import StateLog

log = logging.getLogger("exporter.otlp")

ANSWER_BYTES = 1 << 20
"""An OTLP answer is a few bytes (a partial success's message, a few hundred)."""
DEFAULT_TIMEOUT_SECONDS = 10.0
"""One export's, retries included, unless OTEL_EXPORTER_OTLP_(METRICS_)TIMEOUT says."""
_HTTP_SESSION_PROVIDERS = (
    "OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER",
    "OTEL_PYTHON_EXPORTER_OTLP_HTTP_METRICS_CREDENTIAL_PROVIDER",
    "OTEL_PYTHON_EXPORTER_OTLP_HTTP_LOGS_CREDENTIAL_PROVIDER",
)


class AnswerRefused(Exception):
    """A collector's answer dropped: over `ANSWER_BYTES` (`reason` bytes) or not whole by the
    exchange's deadline (`time`)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class _Exchange:
    """One request and its answer: the connection it went out on, for the watchdog."""

    __slots__ = ("aborted", "conn")

    def __init__(self) -> None:
        self.conn: Any = None
        self.aborted = False

    def abort(self) -> None:
        """The deadline passed: shut the socket down, which ends any read blocked on it."""
        self.aborted = True
        sock = getattr(self.conn, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class _Current(threading.local):
    exchange: _Exchange | None = None


_CURRENT = _Current()
"""The exchange the calling thread is in (the pool records its connection there)."""


def _recording(base: type[Any]) -> type[Any]:
    """`base` (a urllib3 pool class) whose connections are noted in the current exchange."""

    class Pool(base):  # type: ignore[misc]
        def _get_conn(self, timeout: float | None = None) -> Any:
            conn = super()._get_conn(timeout)
            if _CURRENT.exchange is not None:
                _CURRENT.exchange.conn = conn
            return conn

    return Pool


def _seconds(timeout: Any) -> float:
    """The exchange's deadline from `requests`' timeout: a number, or (connect, read)."""
    if isinstance(timeout, tuple):
        timeout = sum(t for t in timeout if t) or None
    return float(timeout) if timeout else DEFAULT_TIMEOUT_SECONDS


def _read(response: Any, exchange: _Exchange, limit: int) -> bytes:
    data = bytearray()
    try:
        for chunk in response.iter_content(65536):
            data += chunk
            if len(data) > limit:
                raise AnswerRefused("bytes", f"an answer over {limit >> 10} KiB")
    except AnswerRefused:
        response.close()
        raise
    except Exception as exc:
        response.close()
        if exchange.aborted:
            raise AnswerRefused("time", "no whole answer within the export timeout") from exc
        raise
    return bytes(data)


def http_session(
    env: Mapping[str, str],
    target: str,
    refused: Callable[[str], None],
    seen: Callable[[ExportMetricsServiceResponse], None] | None = None,
) -> Any:
    """The bounded session (module docstring) for `target`: `refused(reason)` is called for
    each answer dropped, `seen` reads a metrics answer's partial success. None: the user's
    credential-provider session is used as it is."""
    if any(env.get(name) for name in _HTTP_SESSION_PROVIDERS):
        return None  # the user's credential-provider session wins; no partial-success count
    import requests
    from requests.adapters import HTTPAdapter
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

    states = StateLog(log)

    class Adapter(HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            super().init_poolmanager(*args, **kwargs)
            self.poolmanager.pool_classes_by_scheme = {
                "http": _recording(HTTPConnectionPool),
                "https": _recording(HTTPSConnectionPool),
            }

    class Session(requests.Session):
        def merge_environment_settings(self, *args: Any, **kwargs: Any) -> Any:
            settings = super().merge_environment_settings(*args, **kwargs)
            # requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE override the session's
            # CA file: OTEL_EXPORTER_OTLP_CERTIFICATE (set as session.verify) must win.
            if isinstance(self.verify, str):
                settings["verify"] = self.verify
            return settings

        def send(self, request: Any, **kwargs: Any) -> Any:
            """One exchange within its deadline, its answer read within its bound."""
            seconds = _seconds(kwargs.get("timeout"))
            exchange = _Exchange()
            watchdog = threading.Timer(seconds, exchange.abort)
            watchdog.daemon = True
            _CURRENT.exchange = exchange
            watchdog.start()
            started = time.monotonic()
            try:
                try:
                    response = super().send(request, **{**kwargs, "stream": True})
                except requests.RequestException as exc:
                    if exchange.aborted:
                        raise AnswerRefused("time", f"no answer within {seconds:g}s") from exc
                    raise
                body = _read(response, exchange, ANSWER_BYTES)
            except AnswerRefused as exc:
                refused(exc.reason)
                took = time.monotonic() - started
                states.failed(
                    f"refused/{exc.reason}",
                    f"OTLP receiver {target or request.url}: {exc} (after {took:.1f}s); answer "
                    "dropped, export counted failed",
                )
                raise
            finally:
                watchdog.cancel()
                _CURRENT.exchange = None
            states.ok_all("refused/", f"OTLP receiver {target or request.url} answering in bounds")
            response._content = body
            response._content_consumed = True
            if seen is not None and 200 <= response.status_code < 300 and body:
                parsed = ExportMetricsServiceResponse()
                try:
                    parsed.ParseFromString(body)
                except DecodeError:
                    log.debug("OTLP/HTTP answer is not an ExportMetricsServiceResponse")
                else:
                    seen(parsed)
            return response

    session = Session()
    adapter = Adapter()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session
