"""`/proc/<pid>/cgroup` -> (pod UID, container ID). Pure; never raises.

The formats, each from where it is made:

- The file: one line per hierarchy, `hierarchy-ID:controller-list:cgroup-path`; cgroup v2
  is always `0::$PATH` (kernel `Documentation/admin-guide/cgroup-v2.rst`); v1 has one line
  per controller hierarchy (`cgroups(7)`), hybrid systems have both.
- The pod cgroup (kubelet `pkg/kubelet/cm/cgroup_manager_linux.go`,
  `pod_container_manager_linux.go`): cgroupfs driver `/kubepods[/burstable|/besteffort]/pod<uid>`;
  systemd driver `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`
  with the UID's dashes escaped to `_` (Guaranteed pods have no QoS level). UIDs are
  RFC 4122 UUIDs, except static pods', which are 32 hex digits (kubelet
  `pkg/kubelet/config/common.go`, an md5 sum).
- The container cgroup, one level under the pod's: containerd `cri-containerd-<id>.scope`
  (systemd) or `<id>` (cgroupfs); CRI-O `crio-<id>.scope` / `crio-<id>` (CRI-O
  `internal/config/cgmgr`: `crioPrefix + "-" + containerID`), its monitor
  `crio-conmon-<id>.scope` (not the container); Docker/cri-dockerd `docker-<id>.scope` /
  `<id>`. IDs are 64 hex digits. Processes may sit in cgroups nested below it.
- Read from inside a cgroup namespace, paths outside it show as `/../..` relative to the
  reader's root (`cgroup_namespaces(7)`); a process of the reader's own pod can show as
  `/../<container>` with no pod component at all.

A path that does not have these shapes yields nothing; lines that disagree yield nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_UUID_SYSTEMD = r"[0-9a-f]{8}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{12}"
_STATIC = r"[0-9a-f]{32}"
_POD_CGROUPFS = re.compile(rf"pod(?P<uid>{_UUID}|{_STATIC})")
_POD_SYSTEMD = re.compile(
    rf"kubepods(?:-burstable|-besteffort)?-pod(?P<uid>{_UUID_SYSTEMD}|{_STATIC})\.slice"
)
_POD_PARENTS = re.compile(r"kubepods|burstable|besteffort|kubepods(?:-[a-z]+)?\.slice")
_CONTAINER = re.compile(
    r"(?:(?P<systemd>cri-containerd|crio|docker)-(?P<sid>[0-9a-f]{64})\.scope"
    r"|(?:crio-)?(?P<fid>[0-9a-f]{64}))"
)


@dataclass(frozen=True, slots=True)
class CgroupIdentity:
    """Where a process runs. `pod_uid` in the API's form (dashes); `container_id` bare
    (no `containerd://`); either may be empty when the path does not show it."""

    pod_uid: str = ""
    container_id: str = ""


def parse_cgroup_file(text: str) -> CgroupIdentity | None:
    """The identity every line of a `/proc/<pid>/cgroup` agrees on, or None (a host
    process, a path of no known shape, or lines naming different pods or containers)."""
    found: set[CgroupIdentity] = set()
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[0].isdigit():
            continue
        identity = parse_cgroup_path(parts[2])
        if identity is not None:
            found.add(identity)
    if len(found) != 1:
        return _agreeing(found)
    return found.pop()


def _agreeing(found: set[CgroupIdentity]) -> CgroupIdentity | None:
    """v1 hierarchies may show the pod but not the container (a controller not enabled
    below the pod): keep the fullest identity when the others are parts of it."""
    if not found:
        return None
    fullest = max(found, key=lambda i: (bool(i.pod_uid), bool(i.container_id)))
    for other in found:
        if other.pod_uid and other.pod_uid != fullest.pod_uid:
            return None
        if other.container_id and other.container_id != fullest.container_id:
            return None
    return fullest if fullest.pod_uid or fullest.container_id else None


def parse_cgroup_path(path: str) -> CgroupIdentity | None:
    """One cgroup path -> its pod UID and container ID, or None."""
    parts = path.split("/")
    if not parts or parts[0] != "":
        return None  # the kernel always prints an absolute path
    components = [p for p in parts[1:] if p]
    escaped = 0
    while escaped < len(components) and components[escaped] == "..":
        escaped += 1
    components = components[escaped:]
    if any(c in (".", "..") for c in components):
        return None
    for i, component in enumerate(components):
        uid = _pod_uid(component)
        if uid is None:
            continue
        if i > 0 and not _POD_PARENTS.fullmatch(components[i - 1]):
            return None
        container = _container_id(components[i + 1]) if i + 1 < len(components) else ""
        return CgroupIdentity(uid, container or "")
    if escaped and components:
        # `/../<container>`: a sibling in the reader's own pod.
        container = _container_id(components[0])
        if container:
            return CgroupIdentity("", container)
    return None


def _pod_uid(component: str) -> str | None:
    m = _POD_CGROUPFS.fullmatch(component)
    if m:
        return m["uid"]
    m = _POD_SYSTEMD.fullmatch(component)
    if m:
        return m["uid"].replace("_", "-")
    return None


def _container_id(component: str) -> str | None:
    m = _CONTAINER.fullmatch(component)
    if not m:
        return None
    return m["sid"] or m["fid"]
