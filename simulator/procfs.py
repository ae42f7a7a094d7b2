"""The `procfs:` part of a simulated node: the host's /proc and /var/log/containers.

For every container with `pids:` alive at the scenario time it writes what the exporter
reads on a real node, in the real formats:
- `proc/<pid>/cgroup` in the chosen layout (cgroup v1 or v2; the kubelet's systemd or
  cgroupfs driver; containerd, CRI-O or Docker names; optionally as read from inside a
  cgroup namespace, with `/../..` prefixes): exporter/attribution/cgroup.py cites each form;
- `proc/<pid>/stat` with the start time in field 22 (`proc(5)`), the pod's start;
- `containers/<pod>_<namespace>_<container>-<id>.log`, a symlink into /var/log/pods (which
  does not exist here, as the exporter never mounts it), named as the kubelet's
  `logSymlink` names it.
`host_processes` get a host cgroup (`/system.slice/...`). Pod UIDs and container IDs are
derived from the names, so the same scenario always gives the same IDs.

```yaml
procfs:
  cgroup: v2             # v1 | v2
  driver: systemd        # systemd | cgroupfs (the kubelet's --cgroup-driver)
  runtime: containerd    # containerd | crio | docker
  cgroupns: true         # paths as read from the exporter's own cgroup namespace
  host_processes: [900]  # PIDs of no pod
```
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.scenario import Scenario, ScenarioError, TimedPod

CHOICES = {
    "cgroup": ("v2", "v1"),
    "driver": ("systemd", "cgroupfs"),
    "runtime": ("containerd", "crio", "docker"),
}
CLOCK_TICKS = 100
"""USER_HZ: what `starttime` counts in (sysconf(_SC_CLK_TCK) is 100 on Linux)."""
BOOT_TICKS = 123_456
"""The simulated node booted this long (in ticks) before the scenario started."""


@dataclass(frozen=True, slots=True)
class Layout:
    cgroup: str = "v2"
    driver: str = "systemd"
    runtime: str = "containerd"
    cgroupns: bool = True
    host_processes: tuple[int, ...] = ()


def parse_layout(section: Any, scenario: str) -> Layout:
    if section is None:
        return Layout()
    if not isinstance(section, dict):
        raise ScenarioError(f"{scenario}: procfs: expected a mapping")
    allowed = {*CHOICES, "cgroupns", "host_processes"}
    unknown = sorted(set(section) - allowed)
    if unknown:
        raise ScenarioError(
            f"{scenario}: procfs: unknown keys {unknown} (allowed: {sorted(allowed)})"
        )
    values: dict[str, Any] = {}
    for key, options in CHOICES.items():
        value = section.get(key, options[0])
        if value not in options:
            raise ScenarioError(f"{scenario}: procfs.{key}: one of {list(options)}, got {value!r}")
        values[key] = value
    cgroupns = section.get("cgroupns", True)
    if not isinstance(cgroupns, bool):
        raise ScenarioError(f"{scenario}: procfs.cgroupns: expected true or false")
    host = section.get("host_processes") or []
    if not isinstance(host, list) or not all(type(p) is int and p > 0 for p in host):
        raise ScenarioError(f"{scenario}: procfs.host_processes: expected a list of PIDs")
    return Layout(**values, cgroupns=cgroupns, host_processes=tuple(host))


def pod_uid(namespace: str, pod: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"kube-device-exporter/{namespace}/{pod}"))


def container_id(namespace: str, pod: str, container: str) -> str:
    return hashlib.sha256(f"{namespace}/{pod}/{container}".encode()).hexdigest()


def cgroup_file(layout: Layout, uid: str, cid: str, qos: str = "burstable") -> str:
    """`/proc/<pid>/cgroup` of a container process, in the layout's format."""
    if layout.driver == "systemd":
        under = f"kubepods-{qos}-pod{uid.replace('-', '_')}.slice"
        leaf = {"containerd": "cri-containerd", "crio": "crio", "docker": "docker"}[layout.runtime]
        parents = ["kubepods.slice", f"kubepods-{qos}.slice"]
        leaf = f"{leaf}-{cid}.scope"
    else:
        under = f"pod{uid}"
        leaf = f"crio-{cid}" if layout.runtime == "crio" else cid
        parents = ["kubepods", qos]
    if layout.cgroupns:
        # Read from the exporter's cgroup namespace (its own container's cgroup, two
        # levels below the QoS one): the QoS level and above are outside it.
        path = "/../../" + "/".join([under, leaf])
    else:
        path = "/" + "/".join([*parents, under, leaf])
    return _lines(layout, path)


def _lines(layout: Layout, path: str) -> str:
    if layout.cgroup == "v2":
        return f"0::{path}\n"
    return "".join(
        f"{n}:{c}:{path}\n"
        for n, c in ((12, "memory"), (11, "devices"), (4, "cpu,cpuacct"), (1, "name=systemd"))
    )


def stat_line(pid: int, started_at: float) -> str:
    """`/proc/<pid>/stat`: 52 fields, a command name with a space and a parenthesis (as
    real ones can have), `starttime` (field 22) in clock ticks after boot."""
    ticks = BOOT_TICKS + round(started_at * CLOCK_TICKS)
    fields = ["S", "1", str(pid), str(pid), "0", "-1", "4194560"] + ["0"] * 12 + [str(ticks)]
    fields += ["0"] * (52 - 2 - len(fields))
    return f"{pid} (pt_main thread) ) " + " ".join(fields) + "\n"


class ProcfsPart:
    def __init__(self, scenario: Scenario, workdir: Path) -> None:
        self.scenario = scenario
        self.layout = parse_layout(scenario.sections.get("procfs"), scenario.name)
        self.proc = workdir / "proc"
        self.logs = workdir / "containers"
        self.proc.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self._written: dict[str, tuple[str, str]] = {}

    def env(self) -> dict[str, str]:
        return {}

    def exporter_args(self) -> list[str]:
        return ["--path.procfs", str(self.proc), "--path.container-logs", str(self.logs)]

    def advance(self, t: float) -> None:
        # A real /proc always has PID 1, the host's init (proc(5)); `doctor` reads its `comm`
        # to tell a hidepid or foreign procfs from the host's.
        wanted: dict[str, tuple[str, str]] = {
            "proc/1/comm": ("file", "systemd\n"),
            "proc/1/cgroup": ("file", _lines(self.layout, "/init.scope")),
        }
        for pid in self.layout.host_processes:
            wanted[f"proc/{pid}/stat"] = ("file", stat_line(pid, 0.0))
            host_cgroup = _lines(self.layout, "/system.slice/app.service")
            wanted[f"proc/{pid}/cgroup"] = ("file", host_cgroup)
        for timed in self.scenario.pods:
            if timed.alive(t):
                wanted.update(self._pod_files(timed))
        for rel in sorted(self._written.keys() - wanted.keys()):
            self._remove(rel)
        for rel, (kind, content) in wanted.items():
            if self._written.get(rel) != (kind, content):
                self._write(rel, kind, content)
        self._written = wanted

    def _pod_files(self, timed: TimedPod) -> dict[str, tuple[str, str]]:
        pod, out = timed.pod, {}
        uid = pod_uid(pod.namespace, pod.name)
        for container, pids in timed.pids:
            cid = container_id(pod.namespace, pod.name, container)
            link = f"containers/{pod.name}_{pod.namespace}_{container}-{cid}.log"
            target = f"/var/log/pods/{pod.namespace}_{pod.name}_{uid}/{container}/0.log"
            out[link] = ("link", target)
            for pid in pids:
                out[f"proc/{pid}/stat"] = ("file", stat_line(pid, timed.start))
                out[f"proc/{pid}/cgroup"] = ("file", cgroup_file(self.layout, uid, cid))
        return out

    def _write(self, rel: str, kind: str, content: str) -> None:
        path = self.proc.parent / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "link":
            path.unlink(missing_ok=True)
            os.symlink(content, path)
        else:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(content)
            os.replace(tmp, path)

    def _remove(self, rel: str) -> None:
        path = self.proc.parent / rel
        path.unlink(missing_ok=True)
        if rel.startswith("proc/") and path.parent.exists() and not any(path.parent.iterdir()):
            shutil.rmtree(path.parent)

    def close(self) -> None:
        return None


def make_part(scenario: Scenario, workdir: Path) -> ProcfsPart:
    return ProcfsPart(scenario, workdir)
