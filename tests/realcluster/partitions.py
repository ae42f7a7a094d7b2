"""A partitionable GPU as NVIDIA's DRA driver publishes it (KEP-4815, dynamic MIG), for the
tests' own DRA driver, and the MIG device that driver makes when it prepares a partition.

Shapes from kubernetes-sigs/dra-driver-nvidia-gpu at 95932046, `cmd/gpu-kubelet-plugin`:

- partitions.go: one CounterSet per GPU, `<canonical name>-counter-set`
  (`GetSharedCounterSetName`), a counter per capacity dimension (`capacitiesToCounters`:
  the capacity name in DNS form) and one `memory-slice-N` counter of 1 per memory slice
  (`addCountersForMemSlices`); the whole GPU consumes all of them (`PartConsumesCounters`),
  a MIG placement its profile's capacities and the slices of its placement
  (`MigSpec.PartConsumesCounters`). The counters are a slice of their own in the pool: the
  API server refuses both in one slice (control-plane.md fact 13).
- mig.go: a placement is named `gpu-<minor>-mig-<profile without dots>-<GI profile ID>-
  <placement start>` (`MigSpecTuple.ToCanonicalName`) and carries `type: mig`,
  `parentUUID`, `profile` and the parent's product attributes (`CommonAttributesMig`), no
  UUID: the MIG device does not exist until a claim is prepared.
- nvlib.go `createMigDevice`: at prepare the driver makes the GPU instance at that profile and
  placement, then its compute instance; the MIG UUID is known only then.

Profiles of an H100 80GB (NVIDIA's MIG user guide: 1g.10gb is GI profile 19 at starts 0-6,
3g.40gb profile 9 at starts 0 and 4, on 8 memory slices; 16 and 60 of 132 SMs).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

MEMORY_SLICES = 8
MULTIPROCESSORS = 132
GIB = 2**30


@dataclass(frozen=True)
class Profile:
    name: str
    profile_id: int
    size: int
    """Memory slices a placement occupies."""
    multiprocessors: int
    memory_gib: int
    starts: tuple[int, ...]


PROFILES = (
    Profile("1g.10gb", 19, 1, 16, 10, (0, 1, 2, 3, 4, 5, 6)),
    Profile("3g.40gb", 9, 4, 60, 40, (0, 4)),
)
NAME = re.compile(r"^gpu-(?P<minor>\d+)-mig-(?P<profile>.+)-(?P<id>\d+)-(?P<start>\d+)$")


def counter_set(minor: int) -> str:
    return f"gpu-{minor}-counter-set"


def placement_name(minor: int, profile: Profile, start: int) -> str:
    return f"gpu-{minor}-mig-{profile.name.replace('.', '')}-{profile.profile_id}-{start}"


def _slices(start: int, size: int) -> dict[str, dict[str, str]]:
    return {f"memory-slice-{i}": {"value": "1"} for i in range(start, start + size)}


def shared_counters(minor: int) -> list[dict[str, Any]]:
    """The pool's counter slice's `sharedCounters`."""
    counters = {"multiprocessors": {"value": str(MULTIPROCESSORS)},
                "memory": {"value": "80Gi"}, **_slices(0, MEMORY_SLICES)}  # fmt: skip
    return [{"name": counter_set(minor), "counters": counters}]


def devices(minor: int, uuid: str, attributes: dict[str, Any]) -> list[dict[str, Any]]:
    """The whole GPU (`gpu-<minor>`, its `attributes`) and every placement of PROFILES."""
    whole = {
        "name": f"gpu-{minor}",
        "attributes": attributes,
        "capacity": {"memory": {"value": "80Gi"}},
        "consumesCounters": [{"counterSet": counter_set(minor),
                              "counters": shared_counters(minor)[0]["counters"]}],
    }  # fmt: skip
    parent: dict[str, Any] = {
        k: v for k, v in attributes.items() if k not in ("uuid", "type", "index", "minor")
    }
    out = [whole]
    for profile in PROFILES:
        for start in profile.starts:
            counters = {"multiprocessors": {"value": str(profile.multiprocessors)},
                        "memory": {"value": f"{profile.memory_gib}Gi"},
                        **_slices(start, profile.size)}  # fmt: skip
            out.append({
                "name": placement_name(minor, profile, start),
                "attributes": parent | {"type": {"string": "mig"},
                                        "parentUUID": {"string": uuid},
                                        "profile": {"string": profile.name}},
                "capacity": {"memory": {"value": f"{profile.memory_gib}Gi"},
                             "multiprocessors": {"value": str(profile.multiprocessors)}},
                "consumesCounters": [{"counterSet": counter_set(minor), "counters": counters}],
            })  # fmt: skip
    return out


def mig_of(device: str, serial: int) -> dict[str, Any] | None:
    """The stand-in NVML's `mig:` entry for the MIG device the driver makes when it prepares
    placement `device` (None for a device that is no placement); `serial` makes its UUID
    (a MIG UUID is new each time a slice is made)."""
    m = NAME.match(device)
    if m is None:
        return None
    (profile,) = [p for p in PROFILES if p.profile_id == int(m["id"])]
    start = int(m["start"])
    return {"uuid": f"MIG-5a3c0f00-0000-4000-8000-{serial:012x}", "profile": profile.name,
            "gi": 1 + serial, "ci": 0, "profile_id": profile.profile_id,
            "placement": {"start": start, "size": profile.size},
            "memory": profile.memory_gib * GIB * 39 // 40}  # fmt: skip
