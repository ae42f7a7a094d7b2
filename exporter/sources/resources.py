"""Which source should see the devices of an extended resource, and what to fix when it
does not: one table for the poller's warning, `doctor` and the landing page."""

from __future__ import annotations

import fnmatch

RESOURCE_SOURCES = (
    ("nvidia.com/*", "nvml"),
    ("*.shared", "nvml"),
    ("amd.com/*", "amdgpu"),
    ("gpu.intel.com/*", "intel"),
    ("rdma/*", "rdma"),
    ("intel.com/*", "netdev"),
    ("mellanox.com/*", "netdev"),
    ("openshift.io/*", "netdev"),
)
"""Which source should see the devices of a resource (the default resource patterns)."""

_SYSFS_FIX = "mount the host's /sys read-only (deploy/: at /host/sys) and set --path.sysfs to it"
SOURCE_FIXES = {
    "nvml": "run the pod with runtimeClassName: nvidia (or the NVIDIA runtime as the node's "
    "default) and NVIDIA_VISIBLE_DEVICES=all, so libnvidia-ml.so.1 and /dev/nvidia* are there",
    "amdgpu": f"{_SYSFS_FIX}; the amdgpu kernel module must be loaded on the node",
    "intel": f"{_SYSFS_FIX}; the i915 or xe kernel module must be loaded on the node",
    "rdma": f"{_SYSFS_FIX}; for rdma/* shared pools also give --collector.rdma.pool-config",
    "netdev": f"{_SYSFS_FIX}; the PF's driver must have created the VFs (sriov_numvfs)",
}


def source_for(resource_name: str) -> str:
    """The source that should see the devices of `resource_name` ("" when none does)."""
    return next((s for p, s in RESOURCE_SOURCES if fnmatch.fnmatchcase(resource_name, p)), "")
