"""Device events: what went wrong on a device since the last cycle, and who held it then.

An XID, an uncorrectable ECC error, a device that failed, a row remap that failed, a network
port whose link went down: each is a counter or a state on a device series today. Here they
become events, one per (device, code) and cycle, naming every container that held the device
at that moment: the containers PodResources gives it to (or a MIG slice of it), and those
whose processes used it (process attribution). The OTLP log sink (sinks/otlp_logs.py) and
the Kubernetes Events poster (k8sevents.py) publish them.

Detection compares each snapshot with the previous one, as Prometheus's `increase()` does:
a counter that grew, or a counter series that appeared on a device already seen last cycle
(the first XID of a code creates its series at 1); a counter that went down (driver reload)
counts from zero. The first snapshot only sets the baseline: counts from before the
exporter started are not news.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from exporter.derive.devicecodes import EVENTS, Code, xid_code
from exporter.model import Device, Holder, Sample, Snapshot

log = logging.getLogger("exporter.events")

_Key = tuple[str, str, tuple[tuple[str, str], ...]]
"""(device id, metric, sample attributes)."""


@dataclass(frozen=True, slots=True)
class DeviceEvent:
    device: Device
    code: str
    """`xid.79`, `ecc_uncorrected`, `gpu_failed`, `row_remap_failed`, `link_down`."""
    info: Code
    count: int
    """Occurrences since the last cycle (1 for a state change)."""
    holders: tuple[Holder, ...]
    pod_uids: tuple[tuple[str, str, str], ...] = ()
    """(namespace, pod, uid) of the holders whose UID is known."""
    timestamp: float = 0.0
    xid: int | None = None

    @property
    def summary(self) -> str:
        what = f"XID {self.xid} ({self.info.title})" if self.xid is not None else self.info.title
        times = f" x{self.count}" if self.count > 1 else ""
        return f"{what}{times} on {self.device.type} {self.device.id}: {self.info.meaning}"


def _code_of(metric: str, attrs: dict[str, str]) -> tuple[str, int | None] | None:
    """The event code a counter sample stands for; None when it is no event."""
    if metric == "hw.gpu.xid.errors":
        try:
            xid = int(attrs.get("hw.gpu.xid", ""))
        except ValueError:
            return None
        return f"xid.{xid}", xid
    if metric == "hw.errors":
        kind = attrs.get("error.type", "")
        if kind == "ecc_uncorrected":
            return "ecc_uncorrected", None
        if kind == "link_downed":
            return "link_down", None
    return None


_COUNTERS = ("hw.gpu.xid.errors", "hw.errors")
_WATCHED = frozenset((*_COUNTERS, "hw.status", "hw.gpu.memory.row_remap.failed", "hw.network.up"))
"""The only series an event can come from: the rest of a cycle's samples are not kept."""


class EventDetector:
    """Keeps last cycle's values; `detect(snapshot)` returns this cycle's events."""

    def __init__(self) -> None:
        self._values: dict[_Key, float] | None = None
        self._devices: set[str] = set()

    def detect(self, snapshot: Snapshot) -> list[DeviceEvent]:
        values: dict[_Key, float] = {}
        for joined in snapshot.devices:
            reading = joined.reading
            device_id, layout = reading.device.id, reading.layout
            for metric, attributes, value in zip(
                layout.metrics, layout.attributes, reading.values, strict=True
            ):
                if metric in _WATCHED:
                    values[(device_id, metric, attributes)] = value
        previous, seen_before = self._values, self._devices
        self._values = values
        self._devices = {d.reading.device.id for d in snapshot.devices}
        if previous is None:
            return []
        found: dict[tuple[str, str], tuple[int, int | None]] = {}
        for (device_id, code, xid), count in _changes(values, previous, seen_before):
            if count <= 0:
                continue
            total, _ = found.get((device_id, code), (0, xid))
            # a link that went down shows twice (link_downed grew, the port is not up)
            total = max(total, count) if code == "link_down" else total + count
            found[(device_id, code)] = (total, xid)
        devices = {d.reading.device.id: d.reading.device for d in snapshot.devices}
        events = []
        for (device_id, code), (count, xid) in sorted(found.items()):
            info = xid_code(xid) if xid is not None else EVENTS[code]
            holders, uids = holders_of(snapshot, device_id)
            events.append(
                DeviceEvent(
                    devices[device_id], code, info, count, holders, uids, snapshot.timestamp, xid
                )
            )
        return events


def _changes(
    values: dict[_Key, float], previous: dict[_Key, float], seen_before: set[str]
) -> Iterator[tuple[tuple[str, str, int | None], int]]:
    for key, value in values.items():
        device_id, metric, attributes = key
        attrs = dict(attributes)
        before = previous.get(key)
        if metric in _COUNTERS:
            code = _code_of(metric, attrs)
            if code is None:
                continue
            if before is None:
                increase = value if device_id in seen_before else 0.0
            else:
                increase = value - before if value >= before else value
            yield (device_id, code[0], code[1]), int(increase)
        elif metric == "hw.status" and attrs.get("hw.state") == "failed":
            if value >= 1 and (before or 0.0) < 1 and device_id in seen_before:
                yield (device_id, "gpu_failed", None), 1
        elif metric == "hw.gpu.memory.row_remap.failed":
            if value >= 1 and (before or 0.0) < 1 and device_id in seen_before:
                yield (device_id, "row_remap_failed", None), 1
        elif metric == "hw.network.up" and value < 1 and before is not None and before >= 1:
            yield (device_id, "link_down", None), 1


def holders_of(
    snapshot: Snapshot, device_id: str
) -> tuple[tuple[Holder, ...], tuple[tuple[str, str, str], ...]]:
    """Every container holding `device_id` or a slice of it (PodResources), or whose
    processes use it (process attribution), sorted; and the pod UIDs known for them."""
    family = {device_id} | {
        d.reading.device.id for d in snapshot.devices if d.reading.device.parent == device_id
    }
    holders = {a.holder for a in snapshot.allocations if a.device_id in family}
    uids: dict[tuple[str, str], str] = {}
    for usage in snapshot.container_usage:
        if usage.owner is not None and usage.device_id in family:
            holders.add(usage.owner.holder)
            if usage.owner.pod_uid:
                uids[(usage.owner.namespace, usage.owner.pod)] = usage.owner.pod_uid
    for pod in snapshot.pods:
        uid = dict(pod.attributes).get("k8s.pod.uid")
        if uid:
            uids.setdefault((pod.namespace, pod.pod), uid)
    pods = {(h.namespace, h.pod) for h in holders}
    known = tuple(sorted((ns, name, uid) for (ns, name), uid in uids.items() if (ns, name) in pods))
    return tuple(sorted(holders)), known


Publisher = Callable[[Sequence[DeviceEvent]], None]


class EventHub:
    """A snapshot sink: detects each cycle's device events once and hands them to every
    publisher (OTLP log records, Kubernetes Events); counts them by class."""

    def __init__(self, publishers: Sequence[Publisher] = ()) -> None:
        self.detector = EventDetector()
        self.publishers = list(publishers)
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def update(self, snapshot: Snapshot) -> None:
        events = self.detector.detect(snapshot)
        if not events:
            return
        with self._lock:
            self._counts.update(e.info.klass for e in events)
        for publish in self.publishers:
            try:
                publish(events)
            except Exception:  # one publisher's bug must not stop the other or the cycle
                log.exception("publishing %d device events failed", len(events))

    def self_samples(self) -> tuple[Sample, ...]:
        with self._lock:
            counts = sorted(self._counts.items())
        return tuple(
            Sample("kube_device_exporter.device.events", float(n), (("hw.event.class", k),))
            for k, n in counts
        )
