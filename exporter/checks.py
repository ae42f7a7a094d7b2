"""The checks behind `kube-device-exporter doctor` and the landing page: pure functions of
what was found (the kubelet's answer, each source's result, the host paths), each returning
one Finding with, for a problem, its likely cause and the fix.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from exporter.ids import ResourceMatcher
from exporter.join import JoinResult, join
from exporter.model import (
    ContainerDevices,
    DeviceReading,
    PodResourcesState,
    Snapshot,
    SourceHealth,
    SourceResult,
)
from exporter.podresources.client import PodResourcesError
from exporter.runtime.log import StateLog
from exporter.settings.config import Config
from exporter.sources.resources import SOURCE_FIXES, source_for

OK, ABSENT, PROBLEM = "ok", "absent", "problem"


@dataclass(frozen=True, slots=True)
class Finding:
    status: str
    """ok, absent (no such hardware here: fine unless the node advertises it) or problem."""
    subject: str
    found: str
    cause: str = ""
    fix: str = ""

    def sentence(self) -> str:
        """The finding on one line: a log message."""
        parts = [f"{self.subject}: {self.found}"]
        if self.cause:
            parts.append(f"likely cause: {self.cause}")
        if self.fix:
            parts.append(f"fix: {self.fix}")
        return "; ".join(parts)

    def lines(self, width: int = 24) -> list[str]:
        out = [f"{self.status.upper():<8} {self.subject:<{width}} {self.found}"]
        if self.cause:
            out.append(f"{'':<8} {'':<{width}} likely cause: {self.cause}")
        if self.fix:
            out.append(f"{'':<8} {'':<{width}} fix: {self.fix}")
        return out


def render(findings: Sequence[Finding]) -> str:
    width = max((len(f.subject) for f in findings), default=0)
    return "\n".join(line for f in findings for line in f.lines(width))


# --- the checks: pure ------------------------------------------------------------------------


def unseen_by_resource(
    allocatable: Iterable[ContainerDevices],
    readings: Iterable[DeviceReading],
    matcher: ResourceMatcher,
) -> dict[str, int]:
    """Resource name -> how many devices the kubelet can allocate that no source sees
    (only those with some). The join's own count (`JoinResult.unseen`), so the doctor, the
    landing page and `kube_device_exporter_devices_unseen` always agree."""
    state = PodResourcesState(allocatable=tuple(allocatable), allocatable_known=True)
    result = join([SourceResult("doctor", tuple(readings))], state, matcher)
    return {resource: count for resource, count in result.unseen if count}


def check_source(name: str, *, error: str, absent: str, devices: int) -> Finding:
    subject = f"source {name}"
    if error:
        cause, fix = _source_error_hint(name, error)
        return Finding(PROBLEM, subject, f"failed: {error}", cause, fix)
    if absent:
        return Finding(ABSENT, subject, f"no hardware: {absent}")
    if devices == 0:
        return Finding(ABSENT, subject, "no devices")
    return Finding(OK, subject, f"{devices} device{'s' if devices != 1 else ''}")


def _source_error_hint(name: str, error: str) -> tuple[str, str]:
    text = error.lower()
    if "permission" in text:
        return (
            "the container may not open the device files",
            "for NVIDIA use the nvidia runtime class (it adds /dev/nvidia*); otherwise run the "
            "container privileged or as root",
        )
    if "library not found" in text or "libnvidia-ml" in text:
        return ("libnvidia-ml.so.1 is not in this container", SOURCE_FIXES["nvml"])
    if "driver not loaded" in text:
        return (
            "the nvidia kernel module is not loaded on this node",
            "install or load the NVIDIA driver on the node (nvidia-smi on the host must work)",
        )
    if "timed out" in text or "still running" in text:
        return (
            "a driver call hangs (a GPU fallen off the bus, a driver reset)",
            "look for Xid errors in the node's kernel log (dmesg); raise --collect-timeout only "
            "if the source is merely slow",
        )
    return ("", f"rerun with --log.level debug; {SOURCE_FIXES.get(name, '')}".rstrip("; "))


def check_kubelet(
    socket: Path, state: PodResourcesState | None, error: PodResourcesError | None
) -> list[Finding]:
    subject = "kubelet"
    if error is not None:
        cause, fix = _kubelet_hint(socket, error)
        return [Finding(PROBLEM, subject, f"{socket}: {error}", cause, fix)]
    assert state is not None
    pods = sum(1 for p in state.pods if any(c.devices or c.dynamic_resources for c in p.containers))
    found = (
        f"{socket}: PodResources {state.api_version}, {len(state.pods)} pods "
        f"({pods} holding devices)"
    )
    findings = [Finding(OK, subject, found)]
    if not state.allocatable_known:
        findings.append(
            Finding(
                ABSENT,
                "kubelet allocatable",
                "GetAllocatableResources not answered: devices the node advertises cannot be "
                "checked",
                "a kubelet older than 1.23, or KubeletPodResourcesGetAllocatable turned off",
            )
        )
    return findings


def _kubelet_hint(socket: Path, error: PodResourcesError) -> tuple[str, str]:
    text = str(error).lower()
    if error.code == "NO_SOCKET" and "not a socket" in text:
        return (
            f"{socket} is there but is not a socket: a hostPath mount of the socket file made "
            "before the kubelet created it (Kubernetes then mounts a directory or file in "
            "its place), or a wrong --kubelet-socket",
            "mount the host directory /var/lib/kubelet/pod-resources (the directory, not the "
            "socket) and point --kubelet-socket at kubelet.sock in it",
        )
    if error.code == "NO_SOCKET" and "permission" not in text:
        return (
            "the kubelet's pod-resources directory is not mounted in this pod, or this "
            "kubelet keeps it elsewhere (microk8s: /var/snap/microk8s/common/var/lib/kubelet, "
            "k0s: /var/lib/k0s/kubelet)",
            "mount the host directory /var/lib/kubelet/pod-resources (the directory, not the "
            "socket) and point --kubelet-socket at the socket in it",
        )
    if "permission" in text or error.code == "PERMISSION_DENIED":
        return (
            f"{socket} belongs to root and this process may not connect to it",
            "run the container as root (runAsUser: 0); on SELinux nodes (OpenShift) also "
            "seLinuxOptions type spc_t",
        )
    if error.code == "UNIMPLEMENTED":
        return ("this kubelet serves no PodResources API", "Kubernetes 1.20 or newer")
    return (
        "the kubelet does not answer on this socket (restarting, or a stale socket file)",
        "check the kubelet on the node; mount the directory, not the file, so a new socket is seen",
    )


def check_unseen(
    allocatable: Iterable[ContainerDevices],
    readings: Iterable[DeviceReading],
    matcher: ResourceMatcher,
    sources: Mapping[str, Finding],
) -> list[Finding]:
    """One problem per resource the node advertises whose devices no source sees; `sources`
    is each enabled source's finding (a missing one is disabled)."""
    allocatable = list(allocatable)
    return unseen_findings(
        allocatable, unseen_by_resource(allocatable, readings, matcher), sources, matcher
    )


def allocatable_totals(
    allocatable: Iterable[ContainerDevices], matcher: ResourceMatcher
) -> dict[str, int]:
    """Attributed resource name -> how many devices the kubelet can allocate."""
    totals: dict[str, int] = {}
    for devs in allocatable:
        if matcher(devs.resource_name):
            totals[devs.resource_name] = totals.get(devs.resource_name, 0) + len(devs.device_ids)
    return totals


def unseen_findings(
    allocatable: Sequence[ContainerDevices],
    unseen: Mapping[str, int],
    sources: Mapping[str, Finding],
    matcher: ResourceMatcher,
) -> list[Finding]:
    """One finding per attributed resource: all seen, or a problem naming the likely cause."""
    return [
        unseen_finding(name, unseen[name], total, sources)
        if name in unseen
        else Finding(OK, f"resource {name}", f"{total} allocatable, all seen")
        for name, total in allocatable_totals(allocatable, matcher).items()
    ]


def unseen_finding(
    resource: str, count: int, total: int, sources: Mapping[str, Finding]
) -> Finding:
    """The problem of `count` of a resource's `total` allocatable devices that no source
    sees: the doctor's line, the landing page's and (`Finding.sentence`) the poller's
    warning. `sources` is each enabled source's finding."""
    found = f"{total} allocatable, {count} seen by no source"
    source = source_for(resource)
    if not source:
        return Finding(
            PROBLEM,
            f"resource {resource}",
            found,
            "no bundled source reads this kind of device",
            "narrow --kubernetes.resource-pattern to the resources this exporter reads",
        )
    state = sources.get(source)
    if state is None:
        return Finding(
            PROBLEM,
            f"resource {resource}",
            found,
            f"the {source} source is turned off",
            f"turn it on: --collector.{source}",
        )
    if resource.startswith("rdma/") and state.status == OK:
        return Finding(
            PROBLEM,
            f"resource {resource}",
            found,
            f"source {source} sees {state.found}, but none is in the pool {resource}",
            "give --collector.rdma.pool-config the RDMA shared-device plugin's config "
            "(config.json, or its ConfigMap as YAML) naming this pool",
        )
    if state.status == OK:
        return Finding(
            PROBLEM,
            f"resource {resource}",
            found,
            f"source {source} sees {state.found}, but none answers to these IDs",
            "compare the IDs `kube-device-exporter podresources` prints with /api/devices; "
            f"where devices are missing there: {SOURCE_FIXES[source]}",
        )
    if state.status == PROBLEM:
        # The source fails: its own finding knows why (a hung driver is not a missing mount).
        cause = f"source {source} {state.found}" + (f": {state.cause}" if state.cause else "")
        return Finding(PROBLEM, f"resource {resource}", found, cause, state.fix)
    fix = SOURCE_FIXES[source]
    if source == "nvml":
        fix += "; on GKE use the gke overlay (driver mounts); see docs/deploy.md"
    return Finding(PROBLEM, f"resource {resource}", found, f"source {source}: {state.found}", fix)


def check_unattributed(
    allocatable: Iterable[ContainerDevices], matcher: ResourceMatcher
) -> list[Finding]:
    """Device resources the node advertises that no --kubernetes.resource-pattern matches
    (a typo, or a comma list in one quoted flag before it was split): their pods get no
    labels, silently. Resources no bundled source reads are not ours to flag."""
    names = sorted({d.resource_name for d in allocatable if not matcher(d.resource_name)})
    return [
        Finding(
            PROBLEM,
            f"resource {name}",
            "advertised by the node but attributed by no --kubernetes.resource-pattern "
            f"(now: {', '.join(matcher.patterns)})",
            "the patterns replace the defaults, and match whole names",
            f"add a pattern that matches it, e.g. {name.split('/')[0]}/*",
        )
        for name in names
        if source_for(name)
    ]


def check_procfs(procfs: Path) -> Finding:
    subject = f"host proc ({procfs})"
    fix = "mount the host's /proc read-only (deploy/: at /host/proc) and set --path.procfs to it"
    try:
        pids = [e.name for e in procfs.iterdir() if e.name.isdigit()]
    except OSError as exc:
        return Finding(PROBLEM, subject, f"unreadable: {exc.strerror}", "not mounted here", fix)
    if not pids:
        return Finding(PROBLEM, subject, "no processes: not a procfs", "not mounted here", fix)
    try:
        init = (procfs / "1" / "comm").read_text().strip()
    except OSError as exc:
        # Process attribution reads every PID's entries the way it reads PID 1's.
        return Finding(
            PROBLEM,
            subject,
            f"{len(pids)} processes, but PID 1 is unreadable ({exc.strerror}): processes "
            "cannot be attributed to pods",
            "a procfs mounted with hidepid, or one the container may not read",
            fix,
        )
    return Finding(OK, subject, f"{len(pids)} processes, PID 1 is {init}")


def check_sysfs(problems: Sequence[str]) -> list[Finding]:
    """The start-up warnings about --path.sysfs (procfs has its own, deeper check)."""
    return [Finding(PROBLEM, "host sys", p) for p in problems if p.startswith("--path.sysfs")]


def failed(findings: Iterable[Finding]) -> bool:
    return any(f.status == PROBLEM for f in findings)


def source_findings(
    healths: Iterable[SourceHealth], readings: Iterable[DeviceReading]
) -> dict[str, Finding]:
    """Each source's finding from one cycle: its health and the devices it read."""
    counts = Counter(r.device.source for r in readings)
    return {
        h.name: check_source(h.name, error=h.error, absent=h.absent, devices=counts[h.name])
        for h in healths
    }


def snapshot_findings(snapshot: Snapshot, matcher: ResourceMatcher) -> list[Finding]:
    """The same checks from one cycle's snapshot (the landing page)."""
    sources = source_findings(snapshot.sources, (d.reading for d in snapshot.devices))
    kubelet = (
        Finding(OK, "kubelet", f"PodResources {snapshot.podresources.api_version} answering")
        if snapshot.podresources.connected
        else Finding(
            PROBLEM,
            "kubelet",
            "not answering",
            "see `kube-device-exporter doctor` in this pod for the cause",
        )
    )
    return [
        kubelet,
        *sources.values(),
        *unseen_findings(
            snapshot.allocatable, {r: n for r, n in snapshot.unseen if n}, sources, matcher
        ),
    ]


def warn_unseen(
    states: StateLog,
    joined: JoinResult,
    healths: Sequence[SourceHealth],
    matcher: ResourceMatcher,
) -> None:
    """The poller's side of the unseen finding: one warning per resource when the kubelet
    can allocate devices no source sees (the likely cause and the fix, as `doctor` says it);
    one info when they are seen again."""
    problems = {resource: count for resource, count in joined.unseen if count}
    for resource, count in joined.unseen:
        if count == 0:
            states.ok(f"unseen/{resource}", f"every allocatable {resource} device is seen again")
    if not problems:
        return
    totals = allocatable_totals(joined.allocatable, matcher)
    sources = source_findings(healths, (d.reading for d in joined.devices))
    for resource, count in problems.items():
        finding = unseen_finding(resource, count, totals[resource], sources)
        states.failed(f"unseen/{resource}", finding.sentence())


SYSFS_FREE_SOURCES = frozenset({"nvml"})
"""Sources that read no sysfs (NVML asks the driver)."""


def host_path_problems(config: Config) -> list[str]:
    """Host mounts that cannot be what the flags say: each line names the flag. A missing
    sysfs is not an error (every sysfs source reports zero devices) but never what was meant."""
    problems = []
    sysfs_sources = sorted(config.collectors - SYSFS_FREE_SOURCES)
    if sysfs_sources and not (config.sysfs / "class").is_dir():
        what = "no such directory" if not config.sysfs.is_dir() else "no class/ under it"
        problems.append(
            f"--path.sysfs {config.sysfs}: {what}, so {', '.join(sysfs_sources)} will see no "
            "devices (mount the host's /sys and point --path.sysfs at it)"
        )
    if not config.procfs.is_dir():
        problems.append(
            f"--path.procfs {config.procfs}: no such directory (mount the host's /proc and "
            "point --path.procfs at it)"
        )
    return problems
