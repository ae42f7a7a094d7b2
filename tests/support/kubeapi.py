"""Test support for the watches: objects for the loopback API server (simulator/apiserver.py),
the loop's waits scaled down, a client per kubeconfig, a pod watcher, a watcher running for a
block.

`until` is here for now; tests/support is to hold one copy of it for every test.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from exporter.kubeapi.answers import Limits
from exporter.kubeapi.client import KubeApi, http_client, load_config
from exporter.kubeapi.listwatch import Timing
from exporter.kubeapi.pods import PodStatusReader
from exporter.kubeapi.watcher import PodWatcher
from exporter.kubeapi.workloads import LabelFilter
from simulator.apiserver import ApiServer

NODE = "node-a"
OWNER_RESOURCES = {"ReplicaSet": "replicasets", "Job": "jobs"}
_API_VERSIONS = {"ReplicaSet": "apps/v1", "Deployment": "apps/v1", "StatefulSet": "apps/v1",
                 "DaemonSet": "apps/v1", "Job": "batch/v1", "CronJob": "batch/v1"}  # fmt: skip


def pod(
    name: str,
    namespace: str = "default",
    *,
    node: str = NODE,
    uid: str | None = None,
    labels: dict[str, str] | None = None,
    owner: tuple[str, str, str] | None = None,
) -> dict[str, Any]:
    """A Pod; `owner` is the controller's (kind, name, uid)."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid or f"uid-{namespace}-{name}",
        "labels": labels or {},
    }
    if owner:
        meta["ownerReferences"] = [_ref(*owner)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "x" * 2000}]},
        "status": {"phase": "Running"},
    }


def owner_object(
    kind: str,
    name: str,
    uid: str,
    namespace: str = "default",
    controller: tuple[str, str, str] | None = None,
) -> dict[str, Any]:
    """A ReplicaSet or Job; `controller` is its own controller's (kind, name, uid)."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid}
    if controller:
        meta["ownerReferences"] = [_ref(*controller)]
    return {"apiVersion": _API_VERSIONS[kind], "kind": kind, "metadata": meta, "spec": {}}


def put_owner(server: ApiServer, obj: dict[str, Any]) -> None:
    server.put(OWNER_RESOURCES[obj["kind"]], obj)


def _ref(kind: str, name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": _API_VERSIONS.get(kind, "example.com/v1"), "kind": kind, "name": name,
            "uid": uid, "controller": True, "blockOwnerDeletion": True}  # fmt: skip


def fast(**changes: Any) -> Timing:
    """The loop's waits for a test: back-off 0.05 s doubling to 0.2 s, 0.2 s when denied, a
    seeded random source; `changes` as `Timing`'s fields."""
    timing = Timing(backoff=(0.05, 0.2), denied_backoff=0.2, rng=random.Random(1))
    return dataclasses.replace(timing, **changes)


def connector(
    kubeconfig: Path, *, pod_status: PodStatusReader | None = None, limits: Limits | None = None
) -> Callable[[], KubeApi]:
    """What the exporter hands its watchers: one client, made at the first call; `limits`
    its bounds (the exporter's defaults unless given)."""
    made: list[KubeApi] = []

    def connect() -> KubeApi:
        if not made:
            http = http_client(load_config(kubeconfig), 5.0)
            made.append(KubeApi(http, pod_status=pod_status, limits=limits))
        return made[0]

    return connect


def pod_watcher(
    kubeconfig: Path,
    labels: Sequence[str] = (),
    *,
    pod_status: PodStatusReader | None = None,
    limits: Limits | None = None,
    **options: Any,
) -> PodWatcher:
    """A PodWatcher of NODE's pods through `kubeconfig`, waiting as `fast()` unless `timing`
    is given; `options` as PodWatcher's (feed, owner_ttl, max_pods...)."""
    options.setdefault("timing", fast())
    connect = connector(kubeconfig, pod_status=pod_status, limits=limits)
    return PodWatcher(connect, NODE, LabelFilter(labels), **options)


class Runs(Protocol):
    async def run(self, stop: asyncio.Event) -> None: ...


@contextlib.asynccontextmanager
async def running(watcher: Runs) -> AsyncIterator[asyncio.Event]:
    """`watcher.run()` for the block; its stop event."""
    stop = asyncio.Event()
    task = asyncio.create_task(watcher.run(stop))
    try:
        yield stop
    finally:
        stop.set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
