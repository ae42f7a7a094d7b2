"""`--kubernetes.events`: a Kubernetes Event on each pod a device event hit (docs/events.md).

`kubectl describe pod` and `kubectl get events` then say "XID 79 on GPU-... (GPU has fallen
off the bus)" next to the pod's own failure. Events are core/v1 Events, written as the
kubelet's recorder writes its own (client-go tools/record): named `<pod>.<UnixNano in hex>`,
`involvedObject` the Pod, `source.component`/`reportingComponent` ours, `source.host` and
`reportingInstance` the node, type `Warning`.

Rate limits, as client-go's EventCorrelator (tools/record/events_cache.go) does for the
kubelet: per involved pod a token bucket of 25 events refilled at one per 5 minutes
(`defaultSpamBurst`, `defaultSpamQPS`); and per device and code at most one Event per pod
every 10 minutes (`defaultAggregateIntervalInSeconds`): a GPU that logs the same XID every
cycle does not flood the API server. What is held back is counted
(`kube_device_exporter_kubernetes_events_total{result}`), never queued for later: the next
occurrence after the window is a new Event. The only RBAC it needs is `create` on `events`.

Posting runs on the event loop (the API client is async); `publish()` is called from the
poller's worker thread and only hands the events over.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from exporter.derive.events import DeviceEvent
from exporter.model import Sample
from exporter.runtime.log import StateLog
from exporter.settings.config import Config

log = logging.getLogger("exporter.k8sevents")

COMPONENT = "kube-device-exporter"
SPAM_BURST = 25
SPAM_REFILL_SECONDS = 300.0
DEDUP_WINDOW_SECONDS = 600.0
REQUEST_TIMEOUT_SECONDS = 10.0
MAX_PENDING = 1000
"""client-go's `maxQueuedEvents`: more waiting than this and new ones are dropped."""

REASONS = {
    "ecc_uncorrected": "DeviceECCError",
    "gpu_failed": "DeviceFailed",
    "row_remap_failed": "DeviceRowRemapFailed",
    "link_down": "DeviceLinkDown",
}


def reason(event: DeviceEvent) -> str:
    return "DeviceXID" if event.xid is not None else REASONS.get(event.code, "DeviceError")


@dataclass
class _Bucket:
    tokens: float
    at: float


@dataclass
class EventGate:
    """Which (pod, event) pairs may become an Event now: dedup per (pod, device, code),
    then the per-pod token bucket. Pure, with an injectable clock."""

    clock: Callable[[], float] = time.monotonic
    window: float = DEDUP_WINDOW_SECONDS
    burst: int = SPAM_BURST
    refill: float = SPAM_REFILL_SECONDS
    _last: dict[tuple[str, str, str, str], float] = field(default_factory=dict)
    _buckets: dict[tuple[str, str], _Bucket] = field(default_factory=dict)

    def admit(self, pod: tuple[str, str], device_id: str, code: str) -> str:
        """`created` (go ahead), `deduplicated` or `rate_limited`."""
        now = self.clock()
        key = (*pod, device_id, code)
        last = self._last.get(key)
        if last is not None and now - last < self.window:
            return "deduplicated"
        bucket = self._buckets.get(pod)
        if bucket is None:
            bucket = self._buckets[pod] = _Bucket(float(self.burst), now)
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.at) / self.refill)
        bucket.at = now
        if bucket.tokens < 1:
            return "rate_limited"
        bucket.tokens -= 1
        self._last[key] = now
        self._forget(now)
        return "created"

    def _forget(self, now: float) -> None:
        if len(self._last) > 4096:  # client-go's LRU size: old windows are over anyway
            self._last = {k: t for k, t in self._last.items() if now - t < self.window}


def event_object(
    event: DeviceEvent,
    *,
    pod: tuple[str, str],
    containers: Sequence[str],
    uid: str,
    node: str,
    now: datetime,
) -> dict[str, Any]:
    namespace, name = pod
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    involved: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": namespace,
        "name": name,
    }
    if uid:
        involved["uid"] = uid
    held = ", ".join(containers)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{name}.{int(now.timestamp() * 1e9):x}",
            "namespace": namespace,
        },
        "involvedObject": involved,
        "reason": reason(event),
        "message": f"{event.summary} (container {held}; event class {event.info.klass})",
        "type": "Warning",
        "source": {"component": COMPONENT, "host": node},
        "reportingComponent": COMPONENT,
        "reportingInstance": node,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": event.count,
    }


class KubeEventPoster:
    """Publisher of device events as Kubernetes Events; `run()` posts them on the loop."""

    def __init__(
        self,
        client: Any,
        node: str,
        *,
        gate: EventGate | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        """An httpx AsyncClient with the API server's base URL and credentials."""
        self.node = node
        self.gate = gate or EventGate()
        self._wall_clock = wall_clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[dict[str, Any]] | None = None
        self._results: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._states = StateLog(log)

    def publish(self, events: Sequence[DeviceEvent]) -> None:
        """From the poller's worker thread: decide which Events to make, hand them over."""
        now = datetime.fromtimestamp(self._wall_clock(), UTC)
        for event in events:
            pods: dict[tuple[str, str], list[str]] = {}
            for holder in event.holders:
                pods.setdefault((holder.namespace, holder.pod), []).append(holder.container)
            uids = {(ns, pod): uid for ns, pod, uid in event.pod_uids}
            for pod, containers in sorted(pods.items()):
                result = self.gate.admit(pod, event.device.id, event.code)
                if result != "created":
                    self._count(result)
                    continue
                obj = event_object(
                    event,
                    pod=pod,
                    containers=containers,
                    uid=uids.get(pod, ""),
                    node=self.node,
                    now=now,
                )
                self._hand_over(obj)

    def _hand_over(self, obj: dict[str, Any]) -> None:
        loop, queue = self._loop, self._queue
        if loop is None or queue is None:
            self._count("dropped")
            return

        def put() -> None:
            if queue.qsize() >= MAX_PENDING:
                self._count("dropped")
            else:
                queue.put_nowait(obj)

        loop.call_soon_threadsafe(put)

    async def run(self, stop: asyncio.Event) -> None:
        """Post queued Events until `stop`."""
        self._loop = asyncio.get_running_loop()
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._queue = queue
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                getting = asyncio.ensure_future(queue.get())
                await asyncio.wait({getting, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not getting.done():
                    getting.cancel()
                    break
                await self.post(getting.result())
        finally:
            stopping.cancel()

    async def post(self, obj: dict[str, Any]) -> None:
        namespace = obj["metadata"]["namespace"]
        url = f"/api/v1/namespaces/{namespace}/events"
        try:
            response = await self.client.post(
                url, content=json.dumps(obj), headers={"Content-Type": "application/json"}
            )
        except Exception as exc:  # noqa: BLE001 - any transport failure is this Event's
            self._count("failed")
            self._states.failed("post", f"creating a Kubernetes Event failed: {exc!r}")
            return
        if response.status_code in (200, 201):
            self._count("created")
            self._states.ok("post", "creating Kubernetes Events again")
        else:
            self._count("failed")
            self._states.failed(
                "post",
                f"creating a Kubernetes Event failed: HTTP {response.status_code} "
                f"{response.text[:200]} (RBAC: create on events, docs/events.md)",
            )

    def _count(self, result: str) -> None:
        with self._lock:
            self._results[result] += 1

    def self_samples(self) -> tuple[Sample, ...]:
        with self._lock:
            results = sorted(self._results.items())
        return tuple(
            Sample("kube_device_exporter.kubernetes.events", float(n), (("result", r),))
            for r, n in results
        )


def build_poster(config: Config) -> KubeEventPoster | None:
    """The poster for `--kubernetes.events`; None (said once) when no API configuration
    is usable: device events then still go to OTLP."""
    from exporter.kubeapi.client import NotConfigured, http_client, load_config

    try:
        api = load_config(config.kubeconfig)
    except NotConfigured as exc:
        log.error("--kubernetes.events is off: %s", exc)
        return None
    return KubeEventPoster(http_client(api, REQUEST_TIMEOUT_SECONDS), config.node_name)
