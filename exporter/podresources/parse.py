"""PodResources answers -> the model, in one order whatever order the kubelet sent.

The real kubelet sends pods, containers and devices in a different order on each call
(map iteration) and one `ContainerDevices` per device, each with its own topology
(docs/podresources.md, real kubelet K1, K2). The model is built canonical: pods
by namespace and name, containers by name, and a container's devices merged per (resource,
NUMA nodes) with their IDs sorted, so the same kubelet state is the same `Pod` values on
every call (the poller's join cache compares them) and no information is lost.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from typing import Any

from exporter.model import (
    ClaimResource,
    Container,
    ContainerDevices,
    ContainerMemory,
    DynamicResource,
    Pod,
)


def _numa(topology: Any) -> tuple[int, ...]:
    """NUMA node IDs, sorted; node 0 arrives as `nodes { }` (proto3 omits the default ID,
    real kubelet K11) and reads as 0."""
    return tuple(sorted(node.ID for node in topology.nodes)) if topology is not None else ()


MAX_DEVICE_ID_BYTES = 1024
"""Device IDs are short (UUIDs, PCI addresses, `card1-4`); a longer one is garbage."""


def device_id_problem(raw: str) -> str:
    """Why a device ID from the kubelet cannot name a device; "" when it can."""
    if not raw.strip():
        return "empty"
    if len(raw.encode("utf-8", "surrogatepass")) > MAX_DEVICE_ID_BYTES:
        return f"longer than {MAX_DEVICE_ID_BYTES} bytes"
    if not raw.isprintable():
        return "control or unprintable characters"
    return ""


def _ids(raw_ids: Any, invalid: list[str] | None) -> tuple[str, ...]:
    """The usable IDs; the others are appended to `invalid` (counted and logged by the client)."""
    ids = []
    for raw in raw_ids:
        if device_id_problem(raw):
            if invalid is not None:
                invalid.append(raw)
        else:
            ids.append(raw)
    return tuple(ids)


def merge_devices(entries: Any, invalid: list[str] | None = None) -> tuple[ContainerDevices, ...]:
    """`ContainerDevices` messages (one per device from a real kubelet, one per resource from
    older ones) -> one entry per (resource, NUMA nodes), IDs sorted, entries sorted."""
    groups: defaultdict[tuple[str, tuple[int, ...]], list[str]] = defaultdict(list)
    for msg in entries:
        has_topology = "topology" in _fields(msg.DESCRIPTOR) and msg.HasField("topology")
        key = (msg.resource_name, _numa(msg.topology if has_topology else None))
        groups[key].extend(_ids(msg.device_ids, invalid))
    return tuple(
        ContainerDevices(resource, tuple(sorted(ids)), numa)
        for (resource, numa), ids in sorted(groups.items())
    )


def parse_list(response_type: Any, raw: bytes, invalid: list[str]) -> tuple[Pod, ...]:
    """A List answer's bytes -> pods, sorted by namespace and name."""
    response = response_type.FromString(raw)
    pods = [pod_from_proto(p, invalid) for p in response.pod_resources]
    pods.sort(key=lambda p: (p.namespace, p.name))
    return tuple(pods)


def parse_allocatable(
    raw: bytes, response_type: Any, invalid: list[str]
) -> tuple[ContainerDevices, ...]:
    """A GetAllocatableResources answer's bytes -> devices merged per (resource, NUMA nodes)."""
    return merge_devices(response_type.FromString(raw).devices, invalid)


@functools.cache
def _fields(descriptor: Any) -> frozenset[str]:
    """Field names of a message type, looked up once per type (not once per container)."""
    return frozenset(f.name for f in descriptor.fields)


def _claim_from_proto(d: Any, invalid: list[str] | None) -> DynamicResource:
    resources = [
        ClaimResource(
            r.driver_name,
            r.pool_name,
            r.device_name,
            tuple(cdi.name for cdi in r.cdi_devices),
            r.share_id if r.HasField("share_id") else "",
        )
        for r in d.claim_resources
        if r.device_name in _ids((r.device_name,), invalid)
    ]
    resources.sort(key=lambda r: (r.driver_name, r.pool_name, r.device_name, r.share_id))
    return DynamicResource(d.claim_name, d.claim_namespace, tuple(resources))


def pod_from_proto(msg: Any, invalid: list[str] | None = None) -> Pod:
    """A v1 or v1alpha1 PodResources message -> Pod (v1alpha1 has only devices).

    Canonical whatever order the kubelet sent (module docstring). Empty or malformed device
    IDs are left out and appended to `invalid`."""
    containers = []
    for c in msg.containers:
        devices = merge_devices(c.devices, invalid)
        if "cpu_ids" not in _fields(c.DESCRIPTOR):
            containers.append(Container(c.name, devices))
            continue
        memory = tuple(
            sorted(
                (ContainerMemory(m.memory_type, m.size, _numa(m.topology)) for m in c.memory),
                key=lambda m: (m.memory_type, m.size_bytes, m.numa_nodes),
            )
        )
        dynamic = tuple(
            sorted(
                (_claim_from_proto(d, invalid) for d in c.dynamic_resources),
                key=lambda d: (d.claim_namespace, d.claim_name),
            )
        )
        cpu_ids = tuple(sorted(c.cpu_ids))
        containers.append(Container(c.name, devices, cpu_ids, memory, dynamic))
    containers.sort(key=lambda c: c.name)
    return Pod(msg.name, msg.namespace, tuple(containers))


# --- order-free change check ---------------------------------------------------------------

Schema = dict[int, "Schema | None"]
_TOPOLOGY: Schema = {1: {}}  # TopologyInfo.nodes -> NUMANode
_MEMORY: Schema = {3: _TOPOLOGY}  # ContainerMemory.topology
LIST_SCHEMA: Schema = {
    1: {  # ListPodResourcesResponse.pod_resources -> PodResources
        3: {  # .containers -> ContainerResources
            2: {3: _TOPOLOGY},  # .devices -> ContainerDevices
            4: _MEMORY,  # .memory
            5: {4: {1: {}}},  # .dynamic_resources -> .claim_resources -> .cdi_devices
        },
        5: _MEMORY,  # PodResources.memory
    }
}
"""Field numbers that hold messages in a v1 (or v1alpha1: a subset) List answer; the
others are leaves. From proto/podresources/v1/api.proto."""


MAX_VARINT_BYTES = 10
"""A protobuf varint holds at most 64 bits: 10 bytes of 7."""


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    """The varint at `i` and the index after it; ValueError past 10 bytes, so a run of
    continuation bytes (an answer of 0xFF) costs 10 steps, not a number as long as the run."""
    end = min(i + MAX_VARINT_BYTES, len(buf))
    shift = value = 0
    while i < end:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7
    raise ValueError("a varint longer than 10 bytes, or cut short, in a PodResources answer")


def _records(buf: bytes) -> list[tuple[int, bytes, bytes]]:
    """(field number, tag-and-length bytes, payload) of each field record in `buf`."""
    out = []
    i, end = 0, len(buf)
    while i < end:
        start = i
        tag, i = _varint(buf, i)
        wire = tag & 7
        if wire == 2:
            size, j = _varint(buf, i)
            out.append((tag >> 3, buf[start:j], buf[j : j + size]))
            i = j + size
            continue
        if wire == 0:
            _, i = _varint(buf, i)
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise ValueError(f"wire type {wire} in a PodResources answer")
        out.append((tag >> 3, buf[start:i], b""))
    if i != end:
        raise ValueError("truncated PodResources answer")
    return out


def order_free_key(key: OrderFreeKey, raw: bytes) -> tuple[bytes, ...]:
    """`key(raw)`, or the bytes themselves when they are not a well-formed answer (the
    parse then says what is wrong with them)."""
    try:
        return key(raw)
    except (ValueError, IndexError):
        return (raw,)


def canonical_bytes(buf: bytes, schema: Schema) -> bytes:
    """`buf` with the records of every message sorted, sub-messages made canonical first:
    the same bytes for two encodings that differ only in the order of repeated entries."""
    parts = []
    for number, head, payload in _records(buf):
        sub = schema.get(number)
        parts.append(head + (canonical_bytes(payload, sub) if sub is not None else payload))
    parts.sort()
    return b"".join(parts)


class OrderFreeKey:
    """An order-insensitive key of a List answer's bytes, without parsing it.

    Each pod's record is made canonical once and remembered by its bytes: most pods have
    one container and one device or none, so their bytes repeat whatever the order and the
    memo answers; a pod whose containers or devices came in a new order is made canonical
    again. The memo keeps the pods of the last `keep` answers (a pod of two containers
    arrives in either of two orders)."""

    def __init__(self, keep: int = 4) -> None:
        self._memo: list[dict[bytes, bytes]] = [{} for _ in range(keep)]

    def __call__(self, raw: bytes) -> tuple[bytes, ...]:
        current: dict[bytes, bytes] = {}
        keys = []
        pod_schema = LIST_SCHEMA[1]
        for number, head, payload in _records(raw):
            if number != 1 or pod_schema is None:
                keys.append(head + payload)
                continue
            key = current.get(payload)
            if key is None:
                for old in self._memo:
                    key = old.get(payload)
                    if key is not None:
                        break
                else:
                    key = canonical_bytes(payload, pod_schema)
                current[payload] = key
            keys.append(key)
        self._memo = [current, *self._memo[:-1]]
        keys.sort()
        return tuple(keys)
