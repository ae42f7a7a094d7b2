"""Device health as the kubelet reports it per claim: `allocatedResourcesStatus` (KEP-4680).

The 1.36 kubelet writes what a DRA driver's health stream (`dra-health/v1alpha1`) says into
the pod's status: `status.containerStatuses[].allocatedResourcesStatus` =
`[{"name": "claim:<claim>[/<request>]", "resources": [{"resourceID": "<driver>/<pool>/
<device>" (or the first CDI ID), "health": "Healthy|Unhealthy|Unknown", "message": ...}]}]`
(control-plane.md, DRA item 5). PodResources does not carry it.

The pod watch reads metadata only (a pod's status changes on every probe), so this reads
whole pods one by one: only the pods PodResources shows holding DRA claims, each every
`interval` (60 s), on the event loop beside the watches. Cost: (DRA pods on the node) /
60 s GETs; RBAC `get` on pods, in the dra component only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import httpx2 as httpx

from exporter.kubeapi.client import ApiError, KubeApi, NotConfigured, describe
from exporter.log import StateLog

log = logging.getLogger("exporter.kubeapi.health")
INTERVAL_SECONDS = 60.0


@dataclass(frozen=True, slots=True, order=True)
class ClaimHealth:
    namespace: str
    pod: str
    container: str
    claim: str
    """The status entry's name less `claim:` (`<claim>` or `<claim>/<request>`)."""
    resource_id: str
    health: str
    message: str = ""


def parse_pod_health(obj: dict[str, Any]) -> tuple[ClaimHealth, ...]:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    out = []
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(key) or ():
            for entry in cs.get("allocatedResourcesStatus") or ():
                name = str(entry.get("name", ""))
                if not name.startswith("claim:"):
                    continue  # device-plugin resources report here too (KEP-4680)
                for res in entry.get("resources") or ():
                    out.append(
                        ClaimHealth(
                            str(meta.get("namespace", "")),
                            str(meta.get("name", "")),
                            str(cs.get("name", "")),
                            name.removeprefix("claim:"),
                            str(res.get("resourceID", "")),
                            str(res.get("health", "Unknown")),
                            str(res.get("message", "") or ""),
                        )
                    )
    return tuple(sorted(out))


class ClaimHealthReader:
    def __init__(
        self, connect: Callable[[], KubeApi], *, interval: float = INTERVAL_SECONDS
    ) -> None:
        self._connect = connect
        self.interval = interval
        self.wanted: frozenset[tuple[str, str]] = frozenset()
        self.health: dict[tuple[str, str], tuple[ClaimHealth, ...]] = {}
        """(namespace, pod) -> what its status says; replaced whole, read by the poller."""
        self._wake = asyncio.Event()
        self._states = StateLog(log)

    def want(self, pods: Iterable[tuple[str, str]]) -> None:
        """The pods holding DRA claims now (from the poller's thread: one assignment)."""
        wanted = frozenset(pods)
        if wanted != self.wanted:
            self.wanted = wanted

    def current(self) -> tuple[ClaimHealth, ...]:
        health = self.health
        return tuple(h for pod in sorted(self.wanted) for h in health.get(pod, ()))

    async def run(self, stop: asyncio.Event) -> None:
        """Every second: read the pods not read yet; every `interval`: all of them."""
        last_all = -self.interval
        while not stop.is_set():
            wanted = self.wanted
            now = time.monotonic()
            due = wanted if now - last_all >= self.interval else wanted - self.health.keys()
            if due == wanted:
                last_all = now
            fresh = {pod: h for pod, h in self.health.items() if pod in wanted}
            for namespace, name in sorted(due):
                fresh[(namespace, name)] = await self._read_or_keep(namespace, name)
            self.health = fresh
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1.0)

    async def _read_or_keep(self, namespace: str, name: str) -> tuple[ClaimHealth, ...]:
        try:
            found = await self._read(namespace, name)
        except ApiError as exc:
            if exc.code != 404:  # 404: the pod is going; PodResources drops it soon
                self._states.failed(
                    f"health/{exc.code}",
                    f"cannot read pods for claim health ({exc}); check the dra RBAC (get pods)",
                )
            return self.health.get((namespace, name), ())
        except (httpx.HTTPError, OSError, ValueError, KeyError, TimeoutError, NotConfigured) as exc:
            self._states.failed(
                f"health/{type(exc).__name__}", f"claim health unavailable ({describe(exc)})"
            )
            return self.health.get((namespace, name), ())
        self._states.ok_all("health/", "claim health readable again")
        return found

    async def _read(self, namespace: str, name: str) -> tuple[ClaimHealth, ...]:
        api = self._connect()
        body = await api.get_object("pods", f"/api/v1/namespaces/{namespace}/pods/{name}")
        return parse_pod_health(body)
