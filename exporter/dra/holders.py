"""Who holds which DRA device, once the claims are read: PodResources' answer narrowed before
the join. Pure.

PodResources lists every claim a container holds the same way (control-plane.md facts 12,
14; docs/dra.md, KEP-5004): an admin-access claim exactly like a workload's, and the whole
of an extended-resource claim under every container its request mappings name. The claim
says what the list cannot:

- a result with `adminAccess: true` (a monitoring agent's claim, allowed only in a namespace
  labelled `resource.kubernetes.io/admin-access: "true"`) does not make its container a
  holder of the device: it is set aside (`AdminHold`) and never joined, so the device keeps
  its workload's labels and the exporter, deployed with such a claim, never lists itself;
- an extended-resource claim's results name the request each device serves, and the pod's
  `requestMappings` which container made each request: each container keeps only its own
  devices.

A claim listed but not read yet (`pending`) is held back for a moment (claimread.py
`HOLD_SECONDS`), so an admin claim does not show as a holder for the cycles before its
first read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from exporter.dra.claims import Claim, ClaimKey
from exporter.model import (
    ClaimResource,
    Container,
    DynamicResource,
    ExtendedClaim,
    Holder,
    Pod,
    PodResourcesState,
)


@dataclass(frozen=True, slots=True)
class AdminHold:
    """A container holding a device through an admin-access claim: not a holder."""

    holder: Holder
    claim: str
    """`namespace/name`, as `hw_allocation_claim` names a claim."""
    resource: ClaimResource


@dataclass(frozen=True, slots=True)
class Narrowed:
    state: PodResourcesState
    admin: tuple[AdminHold, ...] = ()
    holders: Mapping[ClaimKey, tuple[Holder, ...]] | None = None
    """Every claim PodResources lists with devices -> the containers listing it."""


def serves(request: str, requests: set[str]) -> bool:
    """A result's request (`r` or, from a prioritized list, `r/sub`) is one of `requests`."""
    return request in requests or request.partition("/")[0] in requests


def narrow(
    state: PodResourcesState,
    claims: Mapping[ClaimKey, Claim],
    pending: Callable[[ClaimKey], bool],
    extended: Mapping[tuple[str, str], tuple[ExtendedClaim, ...]],
) -> Narrowed:
    """`claims`: what was read of each claim; `extended`: (namespace, pod) -> its
    `extendedResourceClaimStatus` mappings (with their request names)."""
    admin: list[AdminHold] = []
    holders: dict[ClaimKey, list[Holder]] = {}
    pods = []
    changed = False
    for pod in state.pods:
        if not any(c.dynamic_resources for c in pod.containers):
            pods.append(pod)
            continue
        mappings = extended.get((pod.namespace, pod.name), ())
        containers = []
        for container in pod.containers:
            holder = Holder(pod.namespace, pod.name, container.name)
            dynamic = []
            for dyn in container.dynamic_resources:
                key = (dyn.claim_namespace, dyn.claim_name)
                if dyn.claim_resources:
                    holders.setdefault(key, []).append(holder)
                kept = _kept(dyn, claims.get(key), pending=pending(key), holder=holder,
                             mappings=mappings, admin=admin)  # fmt: skip
                changed |= kept != dyn.claim_resources
                dynamic.append(replace(dyn, claim_resources=kept))
            containers.append(_with(container, dynamic))
        pods.append(Pod(pod.name, pod.namespace, tuple(containers)))
    out = replace(state, pods=tuple(pods)) if changed else state
    return Narrowed(out, tuple(admin), {k: tuple(v) for k, v in holders.items()})


def _kept(
    dyn: DynamicResource,
    claim: Claim | None,
    *,
    pending: bool,
    holder: Holder,
    mappings: tuple[ExtendedClaim, ...],
    admin: list[AdminHold],
) -> tuple[ClaimResource, ...]:
    if claim is None:
        return () if pending else dyn.claim_resources
    name = f"{dyn.claim_namespace}/{dyn.claim_name}"
    mine = {
        m.request
        for m in mappings
        if m.claim == dyn.claim_name and m.container == holder.container and m.request
    }
    kept = []
    for res in dyn.claim_resources:
        result = claim.result(res.driver_name, res.pool_name, res.device_name, res.share_id)
        if result is not None and result.admin_access:
            admin.append(AdminHold(holder, name, res))
        elif not mine or result is None or serves(result.request, mine):
            kept.append(res)
    return tuple(kept)


def _with(container: Container, dynamic: list[DynamicResource]) -> Container:
    if tuple(dynamic) == container.dynamic_resources:
        return container
    return replace(container, dynamic_resources=tuple(dynamic))
