"""The standard `OTEL_*` variables OTLP push reads, checked at start.

The SDK reads most of them itself, and late: a bad export interval or compression raises
from inside the SDK after the HTTP server is up (a traceback, exit 1), a missing CA file is
logged as an SDK traceback and the push goes on over https with the system's roots. Checked
here, with the flags, each is one line and exit 2, like every other bad value.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

COMPRESSIONS = {"grpc": ("gzip", "none"), "http/protobuf": ("gzip", "deflate", "none")}
"""What each SDK exporter accepts (the gRPC one rejects the spec's `none`, which
otlp_transport maps to no compression; it has no deflate)."""

MILLISECOND_VARIABLES = (
    "OTEL_METRIC_EXPORT_INTERVAL",
    "OTEL_METRIC_EXPORT_TIMEOUT",
    "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
)

FILE_VARIABLES = ("CERTIFICATE", "CLIENT_KEY", "CLIENT_CERTIFICATE")
"""`OTEL_EXPORTER_OTLP_(METRICS_)<NAME>`: TLS files the SDK opens when it builds the exporter."""


def in_effect(env: Mapping[str, str], name: str) -> str | None:
    """`OTEL_EXPORTER_OTLP_METRICS_<NAME>` if set, else `OTEL_EXPORTER_OTLP_<NAME>` (the
    signal-specific variable wins, as in the SDK); None if neither is set and non-empty."""
    for variable in (f"OTEL_EXPORTER_OTLP_METRICS_{name}", f"OTEL_EXPORTER_OTLP_{name}"):
        if env.get(variable, "").strip():
            return variable
    return None


def milliseconds(text: str) -> float:
    """A positive, finite number of milliseconds, or ValueError."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"expected a positive number of milliseconds, got {text!r}")
    return value


def otel_problem(env: Mapping[str, str], protocol: str) -> str | None:
    """The first bad `OTEL_*` value OTLP push would read, as one line naming the variable."""
    for name in MILLISECOND_VARIABLES:
        raw = env.get(name, "").strip()
        if raw:
            try:
                milliseconds(raw)
            except ValueError as exc:
                return f"environment variable {name}: {exc}"
    variable = in_effect(env, "COMPRESSION")
    if variable is not None:
        value = env[variable].strip().lower()
        allowed = COMPRESSIONS.get(protocol, ())
        if value not in allowed:
            return (
                f"environment variable {variable}: expected one of {', '.join(allowed)} "
                f"for OTLP {protocol}, got {env[variable]!r}"
            )
    for name in FILE_VARIABLES:
        variable = in_effect(env, name)
        if variable is None:
            continue
        path = env[variable].strip()
        if not os.path.isfile(path):
            return f"environment variable {variable}: no such file {path!r}"
        if not os.access(path, os.R_OK):
            return f"environment variable {variable}: {path!r} is not readable"
    return None
