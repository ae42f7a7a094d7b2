"""Host PID -> container, from the host's `/proc` and the kubelet's container-log names.

What the pod can read, as the DaemonSet runs it (UID 0, every capability dropped, no
hostPID, the host's /proc mounted read-only at `--path.procfs`):
- `/proc/<pid>/cgroup` and `/proc/<pid>/stat` of every process: both are world-readable
  (mode 0444, `fs/proc/base.c`);
- the names in `/var/log/containers` (`--path.container-logs`): a directory listing needs
  no access to the logs the links point to.

A PID's owner is cached by (PID, start time): a PID reused by a new process has another
start time (`proc(5)`, field 22 of `stat`) and is resolved again. Names are cached by
container ID; the directory is listed again when its mtime changes.

Host reads never block (`exporter.hostfiles`), and the whole resolution runs in its own
daemon thread under a deadline: a read that sleeps anyway (a hung mount) turns attribution
off for the cycles it lasts, said once, and never holds the cycle, readiness or SIGTERM. A
process whose `stat` cannot be read, is not a regular file, is oversized or does not parse
has no owner: it counts in the group of no pod, as a host process does.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

from exporter.attribution.cgroup import CgroupIdentity, parse_cgroup_file
from exporter.attribution.containerlogs import ContainerLogDirectory, ContainerName
from exporter.model import Owner
from exporter.runtime import hostfiles
from exporter.runtime.threads import BoundedWorker, Stuck
from exporter.settings.config import DEFAULTS

PID_NS_INIT_INO = 0xEFFFFFFC
"""The initial PID namespace's inode (`PROC_PID_INIT_INO`, include/linux/proc_ns.h)."""
_READ_LIMIT = 64 * 1024
STAT_LIMIT = 4096
"""`/proc/<pid>/stat` is 52 numbers and a command name of at most 64 bytes: a few hundred
bytes. Longer is not the kernel's file."""

log = logging.getLogger("exporter.attribution")


def read_small(path: str | Path, limit: int = _READ_LIMIT) -> str | None:
    """A procfs file, read once with one bounded read that never blocks; None when it
    cannot be read (the process exited, or we may not), is not a regular file, or is
    longer than `limit`."""
    return hostfiles.read_text(path, limit)


def start_time(stat: str) -> int | None:
    """Field 22 (`starttime`, clock ticks after boot) of `/proc/<pid>/stat`. The command
    name (field 2) may hold spaces and parentheses: fields are counted after the last `)`."""
    _, paren, rest = stat.rpartition(")")
    fields = rest.split(None, 20)  # the first 20 fields, the rest left whole
    if not paren or len(fields) < 20 or not (fields[19].isascii() and fields[19].isdigit()):
        return None
    return int(fields[19])


def own_pid_namespace(procfs: Path) -> str:
    """Why `procfs` cannot resolve host PIDs, or "" when it can: a procfs of this
    process's own PID namespace (a pod's /proc) shows other PIDs than the host's, unless
    that namespace is the host's (hostPID, or not in a container at all)."""
    try:
        self_pid = os.readlink(procfs / "self")
    except OSError:
        return ""  # no `self`: not a live procfs of ours (a fixture tree, another mount)
    if self_pid != str(os.getpid()):
        return ""  # another namespace's procfs: in the DaemonSet, the host's
    try:
        host_namespace = os.stat("/proc/self/ns/pid").st_ino == PID_NS_INIT_INO
    except OSError:
        host_namespace = False  # no namespace links: cannot tell, so not the host's
    if host_namespace:
        return ""
    return (
        f"{procfs} is this container's own /proc, not the host's: PIDs from the drivers "
        "are the host's (mount the host's /proc, see docs/attribution.md)"
    )


class ProcessResolver:
    def __init__(
        self, procfs: Path, container_logs: Path, *, timeout: float = DEFAULTS.collect_timeout
    ) -> None:
        self.procfs = procfs
        self._pid_dirs = os.path.join(procfs, "")
        """`procfs` and a slash, as a string: a PID's files are joined to it every cycle
        (pathlib's `/` was most of the resolution's own cost)."""
        self.logs = ContainerLogDirectory(container_logs)
        self.timeout = timeout
        self._cgroups: dict[int, tuple[int, CgroupIdentity | None]] = {}
        self._owners: dict[int, tuple[CgroupIdentity, ContainerName, Owner]] = {}
        """PID -> the identity and name its owner was made of, and the owner: the same
        owner object while both are the same objects (the cached identity of the same
        process, the same listing of the container logs)."""
        self._off_reason: str | None = None
        self._worker = BoundedWorker("attribution")

    def resolve(self, pids: Iterable[int]) -> dict[int, Owner] | None:
        """Owner of each PID that belongs to a named container; None when attribution is
        off (said once per change of reason), a host read among them stuck included."""
        wanted = sorted(set(pids))
        try:
            reason, owners = self._worker.call(lambda: self._resolve(wanted), self.timeout)
        except (Stuck, TimeoutError):
            reason, owners = (
                f"a read under {self.procfs} or {self.logs.path} has not returned in "
                f"{self.timeout:g}s (a hung mount?)",
                None,
            )
        self._say(reason)
        return owners

    def _resolve(self, wanted: list[int]) -> tuple[str, dict[int, Owner] | None]:
        """In the worker thread: (why attribution is off or "", owners)."""
        reason = self._unavailable()
        names = None
        if not reason:
            try:
                names = self.logs.names()
            except OSError as exc:
                reason = f"cannot list {self.logs.path}: {exc.strerror}"
        if names is None:
            self._cgroups.clear()
            self._owners.clear()
            return reason, None
        owners: dict[int, Owner] = {}
        for pid in set(self._cgroups).difference(wanted):
            del self._cgroups[pid]
        for pid in set(self._owners).difference(wanted):
            del self._owners[pid]
        for pid in wanted:
            identity = self._identity(pid)
            if identity is None:
                continue
            name = names.get(identity.container_id) if identity.container_id else None
            if name is None:
                continue  # a pod's pause or monitor process, or a link not made yet
            made = self._owners.get(pid)
            if made is not None and made[0] is identity and made[1] is name:
                owners[pid] = made[2]
                continue
            owner = Owner(
                name.namespace, name.pod, name.container, identity.pod_uid, name.container_id
            )
            self._owners[pid] = (identity, name, owner)
            owners[pid] = owner
        return "", owners

    def _identity(self, pid: int) -> CgroupIdentity | None:
        if pid <= 0:
            return None
        stat = read_small(f"{self._pid_dirs}{pid}/stat", STAT_LIMIT)
        started = start_time(stat) if stat is not None else None
        if started is None:
            self._cgroups.pop(pid, None)
            return None  # gone, or not in this procfs
        cached = self._cgroups.get(pid)
        if cached is not None and cached[0] == started:
            return cached[1]
        text = read_small(f"{self._pid_dirs}{pid}/cgroup")
        identity = parse_cgroup_file(text) if text is not None else None
        self._cgroups[pid] = (started, identity)
        return identity

    def _unavailable(self) -> str:
        if not os.path.isdir(self._pid_dirs):
            reason = f"no host /proc at {self.procfs} (--path.procfs)"
        elif not os.path.isdir(self.logs.path):
            reason = f"no container-log directory at {self.logs.path} (--path.container-logs)"
        else:
            reason = own_pid_namespace(self.procfs)
        return reason

    def _say(self, reason: str) -> None:
        if reason == (self._off_reason or ""):
            return
        if reason:
            log.warning(
                "process attribution is off: %s; device and allocation metrics are "
                "unaffected, per-container device usage is not reported",
                reason,
            )
        elif self._off_reason is not None:
            log.info("process attribution is on")
        self._off_reason = reason
