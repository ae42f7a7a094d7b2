"""A cgroup root of our own in every hierarchy, so a kubelet's `kubepods` is ours alone.

docs/real-node.md, "Keeping to itself": with `cgroupRoot: /NAME` the kubelet puts
`kubepods` under `/NAME` in every v1 hierarchy; create `/NAME` first, and copy
`cpuset.cpus` and `cpuset.mems` from the parent, or its cpuset children take no tasks.
On a hybrid host runc also mirrors the path in the v2 (unified) hierarchy.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.realnode.procs import kill_and_wait, pids_in_cgroup


def hierarchies(mounts: Path = Path("/proc/self/mounts")) -> list[Path]:
    """Mount points of every cgroup (v1) and cgroup2 hierarchy."""
    found = []
    for line in mounts.read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] in ("cgroup", "cgroup2"):
            found.append(Path(fields[1]))
    return found


def create_root(name: str) -> None:
    for hierarchy in hierarchies():
        path = hierarchy / name
        path.mkdir(exist_ok=True)
        for key in ("cpuset.cpus", "cpuset.mems"):
            if (hierarchy / key).exists():
                (path / key).write_text((hierarchy / key).read_text())


def remove_root(name: str) -> list[str]:
    """Kill what still runs under `/NAME`, remove its cgroups deepest first; what could not
    be removed."""
    kill_and_wait(pids_in_cgroup(name))
    left = []
    for hierarchy in hierarchies():
        root = hierarchy / name
        if not root.is_dir():
            continue
        for folder, dirs, _ in sorted(os.walk(root), key=lambda w: -w[0].count("/")):
            del dirs
            try:
                os.rmdir(folder)
            except OSError as exc:
                left.append(f"{folder}: {exc.strerror}")
    return left


def leftovers(name: str) -> list[Path]:
    """Our cgroups that still exist, in any hierarchy."""
    return [h / name for h in hierarchies() if (h / name).exists()]
