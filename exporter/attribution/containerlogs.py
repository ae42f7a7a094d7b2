"""The kubelet's `/var/log/containers` names: container ID -> pod, namespace, container.

The kubelet makes one symlink per container instance named
`<pod>_<namespace>_<container>-<containerID>.log` (kubelet
`pkg/kubelet/kuberuntime/legacy.go`: `logSymlink`, `fmt.Sprintf("%s_%s-%s", podFullName,
containerName, containerID)` with `podFullName` = `<name>_<namespace>`), truncated to 255
bytes with the suffix (ext4's limit): a truncated name has lost the end of the ID and is
skipped, never guessed. Pod names are DNS subdomains, namespaces and container names DNS
labels (API validation), so none holds `_`: the split is unambiguous. Only the names are
read; the links point into `/var/log/pods`, which is never mounted.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_SUBDOMAIN = rf"{_LABEL}(?:\.{_LABEL})*"
_NAME = re.compile(
    rf"(?P<pod>{_SUBDOMAIN})_(?P<namespace>{_LABEL})_(?P<container>{_LABEL})"
    r"-(?P<id>[0-9a-f]{64})\.log"
)
MAX_NAME_BYTES = 255


@dataclass(frozen=True, slots=True)
class ContainerName:
    namespace: str
    pod: str
    container: str
    container_id: str


def parse_log_name(name: str) -> ContainerName | None:
    """One directory entry's name -> what it names, or None."""
    if len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
        return None
    m = _NAME.fullmatch(name)
    if m is None or len(m["pod"]) > 253:
        return None
    return ContainerName(m["namespace"], m["pod"], m["container"], m["id"])


def index_names(names: list[str]) -> dict[str, ContainerName]:
    """Container ID -> its name; an ID named twice (which the kubelet never does) is
    dropped rather than attributed to either."""
    found: dict[str, ContainerName] = {}
    twice: set[str] = set()
    for entry in names:
        parsed = parse_log_name(entry)
        if parsed is None:
            continue
        if parsed.container_id in found and found[parsed.container_id] != parsed:
            twice.add(parsed.container_id)
        found[parsed.container_id] = parsed
    for container_id in twice:
        del found[container_id]
    return found


class ContainerLogDirectory:
    """The directory, listed again only when its mtime changes (a link added or removed)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._mtime_ns = -1
        self._index: dict[str, ContainerName] = {}

    def names(self) -> dict[str, ContainerName]:
        """Container ID -> name. Raises OSError when the directory cannot be read."""
        mtime = os.stat(self.path).st_mtime_ns
        if mtime != self._mtime_ns:
            with os.scandir(self.path) as entries:
                self._index = index_names([e.name for e in entries])
            self._mtime_ns = mtime
        return self._index
