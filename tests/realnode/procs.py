"""Processes by PID: stop ours, find ours. Never by name alone: another helper's
containerd and kubelet run on the same machine."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def stop_pid(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, grace: float = 10.0) -> None:
    """`sig`, then SIGKILL after `grace` seconds; reaped either way."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(timeout=10)


def argv_of(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def pids_where(match: Callable[[list[str]], bool]) -> list[int]:
    """PIDs whose command line `match`es."""
    return [pid for pid in all_pids() if (argv := argv_of(pid)) and match(argv)]


def pids_in_cgroup(root: str) -> list[int]:
    """PIDs with a cgroup path under `/ROOT/` in any hierarchy (`/proc/PID/cgroup`)."""
    found = []
    for pid in all_pids():
        try:
            text = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            continue
        if any(line.split(":", 2)[-1].startswith(f"/{root}/") for line in text.splitlines()):
            found.append(pid)
    return found


def kill_and_wait(pids: list[int], timeout: float = 10.0) -> list[int]:
    """SIGKILL each PID; the PIDs still there after `timeout` seconds."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if Path(f"/proc/{p}").exists() and not _zombie(p)]
        if alive:
            time.sleep(0.05)
    return alive


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def pod_pids(pod_uid: str) -> list[int]:
    """PIDs running in the pod's cgroup (`.../pod<UID>/...`, cgroupfs driver), any hierarchy."""
    marker = f"/pod{pod_uid}/"
    found = []
    for pid in all_pids():
        try:
            text = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            continue
        if marker in text:
            found.append(pid)
    return found


def environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {key: value for key, _, value in pairs}


def pids_in_container(container_id: str) -> list[int]:
    """PIDs in the container's cgroup (cgroupfs driver: `.../pod<UID>/<ID>`)."""
    marker = f"/{container_id}"
    found = []
    for pid in all_pids():
        try:
            text = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            continue
        if any(line.endswith(marker) for line in text.splitlines()):
            found.append(pid)
    return found
