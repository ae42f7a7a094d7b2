"""Value types for flags, variables and source options: text -> value, or a ValueError whose
text is what the user reads (the CLI prefixes the flag or variable name)."""

from __future__ import annotations

import re
from collections.abc import Callable


def duration(text: str) -> float:
    """`10`, `10s`, `500ms`, `1m` -> seconds (> 0)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", text)
    if not m:
        raise ValueError(f"expected a duration like 10s, 500ms or 1m, got {text!r}")
    value = float(m[1]) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m[2]]
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
    raise ValueError(f"expected true or false, got {text!r}")


def auto_boolean(text: str) -> str:
    """`auto`, or a boolean: the text, checked (the source decides what auto means)."""
    if text.lower() != "auto":
        try:
            boolean(text)
        except ValueError:
            raise ValueError(f"expected auto, true or false, got {text!r}") from None
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
    """A file name, or empty for none. Not checked for existence: a mounted ConfigMap may
    appear after start, and the source reports a missing file itself."""
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
