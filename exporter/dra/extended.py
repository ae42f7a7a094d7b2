"""Extended resources served by DRA (KEP-5004, gate `DRAExtendedResource`, beta and on by
default in 1.36): which extended resource a pod asked for, where a DRA claim holds it.

A pod asking for an extended resource (`example.com/gpu: 1` in `resources.limits`) that a
DeviceClass serves (`spec.extendedResourceName`) gets a ResourceClaim the scheduler makes,
which the pod never names. The real 1.36 cluster (tests/test_real_cluster_dra_extended.py,
docs/dra.md) wrote, for a pod `ext-a` whose containers `c` and `d` each asked for one:

    "extendedResourceClaimStatus": {
      "requestMappings": [
        {"containerName": "c", "resourceName": "example.com/gpu",
         "requestName": "container-0-request-0"},
        {"containerName": "d", "resourceName": "example.com/gpu",
         "requestName": "container-1-request-0"}],
      "resourceClaimName": "ext-a-extended-resources-nf5q2"}

and PodResources lists that claim (`ext-a-extended-resources-nf5q2`) in `dynamic_resources`
of each container, with no request names and nothing of `example.com/gpu`. So the resource
name is known only from the pod's status, read here from the whole pods the watch already
gets with `--kubernetes.dra`.
"""

from __future__ import annotations

from typing import Any

from exporter.model import ExtendedClaim


def parse_extended(obj: dict[str, Any]) -> tuple[ExtendedClaim, ...]:
    """(claim, container, resource, request) of a pod's `extendedResourceClaimStatus`, one
    per mapping (a container asking for two resources has two); () when there is none."""
    status = (obj.get("status") or {}).get("extendedResourceClaimStatus") or {}
    claim = str(status.get("resourceClaimName", "") or "")
    if not claim:
        return ()
    return tuple(
        sorted(
            {
                ExtendedClaim(
                    claim,
                    str(m.get("containerName", "")),
                    str(m["resourceName"]),
                    str(m.get("requestName", "") or ""),
                )
                for m in status.get("requestMappings") or ()
                if m.get("resourceName")
            }
        )
    )
