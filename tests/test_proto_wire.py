"""Our PodResources stubs against the kubelet's wire format, field by field.

EXPECTED is transcribed from the kubelet's own definitions (kubernetes/kubernetes
`staging/src/k8s.io/kubelet/pkg/apis/podresources/{v1,v1alpha1}/api.proto`). Two checks: the
descriptors say exactly that, and a fully populated message, serialized by our stubs
and decoded here by a tiny independent wire parser, puts every value under the
expected field number with the expected wire type.
"""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor

from exporter._proto.podresources.v1 import api_pb2 as v1
from exporter._proto.podresources.v1alpha1 import api_pb2 as v1alpha1

S, I64, U64, MSG = "string", "int64", "uint64", "message"
REP, OPT, ONE = "repeated", "optional", "singular"

EXPECTED: dict[str, dict[str, tuple[int, str, str, str]]] = {
    # message: field -> (number, type, label, message type)
    "v1.AllocatableResourcesRequest": {},
    "v1.AllocatableResourcesResponse": {
        "devices": (1, MSG, REP, "v1.ContainerDevices"),
        "cpu_ids": (2, I64, REP, ""),
        "memory": (3, MSG, REP, "v1.ContainerMemory"),
    },
    "v1.ListPodResourcesRequest": {},
    "v1.ListPodResourcesResponse": {"pod_resources": (1, MSG, REP, "v1.PodResources")},
    "v1.PodResources": {
        "name": (1, S, ONE, ""),
        "namespace": (2, S, ONE, ""),
        "containers": (3, MSG, REP, "v1.ContainerResources"),
        "cpu_ids": (4, I64, REP, ""),
        "memory": (5, MSG, REP, "v1.ContainerMemory"),
    },
    "v1.ContainerResources": {
        "name": (1, S, ONE, ""),
        "devices": (2, MSG, REP, "v1.ContainerDevices"),
        "cpu_ids": (3, I64, REP, ""),
        "memory": (4, MSG, REP, "v1.ContainerMemory"),
        "dynamic_resources": (5, MSG, REP, "v1.DynamicResource"),
    },
    "v1.ContainerMemory": {
        "memory_type": (1, S, ONE, ""),
        "size": (2, U64, ONE, ""),
        "topology": (3, MSG, ONE, "v1.TopologyInfo"),
    },
    "v1.ContainerDevices": {
        "resource_name": (1, S, ONE, ""),
        "device_ids": (2, S, REP, ""),
        "topology": (3, MSG, ONE, "v1.TopologyInfo"),
    },
    "v1.TopologyInfo": {"nodes": (1, MSG, REP, "v1.NUMANode")},
    "v1.NUMANode": {"ID": (1, I64, ONE, "")},
    "v1.DynamicResource": {
        "claim_name": (2, S, ONE, ""),
        "claim_namespace": (3, S, ONE, ""),
        "claim_resources": (4, MSG, REP, "v1.ClaimResource"),
    },
    "v1.ClaimResource": {
        "cdi_devices": (1, MSG, REP, "v1.CDIDevice"),
        "driver_name": (2, S, ONE, ""),
        "pool_name": (3, S, ONE, ""),
        "device_name": (4, S, ONE, ""),
        "share_id": (5, S, OPT, ""),
    },
    "v1.CDIDevice": {"name": (1, S, ONE, "")},
    "v1.GetPodResourcesRequest": {"pod_name": (1, S, ONE, ""), "pod_namespace": (2, S, ONE, "")},
    "v1.GetPodResourcesResponse": {"pod_resources": (1, MSG, ONE, "v1.PodResources")},
    "v1alpha1.ListPodResourcesRequest": {},
    "v1alpha1.ListPodResourcesResponse": {"pod_resources": (1, MSG, REP, "v1alpha1.PodResources")},
    "v1alpha1.PodResources": {
        "name": (1, S, ONE, ""),
        "namespace": (2, S, ONE, ""),
        "containers": (3, MSG, REP, "v1alpha1.ContainerResources"),
    },
    "v1alpha1.ContainerResources": {
        "name": (1, S, ONE, ""),
        "devices": (2, MSG, REP, "v1alpha1.ContainerDevices"),
    },
    "v1alpha1.ContainerDevices": {
        "resource_name": (1, S, ONE, ""),
        "device_ids": (2, S, REP, ""),
    },
}

METHODS = {
    "/v1.PodResourcesLister/List",
    "/v1.PodResourcesLister/GetAllocatableResources",
    "/v1.PodResourcesLister/Get",
    "/v1alpha1.PodResourcesLister/List",
}

_TYPES = {
    FieldDescriptor.TYPE_STRING: S,
    FieldDescriptor.TYPE_INT64: I64,
    FieldDescriptor.TYPE_UINT64: U64,
    FieldDescriptor.TYPE_MESSAGE: MSG,
}


def _all_messages() -> dict[str, Any]:
    out = {}
    for module in (v1, v1alpha1):
        for name, desc in module.DESCRIPTOR.message_types_by_name.items():
            out[f"{module.DESCRIPTOR.package}.{name}"] = desc
    return out


def test_every_message_and_field_matches_the_reference() -> None:
    messages = _all_messages()
    assert set(messages) == set(EXPECTED)
    for name, fields in EXPECTED.items():
        desc = messages[name]
        actual = {}
        for f in desc.fields:
            label = (
                REP
                if f.is_repeated
                else (OPT if f.has_presence and f.type != FieldDescriptor.TYPE_MESSAGE else ONE)
            )
            msg_type = f.message_type.full_name if f.message_type else ""
            actual[f.name] = (f.number, _TYPES[f.type], label, msg_type)
        assert actual == fields, name
    # DynamicResource field 1 (class_name) is tombstoned, not reused.
    assert messages["v1.DynamicResource"].fields_by_number.get(1) is None


def test_service_methods() -> None:
    methods = set()
    for module in (v1, v1alpha1):
        for service in module.DESCRIPTOR.services_by_name.values():
            methods |= {f"/{service.full_name}/{m.name}" for m in service.methods}
    assert methods == METHODS


# --- an independent wire parser ------------------------------------------------------------


def _varint(data: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = data[i]
        result |= (b & 0x7F) << shift
        i += 1
        if not b & 0x80:
            return result, i
        shift += 7


def parse_wire(data: bytes) -> list[tuple[int, int, Any]]:
    """Bytes -> [(field number, wire type, int or bytes)] (no schema involved)."""
    out: list[tuple[int, int, Any]] = []
    i = 0
    while i < len(data):
        value: int | bytes
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 2:
            length, i = _varint(data, i)
            value, i = data[i : i + length], i + length
        else:
            raise AssertionError(f"unexpected wire type {wire}")
        out.append((number, wire, value))
    return out


def _packed(data: bytes) -> list[int]:
    values, i = [], 0
    while i < len(data):
        v, i = _varint(data, i)
        values.append(v)
    return values


def check(message: str, data: bytes, values: dict[str, Any]) -> None:
    """Every expected field's value is found under its number with the right wire type."""
    fields = EXPECTED[message]
    seen: dict[int, list[tuple[int, Any]]] = {}
    for number, wire, value in parse_wire(data):
        seen.setdefault(number, []).append((wire, value))
    assert set(seen) <= {n for n, *_ in fields.values()}, (message, set(seen))
    for name, want in values.items():
        number, kind, label, msg_type = fields[name]
        got = seen.get(number, [])
        if kind == S:
            assert all(w == 2 for w, _ in got)
            decoded = [v.decode() for _, v in got]
            assert decoded == (want if label == REP else [want]), (message, name)
        elif kind in (I64, U64):
            if label == REP:
                assert [w for w, _ in got] == [2], (message, name, "packed")
                assert _packed(got[0][1]) == want
            else:
                assert got == [(0, want)], (message, name)
        else:
            wants = want if label == REP else [want]
            assert len(got) == len(wants), (message, name)
            for (wire, raw), sub in zip(got, wants, strict=True):
                assert wire == 2
                check(msg_type, raw, sub)


def test_list_response_on_the_wire() -> None:
    topo = v1.TopologyInfo(nodes=[v1.NUMANode(ID=1), v1.NUMANode(ID=3)])
    msg = v1.ListPodResourcesResponse(
        pod_resources=[
            v1.PodResources(
                name="p",
                namespace="ns",
                cpu_ids=[7],
                memory=[v1.ContainerMemory(memory_type="memory", size=5)],
                containers=[
                    v1.ContainerResources(
                        name="c",
                        devices=[
                            v1.ContainerDevices(
                                resource_name="nvidia.com/gpu",
                                device_ids=["GPU-a::0", "GPU-b"],
                                topology=topo,
                            )
                        ],
                        cpu_ids=[2, 3],
                        memory=[
                            v1.ContainerMemory(
                                memory_type="hugepages-2Mi", size=2**40, topology=topo
                            )
                        ],
                        dynamic_resources=[
                            v1.DynamicResource(
                                claim_name="cl",
                                claim_namespace="ns",
                                claim_resources=[
                                    v1.ClaimResource(
                                        cdi_devices=[v1.CDIDevice(name="vendor.com/gpu=g1")],
                                        driver_name="gpu.nvidia.com",
                                        pool_name="node-a",
                                        device_name="gpu-1",
                                        share_id="x",
                                    )
                                ],
                            )
                        ],
                    )
                ],
            )
        ]
    )
    numa = {"nodes": [{"ID": 1}, {"ID": 3}]}
    check(
        "v1.ListPodResourcesResponse",
        msg.SerializeToString(),
        {
            "pod_resources": [
                {
                    "name": "p",
                    "namespace": "ns",
                    "cpu_ids": [7],
                    "memory": [{"memory_type": "memory", "size": 5}],
                    "containers": [
                        {
                            "name": "c",
                            "devices": [
                                {
                                    "resource_name": "nvidia.com/gpu",
                                    "device_ids": ["GPU-a::0", "GPU-b"],
                                    "topology": numa,
                                }
                            ],
                            "cpu_ids": [2, 3],
                            "memory": [
                                {"memory_type": "hugepages-2Mi", "size": 2**40, "topology": numa}
                            ],
                            "dynamic_resources": [
                                {
                                    "claim_name": "cl",
                                    "claim_namespace": "ns",
                                    "claim_resources": [
                                        {
                                            "cdi_devices": [{"name": "vendor.com/gpu=g1"}],
                                            "driver_name": "gpu.nvidia.com",
                                            "pool_name": "node-a",
                                            "device_name": "gpu-1",
                                            "share_id": "x",
                                        }
                                    ],
                                }
                            ],
                        }
                    ],
                }
            ]
        },
    )


def test_allocatable_and_get_on_the_wire() -> None:
    alloc = v1.AllocatableResourcesResponse(
        devices=[v1.ContainerDevices(resource_name="amd.com/gpu", device_ids=["0000:19:00.0"])],
        cpu_ids=[0, 1, 2],
        memory=[v1.ContainerMemory(memory_type="memory", size=9)],
    )
    check(
        "v1.AllocatableResourcesResponse",
        alloc.SerializeToString(),
        {
            "devices": [{"resource_name": "amd.com/gpu", "device_ids": ["0000:19:00.0"]}],
            "cpu_ids": [0, 1, 2],
            "memory": [{"memory_type": "memory", "size": 9}],
        },
    )
    req = v1.GetPodResourcesRequest(pod_name="p", pod_namespace="ns")
    check(
        "v1.GetPodResourcesRequest",
        req.SerializeToString(),
        {"pod_name": "p", "pod_namespace": "ns"},
    )


@pytest.mark.parametrize("share_id", [None, ""])
def test_optional_share_id_presence(share_id: str | None) -> None:
    """`optional` keeps presence: an explicit empty share_id is on the wire, an unset one is not."""
    res = v1.ClaimResource(driver_name="d", share_id=share_id)
    numbers = [n for n, _, _ in parse_wire(res.SerializeToString())]
    assert (5 in numbers) == (share_id is not None)


def test_v1alpha1_is_wire_compatible_with_v1() -> None:
    old = v1alpha1.ListPodResourcesResponse(
        pod_resources=[
            v1alpha1.PodResources(
                name="p",
                namespace="ns",
                containers=[
                    v1alpha1.ContainerResources(
                        name="c",
                        devices=[v1alpha1.ContainerDevices(resource_name="r", device_ids=["d"])],
                    )
                ],
            )
        ]
    )
    new = v1.ListPodResourcesResponse.FromString(old.SerializeToString())
    device = new.pod_resources[0].containers[0].devices[0]
    assert (device.resource_name, list(device.device_ids)) == ("r", ["d"])
