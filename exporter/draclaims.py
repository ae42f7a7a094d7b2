"""The join's two questions about DRA claims, answered from what exporter/dra.py found in the
ResourceSlices: which device a claimed (driver, pool, device) is, and on which NUMA node.
Kept apart from dra.py so the join can ask without importing it (dra.py uses the join's ID
helpers)."""

from __future__ import annotations

from collections.abc import Mapping

from exporter.model import ClaimResource, Container

DeviceKey = tuple[str, str, str]
"""(driver, pool, device name), as PodResources and the slices name a DRA device."""


def dra_ids(dra: Mapping[DeviceKey, str] | None, res: ClaimResource) -> list[str]:
    """The join's answer for a claimed device the slices know ([hw.id], [""] for one no
    source has); [] when they do not know it (the join then looks it up by name)."""
    key = (res.driver_name, res.pool_name, res.device_name)
    return [dra[key]] if dra is not None and key in dra else []


def dra_placements(container: Container, numa: Mapping[DeviceKey, int]) -> set[tuple[str, int]]:
    """(driver, NUMA node) of each DRA device a container holds whose slice says its node."""
    return {
        (r.driver_name, numa[key])
        for claim in container.dynamic_resources
        for r in claim.claim_resources
        if (key := (r.driver_name, r.pool_name, r.device_name)) in numa
    }
