"""Device health as the kubelet reports it per claim: `allocatedResourcesStatus` (KEP-4680).

The 1.36 kubelet writes what a DRA driver's health stream (`dra-health/v1alpha1`) says into
the pod's status: `status.containerStatuses[].allocatedResourcesStatus` =
`[{"name": "claim:<claim>[/<request>]", "resources": [{"resourceID": "<driver>/<pool>/
<device>" (or the first CDI ID), "health": "Healthy|Unhealthy|Unknown", "message": ...}]}]`
(control-plane.md, DRA item 5; `UpdateAllocatedResourcesStatus` in the kubelet's
pkg/kubelet/cm/dra/manager.go). PodResources does not carry it.

The entry names the pod's own reference to the claim (`spec.resourceClaims[].name`, e.g.
`claim:gpu`), not the ResourceClaim, whose name PodResources carries: a claim made from a
template is `<pod>-<reference>-<5 random characters>` (seen on the real 1.36 cluster,
tests/test_real_cluster_dra_driver.py: `claim:gpu` in the status, `trainer-gpu-9dfhr` in
List). The reference is turned into the ResourceClaim's name through the pod's
`status.resourceClaimStatuses` (template claims) and `spec.resourceClaims[].resourceClaimName`
(claims made beforehand), so both series name the same claim.

With `--kubernetes.dra` the pod watch asks for whole pods instead of their metadata
(client.py `KubeApi.full_pods`), and each pod's entries are parsed here on arrival: a health
change reaches the exporter with the watch event (about a second), at no request of its own.
"""

from __future__ import annotations

from typing import Any

from exporter.dra.extended import parse_extended
from exporter.model import ClaimHealth, ExtendedClaim


def claim_names(obj: dict[str, Any]) -> dict[str, str]:
    """A pod's claim references -> the ResourceClaims they name (those known so far)."""
    names = {}
    for ref in (obj.get("spec") or {}).get("resourceClaims") or ():
        if ref.get("resourceClaimName"):
            names[str(ref.get("name", ""))] = str(ref["resourceClaimName"])
    for ref in (obj.get("status") or {}).get("resourceClaimStatuses") or ():
        if ref.get("resourceClaimName"):
            names[str(ref.get("name", ""))] = str(ref["resourceClaimName"])
    return names


def _claim(entry: str, names: dict[str, str]) -> str:
    """`<reference>[/<request>]` -> `<claim>[/<request>]`; a reference the pod does not
    resolve (yet) stays as it is."""
    ref, slash, request = entry.partition("/")
    return names.get(ref, ref) + slash + request


def parse_pod_health(obj: dict[str, Any]) -> tuple[ClaimHealth, ...]:
    """The claim entries of a pod's `allocatedResourcesStatus`; () for a metadata-only pod."""
    status = obj.get("status") or {}
    names = claim_names(obj)
    out = []
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(key) or ():
            for entry in cs.get("allocatedResourcesStatus") or ():
                name = str(entry.get("name", ""))
                if not name.startswith("claim:"):
                    continue  # device-plugin resources report here too (KEP-4680)
                for res in entry.get("resources") or ():
                    out.append(
                        ClaimHealth(
                            str(cs.get("name", "")),
                            _claim(name.removeprefix("claim:"), names),
                            str(res.get("resourceID", "")),
                            str(res.get("health", "Unknown")),
                            str(res.get("message", "") or ""),
                        )
                    )
    return tuple(sorted(out))


def read_pod_status(
    obj: dict[str, Any],
) -> tuple[tuple[ClaimHealth, ...], tuple[ExtendedClaim, ...]]:
    """What a whole pod's status says of its DRA claims: their health and the extended
    resources they serve. The pod watch calls it on each pod it decodes with
    `--kubernetes.dra` (handed in by the composition root: the API client knows no DRA)."""
    return parse_pod_health(obj), parse_extended(obj)
