"""Kubelet PodResources client (grpc.aio over the kubelet's unix socket).

Called once per cycle by the poller, never on a scrape. What it handles, and why:
- `List` every cycle and `GetAllocatableResources` at most every `allocatable_interval`
  (the exporter: 5 s, so every cycle at the default 10 s interval): the allocatable list
  is the device plugins' health as the kubelet sees it, and it changes the moment a
  plugin reports a device unhealthy (docs/podresources.md); two calls per 10 s cycle are
  0.2 of the kubelet's 100 qps shared by all clients;
- the real kubelet sends pods, containers and devices in a new order on each call, one
  entry per device (real kubelet K1, K2): answers are parsed into one canonical
  order (exporter/podresources/parse.py) and, when that equals the last, the last values
  are handed on unchanged (the poller's join cache then hits); identical bytes skip the
  parse (docs/podresources.md has the measured costs);
- a kubelet's restart window, in which it answers successfully with nothing: the last good
  answer is held while the socket is new (exporter/podresources/settle.py), its identity
  read before a poll and again after each answer (a kubelet can replace the socket in
  between, and answer);
- v1 answered UNIMPLEMENTED -> v1alpha1 `List`, and back to v1 every `v1_retry_interval`;
- a receive limit far above gRPC's 4 MiB default (busy nodes exceed it: dcgm-exporter #509);
- a deadline on every call (a hung kubelet must not stall the cycle);
- a kubelet restart (a new socket file, or the socket gone and back): the channel is
  rebuilt instead of waiting out gRPC's reconnect back-off;
- RESOURCE_EXHAUSTED ("rejected by rate limit", 100 qps / burst 10 across ALL clients):
  exponential back-off during which no call is made;
- an answer that does not decode (random bytes, a string that is not UTF-8, a varint
  without end; answers.py reads them): a `List` fails the poll (`DECODE_ERROR`, retried the
  next cycle), a `GetAllocatableResources` keeps the last allocatable list and is asked
  again at the next poll (not 300 s later; the poll's List stands); each counted, logged
  once per state. `poll` raises nothing but
  PodResourcesError: the kubelet's answers cost the kubelet's data, never a cycle.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from exporter._proto.podresources.v1 import api_pb2 as v1_pb2
from exporter._proto.podresources.v1 import api_pb2_grpc as v1_grpc
from exporter._proto.podresources.v1alpha1 import api_pb2 as v1alpha1_pb2
from exporter.model import ContainerDevices, Pod, PodResourcesHealth, PodResourcesState
from exporter.podresources.answers import AnswerReader, Undecodable
from exporter.podresources.parse import device_id_problem, pod_from_proto
from exporter.podresources.settle import DEFAULT_SETTLE_SECONDS, RestartSettle
from exporter.runtime.backoff import Backoff
from exporter.runtime.log import StateLog
from exporter.settings.config import DEFAULTS


class PodResourcesError(Exception):
    """A failed poll; `code` is the gRPC status name or a local reason."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class PodResourcesClient:
    def __init__(
        self,
        socket_path: str | Path,
        *,
        timeout: float = DEFAULTS.podresources_timeout,
        max_message_bytes: int = DEFAULTS.podresources_max_message_bytes,
        v1_retry_interval: float = 300.0,
        allocatable_interval: float = 0.0,
        backoff_initial: float = 1.0,
        backoff_max: float = 60.0,
        restart_settle: float = DEFAULT_SETTLE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.socket_path = Path(socket_path)
        self.timeout = timeout
        self.max_message_bytes = max_message_bytes
        self.v1_retry_interval = v1_retry_interval
        self.allocatable_interval = allocatable_interval
        self._clock = clock
        self._wall_clock = wall_clock
        self._channel: grpc.aio.Channel | None = None
        self._socket_id: tuple[int, int, int] | None = None
        """The socket file's `_identity` at the last poll."""
        self._restarted = False  # the socket changed identity since the first poll
        self._api = "v1"
        self._v1alpha1_since = 0.0
        self._allocatable: tuple[ContainerDevices, ...] = ()
        self._allocatable_known = False
        self._allocatable_at: float | None = None
        self._backoff = Backoff(backoff_initial, backoff_max)
        self._backoff_until = 0.0
        self._requests: Counter[tuple[str, str]] = Counter()
        self._durations: dict[str, float] = {}
        self._connected = False
        self._last_success = 0.0
        self._states = StateLog(logging.getLogger("exporter.podresources"))
        self._settle = RestartSettle(restart_settle, clock, self._states)
        self.answers = AnswerReader(self._states)
        self._raw_rpcs: dict[tuple[str, str], Any] = {}  # per channel

    # --- public -------------------------------------------------------------------

    @property
    def api_version(self) -> str:
        return self._api

    def health(self) -> PodResourcesHealth:
        return PodResourcesHealth(
            api_version=self._api if self._connected else "",
            connected=self._connected,
            last_success_timestamp=self._last_success,
            requests_total=dict(self._requests),
            last_duration_seconds=dict(self._durations),
            invalid_device_ids_total=self.answers.invalid_ids,
            held=tuple(sorted(m for m, held in self._settle.held.items() if held)),
            refused=dict(self.answers.refused),
        )

    async def poll(self, *, fresh_allocatable: bool = False) -> PodResourcesState:
        """One consistent read of the kubelet, or PodResourcesError. `fresh_allocatable`:
        call GetAllocatableResources though its interval has not passed (a device changed:
        its plugin's verdict is news)."""
        try:
            state = await self._poll(fresh_allocatable)
        except PodResourcesError:
            self._connected = False
            raise
        except Exception as exc:
            self._connected = False
            message = f"PodResources poll failed unexpectedly: {exc!r}"
            self._states.failed(f"error/{type(exc).__name__}", message, trace=exc)
            raise PodResourcesError("ERROR", f"{type(exc).__name__}: {exc}") from exc
        self._connected = True
        self._last_success = self._wall_clock()
        return state

    async def get(self, name: str, namespace: str) -> Pod:
        """`Get` one pod (v1 only; the kubelet needs the KubeletPodResourcesGet gate)."""
        stub = v1_grpc.PodResourcesListerStub(self._ensure_channel())
        request = v1_pb2.GetPodResourcesRequest(pod_name=name, pod_namespace=namespace)
        response: v1_pb2.GetPodResourcesResponse = await self._call("Get", stub.Get, request)
        return pod_from_proto(response.pod_resources)

    async def close(self) -> None:
        await self._drop_channel()

    def socket_changed(self) -> bool:
        """The socket file is not the one the last poll found (a kubelet restarted since, or
        it is gone); False before the first poll. One stat, asked every cycle."""
        current = self._current_identity()
        if current is None:
            return self._socket_id is not None
        return self._socket_id not in (None, current)

    def restarting(self) -> bool:
        """A restarted kubelet's socket is new: its answers may be filling in (settle.py)."""
        return self._restarted and self._settle.settling()

    # --- internals ----------------------------------------------------------------

    async def _poll(self, fresh_allocatable: bool = False) -> PodResourcesState:
        now = self._clock()
        if now < self._backoff_until:
            raise PodResourcesError(
                "BACKOFF", f"rate limited; next try in {self._backoff_until - now:.1f}s"
            )
        await self._check_socket()
        channel = self._ensure_channel()
        if self._api == "v1alpha1" and now - self._v1alpha1_since >= self.v1_retry_interval:
            self._api = "v1"
        if self._api == "v1":
            try:
                pods = await self._list_v1(channel)
            except PodResourcesError as exc:
                if exc.code != "UNIMPLEMENTED":
                    raise
                self._api, self._v1alpha1_since = "v1alpha1", now
                self._allocatable, self._allocatable_known = (), False
        if self._api == "v1alpha1":
            pods = await self._list_v1alpha1(channel)
        else:
            await self._refresh_allocatable(channel, now, fresh_allocatable)
        return PodResourcesState(
            pods=self._settle.pods(pods),
            allocatable=self._allocatable,
            allocatable_known=self._allocatable_known,
            api_version=self._api,
            resources_listed=self._settle.listed,
        )

    async def _list_v1(self, channel: grpc.aio.Channel) -> tuple[Pod, ...]:
        return await self._list(channel, "v1", v1_pb2.ListPodResourcesResponse)

    async def _list_v1alpha1(self, channel: grpc.aio.Channel) -> tuple[Pod, ...]:
        return await self._list(channel, "v1alpha1", v1alpha1_pb2.ListPodResourcesResponse)

    async def _list(
        self, channel: grpc.aio.Channel, api: str, response_type: Any
    ) -> tuple[Pod, ...]:
        """`List` as raw bytes, read by `answers` (parsed only when changed)."""
        raw: bytes = await self._call("List", self._raw_rpc(channel, api, "List"), b"")
        self._check_answered_socket()
        try:
            return await self.answers.pods(api, response_type, raw)
        except Undecodable as exc:
            raise PodResourcesError("DECODE_ERROR", str(exc)) from exc

    @property
    def parses(self) -> int:
        """List answers parsed so far (identical bytes are not parsed)."""
        return self.answers.parses

    async def _refresh_allocatable(
        self, channel: grpc.aio.Channel, now: float, fresh: bool = False
    ) -> None:
        if self._allocatable_at is not None and not (fresh and self._allocatable_known):
            interval = (
                self.allocatable_interval if self._allocatable_known else self.v1_retry_interval
            )
            if now - self._allocatable_at < interval:
                return
        self._allocatable_at = now
        rpc = self._raw_rpc(channel, "v1", "GetAllocatableResources")
        try:
            raw: bytes = await self._call("GetAllocatableResources", rpc, b"")
        except PodResourcesError as exc:
            # Old kubelets (< 1.21) or the gate off: carry on without capacity.
            if exc.code in ("UNIMPLEMENTED", "UNKNOWN"):
                self._allocatable, self._allocatable_known = (), False
                return
            self._allocatable_at = None
            raise
        self._check_answered_socket()
        try:
            devices = self.answers.allocatable(raw)
        except Undecodable as exc:
            # The List of this poll stands; the last allocatable list is kept and the
            # kubelet asked again at the next poll (the one after a change, or the interval).
            self._states.failed("decode/GetAllocatableResources", f"PodResources {exc}")
            self._allocatable_at = None
            return
        again = "PodResources GetAllocatableResources answers decode again"
        self._states.ok("decode/GetAllocatableResources", again)
        self._allocatable = self._settle.allocatable(devices)
        if self._settle.held["GetAllocatableResources"]:
            self._allocatable_at = None  # asked again next cycle until the plugins are back
        self._allocatable_known = True

    def _raw_rpc(self, channel: grpc.aio.Channel, api: str, method: str) -> Any:
        """A unary call on `channel` that sends an empty request and keeps the answer's
        bytes, so the client decides what to parse (`_list`, `_refresh_allocatable`)."""
        rpc = self._raw_rpcs.get((api, method))
        if rpc is None:
            rpc = self._raw_rpcs[(api, method)] = channel.unary_unary(
                f"/{api}.PodResourcesLister/{method}",
                request_serializer=_serialize,
                response_deserializer=None,  # keep the bytes
            )
        return rpc

    async def _call(self, method: str, rpc: Any, request: Any) -> Any:
        started = self._clock()
        code = "OK"
        try:
            return await rpc(request, timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            code = exc.code().name
            if _local_size_limit(exc):
                raise PodResourcesError(
                    code,
                    f"{method} answer refused: {exc.details()}, over --kubernetes.max-message-"
                    "size; the memory limit is sized for that cap: raise both together "
                    "(docs/reliability.md)",
                ) from exc
            if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                self._backoff_until = self._clock() + self._backoff.failure()
            elif exc.code() == grpc.StatusCode.UNAVAILABLE:
                await self._drop_channel()
            raise PodResourcesError(code, exc.details() or code) from exc
        finally:
            self._requests[(method, code)] += 1
            self._durations[method] = self._clock() - started
            if code == "OK":
                self._backoff.success()

    async def _check_socket(self) -> None:
        try:
            st = os.stat(self.socket_path)
            socket_id = _identity(st)
        except FileNotFoundError:
            await self._drop_channel()
            raise PodResourcesError(
                "NO_SOCKET", f"kubelet socket {self.socket_path} does not exist"
            ) from None
        except OSError as exc:
            await self._drop_channel()
            raise PodResourcesError("NO_SOCKET", f"{self.socket_path}: {exc.strerror}") from exc
        if not stat.S_ISSOCK(st.st_mode):
            await self._drop_channel()
            what = "a directory" if stat.S_ISDIR(st.st_mode) else "a regular file"
            if not stat.S_ISDIR(st.st_mode) and not stat.S_ISREG(st.st_mode):
                what = "some other kind of file"
            raise PodResourcesError(
                "NO_SOCKET", f"kubelet socket {self.socket_path} is not a socket ({what})"
            )
        if socket_id != self._socket_id:
            await self._drop_channel()
            self._restarted = self._socket_id is not None  # the first one is no restart
            self._socket_id = socket_id
            self._settle.new_socket()

    def _check_answered_socket(self) -> None:
        """After a call: the socket stat'ed again. A kubelet that replaced it between
        `_check_socket`'s stat and the connect (the path is resolved at connect) may be the
        one that answered, from its empty window: the window opens before the answer is
        weighed (settle.py), or that answer would stand for a cycle and become the "last
        good" one. The socket's identity is left to the next poll's `_check_socket`, which
        rebuilds the channel as after any restart. Gone since: the next poll says so."""
        current = self._current_identity()
        if current is not None and self._socket_id not in (None, current):
            self._restarted = True
            self._settle.new_socket()

    def _current_identity(self) -> tuple[int, int, int] | None:
        """The socket file's `_identity` now; None when it cannot be stat'ed."""
        try:
            return _identity(os.stat(self.socket_path))
        except OSError:
            return None

    def _ensure_channel(self) -> grpc.aio.Channel:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(
                f"unix://{self.socket_path.absolute()}",
                options=[
                    ("grpc.max_receive_message_length", self.max_message_bytes),
                    ("grpc.enable_retries", 0),
                    ("grpc.initial_reconnect_backoff_ms", 200),
                    ("grpc.max_reconnect_backoff_ms", 2000),
                    # A channel of its own subchannels: gRPC otherwise shares them across
                    # channels to one address, and the channel rebuilt for a restarted
                    # kubelet took over the refused connection to its stale socket (K3):
                    # a call within that connection's reconnect back-off failed UNAVAILABLE
                    # although the new kubelet was listening (test_restart_on_the_same_path).
                    ("grpc.use_local_subchannel_pool", 1),
                ],
            )
        return self._channel

    async def close_channel(self) -> None:
        """Close the channel until the next call (which opens a new one): between polls
        far apart, an open channel keeps gRPC's threads waking for nothing
        (exporter/podresources/schedule.py). The socket's identity is kept, so a kubelet
        restarted meanwhile is still noticed."""
        await self._drop_channel()

    async def _drop_channel(self) -> None:
        channel, self._channel = self._channel, None
        self._raw_rpcs.clear()
        if channel is not None:
            await channel.close(grace=None)


def _identity(st: os.stat_result) -> tuple[int, int, int]:
    """A socket file's identity: (device, inode, ctime). A new file (a restarted kubelet) is
    a new ctime even where the filesystem hands the freed inode number straight back."""
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def _serialize(request: bytes) -> bytes:
    return request  # an empty ListPodResourcesRequest is zero bytes in both versions


def _local_size_limit(exc: grpc.aio.AioRpcError) -> bool:
    """Our own receive limit also says RESOURCE_EXHAUSTED; backing off would not help it."""
    return "larger than max" in (exc.details() or "")


__all__ = [
    "PodResourcesClient",
    "PodResourcesError",
    "device_id_problem",
    "pod_from_proto",
]
