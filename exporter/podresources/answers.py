"""PodResources answers' bytes -> the model, parsed only when they changed, decoded defensively.

The real kubelet's order changes on every call, so equal bytes are rare: an
order-insensitive key of a `List` answer's bytes (parse.OrderFreeKey, in a worker thread)
decides, and only a changed key is parsed; an unchanged one hands on the last values, the
same objects cycle after cycle. Device IDs that cannot name a device are counted and said
once per state. An answer that does not decode (random bytes, a string that is not UTF-8, a
varint without end) raises `Undecodable`, counted in `refused`: the client keeps the last
good values (client.py).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from google.protobuf.message import DecodeError

from exporter._proto.podresources.v1 import api_pb2 as v1_pb2
from exporter.model import ContainerDevices, Pod
from exporter.podresources.parse import (
    OrderFreeKey,
    device_id_problem,
    order_free_key,
    parse_allocatable,
    parse_list,
)
from exporter.runtime.log import StateLog

_ListCache = tuple[str, bytes, tuple[Pod, ...], tuple[str, ...]]
"""(API version, the answer's bytes, its pods, its invalid device IDs)."""

DECODE_ERRORS = (DecodeError, ValueError, IndexError, RecursionError)
"""What parsing bytes that are not the answer raises (UnicodeDecodeError is a ValueError)."""


class Undecodable(Exception):
    """An answer whose bytes do not decode; the message says how many and why."""


class AnswerReader:
    """The last answers of one client, and what reading them found."""

    def __init__(self, states: StateLog) -> None:
        self._states = states
        self._list_cache: _ListCache | None = None
        self._list_key: tuple[bytes, ...] = ()
        self._order_free_key = OrderFreeKey()
        self._allocatable_cache: (
            tuple[bytes, tuple[ContainerDevices, ...], tuple[str, ...]] | None
        ) = None
        self.parses = 0
        """List answers parsed so far (identical bytes, or an unchanged key, are not)."""
        self.invalid_ids = 0
        """Empty or malformed device IDs skipped so far."""
        self.refused: Counter[tuple[str, str]] = Counter()
        """(method, "decode") -> answers that did not decode."""

    async def pods(self, api: str, response_type: Any, raw: bytes) -> tuple[Pod, ...]:
        """A `List` answer's pods; Undecodable."""
        cached = self._list_cache
        if cached is not None and cached[:2] == (api, raw):
            self._note_invalid(list(cached[3]), "List")  # counted per answer
            return cached[2]
        last = cached if cached is not None and cached[0] == api else None
        try:
            read = await asyncio.to_thread(self._read_list, response_type, raw, last)
        except DECODE_ERRORS as exc:
            raise self._undecodable("List", raw, exc) from exc
        self._list_cache = (api, raw, read[1], read[2])
        self._list_key = read[0]
        self._note_invalid(list(read[2]), "List")
        return read[1]

    def _read_list(
        self, response_type: Any, raw: bytes, last: _ListCache | None
    ) -> tuple[tuple[bytes, ...], tuple[Pod, ...], tuple[str, ...]]:
        """(key, pods, invalid IDs) of an answer: the last pods when its key is the last's."""
        key = order_free_key(self._order_free_key, raw)
        if last is not None and key == self._list_key:
            return key, last[2], last[3]
        invalid: list[str] = []
        pods = parse_list(response_type, raw, invalid)
        self.parses += 1
        if last is not None and pods == last[2]:
            pods = last[2]  # the same state (a packed field in a new order): the same objects
        return key, pods, tuple(invalid)

    def allocatable(self, raw: bytes) -> tuple[ContainerDevices, ...]:
        """A `GetAllocatableResources` answer's devices; Undecodable."""
        cached = self._allocatable_cache
        if cached is None or cached[0] != raw:
            invalid: list[str] = []
            try:
                devices = parse_allocatable(raw, v1_pb2.AllocatableResourcesResponse, invalid)
            except DECODE_ERRORS as exc:
                raise self._undecodable("GetAllocatableResources", raw, exc) from exc
            if cached is not None and cached[1] == devices:
                devices = cached[1]
            self._allocatable_cache = cached = (raw, devices, tuple(invalid))
        self._note_invalid(list(cached[2]), "GetAllocatableResources")  # counted per answer
        return cached[1]

    def _undecodable(self, method: str, raw: bytes, exc: BaseException) -> Undecodable:
        self.refused[(method, "decode")] += 1
        why = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        when = "the next cycle" if method == "List" else "at the next poll"
        return Undecodable(
            f"{method} answer unusable ({len(raw)} bytes that do not decode: {why}); the last "
            f"good one kept, asking again {when}"
        )

    def _note_invalid(self, invalid: list[str], method: str) -> None:
        """Count skipped device IDs; log when they appear and when they are gone."""
        self.invalid_ids += len(invalid)
        if invalid:
            self._states.failed(
                f"invalid/{method}",
                f"PodResources {method} reports {len(invalid)} empty or malformed device IDs "
                f"(first: {invalid[0][:80]!r}, {device_id_problem(invalid[0])}); skipped",
            )
        else:
            self._states.ok(f"invalid/{method}", f"PodResources {method}: device IDs well-formed")
