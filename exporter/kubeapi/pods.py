"""A pod as the info series needs it, decoded from an API answer: its metadata (`PodMeta`), its
controlling owner (`OwnerRef`), a pod watch's event (`WatchEvent`). Decoding goes through
answers.py: typed values, or Unusable for a shape the API does not have (a list where labels
go, an owner reference without a uid), never a KeyError halfway through a list. The kubelet's
Pods API decodes its protobuf pods into the same values (podsapi.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from exporter.kubeapi.answers import (
    SHAPE_ERRORS,
    decoded,
    flag,
    get,
    labels,
    mapping,
    sequence,
    text,
)
from exporter.model import ClaimHealth, ExtendedClaim

PodStatusReader = Callable[
    [dict[str, Any]], tuple[tuple[ClaimHealth, ...], tuple[ExtendedClaim, ...]]
]
"""What a whole pod's status says of its DRA claims (`exporter.dra.claimhealth
.read_pod_status`), handed in by the composition root with `--kubernetes.dra`."""


@dataclass(frozen=True, slots=True)
class OwnerRef:
    kind: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class PodMeta:
    namespace: str
    name: str
    uid: str
    labels: tuple[tuple[str, str], ...] = ()
    owner: OwnerRef | None = None
    """The controlling owner reference (`controller: true`), if any."""
    health: tuple[ClaimHealth, ...] = ()
    """Its claims' `allocatedResourcesStatus`, when whole pods are read (`pod_status`)."""
    extended: tuple[ExtendedClaim, ...] = ()
    """Its `extendedResourceClaimStatus` (KEP-5004), when whole pods are read."""


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: str
    """ADDED, MODIFIED, DELETED or BOOKMARK (the Pods API: INITIAL_SYNC_COMPLETE, no version)."""
    resource_version: str
    pod: PodMeta | None = None
    """None for a BOOKMARK or INITIAL_SYNC_COMPLETE."""


def controller_of(meta: dict[str, Any], where: str = "the object") -> OwnerRef | None:
    """The controlling owner reference (`controller: true`) of an object's metadata: kind,
    name and uid, all required (the API validates them); Unusable otherwise."""
    refs = sequence(meta.get("ownerReferences"), f"{where}: ownerReferences")
    for i, ref in enumerate(refs):
        here = f"{where}: ownerReferences[{i}]"
        ref = mapping(ref, here)
        if flag(ref.get("controller"), f"{here}.controller"):
            return OwnerRef(
                text(ref.get("kind"), f"{here}.kind", required=True),
                text(ref.get("name"), f"{here}.name", required=True),
                text(ref.get("uid"), f"{here}.uid", required=True),
            )
    return None


def pod_meta(obj: Any, status: PodStatusReader | None = None) -> PodMeta:
    """A pod (or its PartialObjectMetadata) as the info series needs it; Unusable when it is
    not the shape the API gives."""
    meta = mapping(get(mapping(obj, "a pod"), "metadata"), "a pod's metadata")
    name = text(meta.get("name"), "a pod's metadata.name", required=True)
    namespace = text(meta.get("namespace"), f"pod {name}: metadata.namespace")
    where = f"pod {namespace}/{name}"
    uid = text(meta.get("uid"), f"{where}: metadata.uid", required=True)
    pod_labels = labels(meta.get("labels"), f"{where}: metadata.labels")
    owner = controller_of(meta, where)
    try:
        health, extended = status(obj) if status is not None else ((), ())
    except SHAPE_ERRORS as exc:
        raise decoded(f"{where}: its status", exc) from exc
    return PodMeta(namespace, name, uid, pod_labels, owner, health, extended)
