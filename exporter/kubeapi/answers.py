"""The one boundary every API server answer crosses: read within bounds, decoded into typed
values, or refused as `Unusable`.

An answer is untrusted input. A real API server never sends a list whose labels are a list
or a watch line that never ends, but a proxy, a broken aggregated API, a compromised
control plane or a test's peer can, and the watches must outlive it: whatever the bytes,
reading them either gives the values the exporter needs or raises `Unusable`, which the
list-watch loop (listwatch.py) turns into "this answer is unusable" (one line per state,
counted in `kube_device_exporter_peer_answers_refused_total`, back-off, retry, the last good
cache kept). Nothing else escapes to end a loop.

The bounds (`Limits`): bytes per HTTP body and per watch line (16 MiB: a whole page of 500
pods read whole with `--kubernetes.dra` is a few MB; etcd refuses an object over 1.5 MiB),
pages per list, objects per list and cache (`--kubernetes.max-pods`,
`--kubernetes.max-resource-slices`: docs/reliability.md says why those numbers), and the
time one list page or owner read may take from its first byte to its last (30 s; the
client's own deadline is per read, which a drip of one byte a second never meets).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

ANSWER_BYTES = 16 * 1024 * 1024
LIST_PAGES = 100
READ_SECONDS = 30.0


class Unusable(Exception):
    """An answer dropped at the boundary: `reason` is `decode` (not the shape or encoding
    asked for), `bytes`, `pages`, `objects` or `time` (over that bound)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Limits:
    """How much of one peer's answers the exporter reads."""

    answer_bytes: int = ANSWER_BYTES
    """One HTTP body, or one line of a watch."""
    pages: int = LIST_PAGES
    objects: int = 0
    """Objects one list may hold and one cache keep (0: no limit, for a test)."""
    read_seconds: float = READ_SECONDS
    """From sending a request to the last byte of its answer (not a watch: its end is
    bounded by its timeoutSeconds)."""

    def count(self, objects: int, what: str, flag: str) -> None:
        """Unusable when `objects` is over `objects` (the limit `flag` sets)."""
        if self.objects and objects > self.objects:
            raise Unusable(
                "objects", f"more than {self.objects} {what} (over {flag}): answer dropped"
            )


class Body(Protocol):
    def aiter_bytes(self) -> AsyncIterator[bytes]: ...


async def read_body(response: Body, limit: int) -> bytes:
    """The whole body, or Unusable past `limit` bytes (nothing more is read)."""
    data = bytearray()
    async for chunk in response.aiter_bytes():
        data += chunk
        if len(data) > limit:
            raise Unusable("bytes", f"an answer over {limit >> 20} MiB: dropped")
    return bytes(data)


async def read_lines(response: Body, limit: int) -> AsyncIterator[bytes]:
    """Each non-empty line of a stream, or Unusable when one grows past `limit` bytes
    without its newline (a line without end is never held whole)."""
    pending = bytearray()
    async for chunk in response.aiter_bytes():
        pending += chunk
        start = 0
        while (end := pending.find(b"\n", start)) >= 0:
            line = bytes(pending[start:end]).strip()
            if len(line) > limit:
                raise Unusable("bytes", f"a watch line over {limit >> 20} MiB: dropped")
            if line:
                yield line
            start = end + 1
        del pending[:start]
        if len(pending) > limit:
            raise Unusable("bytes", f"a watch line over {limit >> 20} MiB: dropped")
    if pending.strip():
        yield bytes(pending).strip()


async def within(seconds: float, what: str, awaitable: Any) -> Any:
    """`awaitable`'s result, or Unusable("time") when it takes longer than `seconds`."""
    try:
        async with asyncio.timeout(seconds):
            return await awaitable
    except TimeoutError:
        raise Unusable("time", f"{what} took longer than {seconds:g}s: dropped") from None


# --- decoding -------------------------------------------------------------------------------


def json_object(data: bytes, where: str) -> dict[str, Any]:
    """`data` as a JSON object."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise Unusable("decode", f"{where} is not JSON ({_first(exc)})") from None
    return mapping(value, where)


def mapping(value: Any, where: str) -> dict[str, Any]:
    """`value` as an object (an absent one, None, as empty)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise Unusable("decode", f"{where} is {_kind(value)}, not an object")
    return value


def sequence(value: Any, where: str) -> list[Any]:
    """`value` as an array (an absent one as empty)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise Unusable("decode", f"{where} is {_kind(value)}, not an array")
    return value


def text(value: Any, where: str, *, required: bool = False) -> str:
    """`value` as a string ("" when absent, unless `required`)."""
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise Unusable("decode", f"{where} is {_kind(value)}, not a non-empty string")
    return value


def labels(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    """A string-to-string map (labels), sorted."""
    pairs = mapping(value, where)
    for k, v in pairs.items():
        if not isinstance(v, str):
            raise Unusable("decode", f"{where}[{k!r}] is {_kind(v)}, not a string")
    return tuple(sorted(pairs.items()))


def flag(value: Any, where: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise Unusable("decode", f"{where} is {_kind(value)}, not true or false")
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "missing"
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), "a number" if isinstance(value, int | float) else type(value).__name__
    )


def _first(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__


SHAPE_ERRORS = (TypeError, AttributeError, KeyError, IndexError, ValueError, RecursionError)
"""What reading a value of the wrong shape raises where no helper above checked it (a
parser of its own, such as the DRA readers'): turned into Unusable at the boundary."""


def decoded(where: str, exc: BaseException) -> Unusable:
    """`exc`, raised while `where` was decoded, as the answer being unusable."""
    if isinstance(exc, Unusable):
        return exc
    return Unusable("decode", f"{where} not understood ({type(exc).__name__}: {_first(exc)})")


def get(obj: Mapping[str, Any], *path: str) -> Any:
    """`obj[path[0]][path[1]]...`, None where a step is absent; Unusable where one is not an
    object."""
    value: Any = obj
    for i, key in enumerate(path):
        value = mapping(value, ".".join(path[:i]) or "the object").get(key)
    return value
