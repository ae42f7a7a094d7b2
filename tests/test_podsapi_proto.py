"""The vendored Pods API proto (proto/podsapi/v1alpha1) is the one the real 1.36 kubelet
serves: its descriptor, read out of the kubelet binary (Go registers every compiled proto's
FileDescriptorProto in the binary), equals ours but for the file name.

Tier: real peer (the kubelet binary, not run).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from exporter._proto.podsapi.v1alpha1 import api_pb2
from tests.realcluster import binaries

UPSTREAM_NAME = b"staging/src/k8s.io/kubelet/pkg/apis/pods/v1alpha1/api.proto"


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def embedded_descriptor(binary: Path) -> descriptor_pb2.FileDescriptorProto:
    """The FileDescriptorProto starting with field 1 (name) = UPSTREAM_NAME: fields are read
    while they are FileDescriptorProto fields (1-14, varint or length-delimited) in the
    ascending order Go writes them (the next descriptor starts again at field 1)."""
    data = binary.read_bytes()
    start = data.find(b"\n" + bytes([len(UPSTREAM_NAME)]) + UPSTREAM_NAME)
    assert start >= 0, f"{binary} holds no {UPSTREAM_NAME.decode()}"
    i, last = start, 1
    while i < len(data):
        key, j = _varint(data, i)
        if not last <= key >> 3 <= 14 or key & 7 not in (0, 2) or (i > start and key >> 3 == 1):
            break
        last = key >> 3
        size, j = _varint(data, j)
        i = j + size if key & 7 == 2 else j
    return descriptor_pb2.FileDescriptorProto.FromString(data[start:i])


def ours() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    api_pb2.DESCRIPTOR.CopyToProto(proto)
    return proto


def test_vendored_pods_api_equals_the_kubelets() -> None:
    if binaries.missing():
        pytest.skip(f"no Kubernetes 1.36 binary: {binaries.missing()}")
    kubelet = Path(binaries.components()["kubelet"][0])
    theirs = embedded_descriptor(kubelet)
    mine = ours()
    for proto in (theirs, mine):
        proto.ClearField("name")
        for message in proto.message_type:
            for f in message.field:
                f.ClearField("json_name")  # protoc-gen-go records it; Python's copy may not
    assert theirs == mine
    enum = {v.name: v.number for v in theirs.enum_type[0].value}
    assert enum == {"UNSPECIFIED": 0, "ADDED": 1, "MODIFIED": 2, "DELETED": 3,
                    "INITIAL_SYNC_COMPLETE": 4}  # fmt: skip
