"""Device health as the kubelet reports it per claim: `allocatedResourcesStatus` (KEP-4680).

The 1.36 kubelet writes what a DRA driver's health stream (`dra-health/v1alpha1`) says into
the pod's status: `status.containerStatuses[].allocatedResourcesStatus` =
`[{"name": "claim:<claim>[/<request>]", "resources": [{"resourceID": "<driver>/<pool>/
<device>" (or the first CDI ID), "health": "Healthy|Unhealthy|Unknown", "message": ...}]}]`
(control-plane.md, DRA item 5; `UpdateAllocatedResourcesStatus` in the kubelet's
pkg/kubelet/cm/dra/manager.go). PodResources does not carry it.

With `--kubernetes.dra` the pod watch asks for whole pods instead of their metadata
(client.py `KubeApi.full_pods`), and each pod's entries are parsed here on arrival: a health
change reaches the exporter with the watch event (about a second), at no request of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True, order=True)
class ClaimHealth:
    container: str
    claim: str
    """The status entry's name less `claim:` (`<claim>` or `<claim>/<request>`)."""
    resource_id: str
    health: str
    message: str = ""


def parse_pod_health(obj: dict[str, Any]) -> tuple[ClaimHealth, ...]:
    """The claim entries of a pod's `allocatedResourcesStatus`; () for a metadata-only pod."""
    status = obj.get("status") or {}
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
                            name.removeprefix("claim:"),
                            str(res.get("resourceID", "")),
                            str(res.get("health", "Unknown")),
                            str(res.get("message", "") or ""),
                        )
                    )
    return tuple(sorted(out))
