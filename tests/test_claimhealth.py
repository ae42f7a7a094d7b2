"""Claim health (exporter/dra/claimhealth.py) names the ResourceClaim, as PodResources
does, where the kubelet's `allocatedResourcesStatus` names the pod's reference to it: the
shapes below are what the real 1.36 kubelet and API server wrote
(tests/test_real_cluster_dra_driver.py)."""

from __future__ import annotations

from typing import Any

from exporter.dra.claimhealth import parse_pod_health
from exporter.model import ClaimHealth

STATUS = [{"name": "claim:gpu", "resources": [
    {"resourceID": "gpu.kde.test/kde-083728/gpu-0", "health": "Unhealthy", "message": "XID 79"}]}]  # fmt: skip


def _pod(spec_claims: list[dict[str, str]], statuses: list[dict[str, str]],
         status: list[dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    return {"spec": {"resourceClaims": spec_claims},
            "status": {"resourceClaimStatuses": statuses,
                       "containerStatuses": [{"name": "c", "allocatedResourcesStatus": status}]}}  # fmt: skip


def test_a_template_claim_is_named_by_the_resource_claim_made_for_the_pod() -> None:
    pod = _pod([{"name": "gpu", "resourceClaimTemplateName": "whole"}],
               [{"name": "gpu", "resourceClaimName": "trainer-gpu-9dfhr"}], STATUS)  # fmt: skip
    assert parse_pod_health(pod) == (ClaimHealth(
        "c", "trainer-gpu-9dfhr", "gpu.kde.test/kde-083728/gpu-0", "Unhealthy", "XID 79"),)  # fmt: skip


def test_a_claim_made_beforehand_and_a_request_suffix() -> None:
    status = [{**STATUS[0], "name": "claim:gpu/big"}]
    pod = _pod([{"name": "gpu", "resourceClaimName": "shared-a100"}], [], status)
    (health,) = parse_pod_health(pod)
    assert health.claim == "shared-a100/big"


def test_a_reference_not_resolved_yet_stays_as_the_kubelet_wrote_it() -> None:
    pod = _pod([{"name": "gpu", "resourceClaimTemplateName": "whole"}], [], STATUS)
    (health,) = parse_pod_health(pod)
    assert health.claim == "gpu"
