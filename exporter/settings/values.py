"""Value types for flags, variables and source options: text -> value, or a ValueError whose
text is what the user reads (the CLI prefixes the flag or variable name)."""

from __future__ import annotations

import re
from collections.abc import Callable

DURATION_UNITS = (
    ("y", 365 * 86400.0),
    ("w", 7 * 86400.0),
    ("d", 86400.0),
    ("h", 3600.0),
    ("m", 60.0),
    ("s", 1.0),
    ("ms", 0.001),
)
"""Prometheus's duration units, largest first (prometheus/common model/time.go, `unitMap`:
a year is 365 days, a week 7)."""

_DURATION_PART = re.compile(r"([0-9]+)([a-z]+)")


def prometheus_duration(text: str) -> float:
    """Prometheus's duration grammar (prometheus/common `model.ParseDuration`, model/time.go
    at d2417e2): one or more NUMBER UNIT parts, whole numbers only, units among y w d h m s ms
    each at most once and largest first (`1h30m`, not `30m1h`); `0` is the only number
    allowed without a unit; no sign, no spaces. -> seconds (>= 0)."""
    if text == "0":
        return 0.0
    rank = {unit: i for i, (unit, _) in enumerate(DURATION_UNITS)}
    scale = dict(DURATION_UNITS)
    seconds, last, at = 0.0, -1, 0
    for part in _DURATION_PART.finditer(text):
        unit = part[2]
        if part.start() != at or unit not in rank or rank[unit] <= last:
            break
        seconds += int(part[1]) * scale[unit]
        last, at = rank[unit], part.end()
    else:
        if text and at == len(text):
            return seconds
    raise ValueError(_duration_problem(text))


def _duration_problem(text: str) -> str:
    """The one line a user reads for a duration Prometheus would not accept either."""
    example = "like 10s, 1m30s or 500ms (Prometheus's format: units y, w, d, h, m, s, ms)"
    if re.fullmatch(r"[0-9]+", text.strip()):
        return f"expected a duration {example}, got {text!r}: add a unit, e.g. {text.strip()}s"
    if text.strip().startswith("-"):
        return f"must be greater than zero, got {text!r}"
    if re.fullmatch(r"[0-9]+\.[0-9]+[a-z]+", text.strip()):
        return f"expected a duration {example}, got {text!r}: whole numbers only (use ms)"
    return f"expected a duration {example}, largest unit first, got {text!r}"


def duration(text: str) -> float:
    """A positive duration in Prometheus's grammar (`10s`, `1h30m`, `500ms`) -> seconds."""
    value = prometheus_duration(text)
    if value <= 0:
        raise ValueError(f"must be greater than zero, got {text!r}")
    return value


def duration_over(minimum: float, why: str) -> Callable[[str], float]:
    """A `duration` that must exceed `minimum` seconds; `why` names who requires it."""

    def parse(text: str) -> float:
        seconds = duration(text)
        if seconds <= minimum:
            raise ValueError(f"must be more than {minimum:g}s ({why}), got {text!r}")
        return seconds

    parse.__name__ = "duration"  # the same value type in --help (METAVARS: DURATION)
    return parse


def choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text.lower() not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}, got {text!r}")
        return text.lower()

    return parse


def choices(*allowed: str) -> Callable[[str], tuple[str, ...]]:
    """A comma-separated, non-empty list of distinct allowed words, in the order given."""

    def parse(text: str) -> tuple[str, ...]:
        words = tuple(w.strip().lower() for w in text.split(","))
        bad = [w for w in words if w not in allowed]
        if bad or len(set(words)) != len(words):
            raise ValueError(
                f"expected one or more of {', '.join(allowed)} (comma-separated, each once), "
                f"got {text!r}"
            )
        return words

    return parse


def boolean(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true, false, yes, no, on, off, 1 or 0, got {text!r}")


def auto_boolean(text: str) -> str:
    """`auto`, or a boolean: the text, checked (the source decides what auto means)."""
    if text.lower() != "auto":
        try:
            boolean(text)
        except ValueError:
            raise ValueError(
                f"expected auto, true, false, yes, no, on, off, 1 or 0, got {text!r}"
            ) from None
    return text


def positive_int(text: str) -> int:
    if not re.fullmatch(r"\s*[0-9]{1,9}\s*", text) or int(text) < 1:
        raise ValueError(f"expected a whole number of at least 1, got {text!r}")
    return int(text)


def regex(text: str) -> str:
    try:
        re.compile(text)
    except re.error as exc:
        raise ValueError(f"not a regular expression ({exc}): {text!r}") from exc
    return text


def size_bytes(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*(KiB|MiB|GiB|B)?\s*", text)
    if not m:
        raise ValueError(f"expected a size like 64MiB, got {text!r}")
    return int(m[1]) * {"KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "B": 1, None: 1}[m[2]]


def text(value: str) -> str:
    """Free text (a file name, a name): any value, the empty string included."""
    return value


def file_path(value: str) -> str:
    """A path, or empty for none. Not checked here: what reads it says (a configuration file
    at start, exit 2; a socket of the kubelet's when it appears)."""
    return value


def listen_address(text: str) -> tuple[str, int] | None:
    """`HOST:PORT`, `:PORT`, `[::]:PORT`; `none` disables the HTTP server."""
    if text.strip().lower() == "none":
        return None
    m = re.fullmatch(r"(?:\[(?P<v6>[0-9a-fA-F:.]+)\]|(?P<host>[^:\[\]]*)):(?P<port>\d{1,5})", text)
    if not m or not 0 <= int(m["port"]) < 65536:
        raise ValueError(f"expected HOST:PORT (e.g. :9405, 0.0.0.0:9405, [::]:9405), got {text!r}")
    return (m["v6"] or m["host"] or "", int(m["port"]))


METAVARS: dict[str, str] = {
    "duration": "DURATION",
    "boolean": "BOOL",
    "auto_boolean": "auto|BOOL",
    "size_bytes": "SIZE",
    "positive_int": "N",
    "text": "TEXT",
    "file_path": "FILE",
}
"""Placeholder shown in --help for each value type, by its function name."""
