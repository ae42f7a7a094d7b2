"""The ResourceSlice watch, the DeviceTaintRule list and the claim health reads against the
simulated node's loopback API server (simulator/apiserver.py: kube-apiserver's list,
watch, bookmark and 410 behaviour): paged list, events, a watch the server ends resumed
without a list, 410 Gone re-listed, 403 said once, rules not served, pods read for health.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.dra.claimhealth import read_pod_status
from exporter.dra.slicewatch import SliceWatcher
from exporter.kubeapi import client as kubeclient
from simulator.apiserver import ApiServer
from tests.support.kubeapi import NODE, connector, fast, pod_watcher, running
from tests.support.waiting import until


def rslice(name: str, node: str = NODE, devices: int = 1, taint: str = "") -> dict[str, Any]:
    devs: list[dict[str, Any]] = [
        {"name": f"{name}-dev{i}", "attributes": {"uuid": {"string": f"GPU-{name}-{i}"}}}
        for i in range(devices)
    ]
    if taint:
        devs[0]["taints"] = [{"key": taint, "effect": "NoSchedule"}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {"driver": "gpu.example.com", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": devs}}  # fmt: skip


@pytest.fixture
def server() -> Iterator[ApiServer]:
    srv = ApiServer(serve_taint_rules=False).start()
    for i in range(5):
        srv.put("resourceslices", rslice(f"s{i}"))
    srv.put("resourceslices", rslice("elsewhere", node="node-b"))
    yield srv
    srv.stop()


def watcher(server: ApiServer, tmp: Path) -> SliceWatcher:
    connect = connector(server.kubeconfig(tmp / "kubeconfig"))
    return SliceWatcher(connect, NODE, timing=fast(), rule_interval=0.1, rules_absent=0.3)


def names(w: SliceWatcher) -> list[str]:
    return sorted(s.name for s in w.current()[1])


async def test_paged_list_then_events(
    server: ApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kubeclient, "LIST_PAGE", 2)
    w = watcher(server, tmp_path)
    async with running(w):
        await until(lambda: w.up)
        assert names(w) == ["s0", "s1", "s2", "s3", "s4"]  # not node-b's
        assert server.requests.count(("list", "resourceslices")) == 3  # 2 + 2 + 1
        generation = w.current()[0]
        server.put("resourceslices", rslice("s1", taint="maintenance"))
        await until(lambda: any(d.taints for s in w.current()[1] for d in s.devices))
        server.delete("resourceslices", rslice("s4"))
        await until(lambda: names(w) == ["s0", "s1", "s2", "s3"])
        assert w.current()[0] > generation
        assert server.requests.count(("list", "resourceslices")) == 3


async def test_a_watch_the_server_ends_resumes_without_a_list(
    server: ApiServer, tmp_path: Path
) -> None:
    w = watcher(server, tmp_path)
    async with running(w):
        await until(lambda: w.up and server.requests.count(("watch", "resourceslices")) == 1)
        server.close_watches()
        await until(lambda: server.requests.count(("watch", "resourceslices")) == 2)
        server.put("resourceslices", rslice("s9"))
        await until(lambda: "s9" in names(w))
        assert server.requests.count(("list", "resourceslices")) == 1


@pytest.mark.slow
async def test_watches_cut_at_once_back_off(server: ApiServer, tmp_path: Path) -> None:
    server.max_watch_seconds = 0  # a proxy that ends every watch at once, with no event
    w = watcher(server, tmp_path)
    async with running(w):
        await until(lambda: w.up)
        await asyncio.sleep(1.0)
    # Back-off 0.05 s doubling to 0.2 s: a handful of watches a second, not a loop.
    assert 3 <= server.requests.count(("watch", "resourceslices")) <= 12


async def test_410_gone_lists_again_and_drops_what_was_deleted_meanwhile(
    server: ApiServer, tmp_path: Path
) -> None:
    w = watcher(server, tmp_path)
    async with running(w):
        await until(lambda: w.up and server.requests.count(("watch", "resourceslices")) == 1)
        server.change_unseen("resourceslices", rslice("s0"), deleted=True)
        await until(lambda: names(w) == ["s1", "s2", "s3", "s4"])
        assert server.requests.count(("list", "resourceslices")) == 2


@pytest.mark.slow
async def test_forbidden_is_said_once_and_rules_not_served_once(
    server: ApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server.forbidden.add("resourceslices")
    w = watcher(server, tmp_path)
    with caplog.at_level(logging.INFO, logger="exporter.kubeapi.slices"):
        async with running(w):
            await until(lambda: server.requests.count(("list", "resourceslices")) >= 3)
            await until(lambda: server.requests.count(("list", "devicetaintrules")) >= 2)
            assert not w.up and w.rules_served is False
            server.forbidden.clear()
            await until(lambda: w.up)
    lines = [r.getMessage() for r in caplog.records]
    denied = [line for line in lines if "403" in line]
    assert len(denied) == 1 and "dra component" in denied[0], lines
    assert sum("not served" in line for line in lines) == 1, lines
    assert "ResourceSlices readable again" in lines


async def test_rules_where_served_and_claim_health_from_the_whole_pod_watch(
    tmp_path: Path,
) -> None:
    server = ApiServer(serve_taint_rules=True).start()
    try:
        server.put(
            "devicetaintrules",
            {
                "apiVersion": "resource.k8s.io/v1beta2",
                "kind": "DeviceTaintRule",
                "metadata": {"name": "drain"},
                "spec": {
                    "deviceSelector": {"driver": "gpu.example.com"},
                    "taint": {"key": "drain", "effect": "NoExecute"},
                },
            },
        )
        train: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "train", "namespace": "ml", "uid": "u1"},
            "spec": {"nodeName": NODE},
            "status": {"containerStatuses": [{"name": "main"}]},
        }
        server.put("pods", train)
        w = watcher(server, tmp_path)
        kubeconfig = server.kubeconfig(tmp_path / "pods.kubeconfig")
        pods = pod_watcher(kubeconfig, pod_status=read_pod_status)
        async with running(pods), running(w):
            await until(lambda: [r.name for r in w.current()[2]] == ["drain"])
            await until(lambda: "u1" in pods.pods)
            assert not pods.pods["u1"].health
            # The kubelet writes the driver's Unhealthy report: the watch event brings it.
            train["status"]["containerStatuses"][0]["allocatedResourcesStatus"] = [
                {
                    "name": "claim:gpu",
                    "resources": [
                        {
                            "resourceID": "gpu.example.com/node-a/s0-dev0",
                            "health": "Unhealthy",
                            "message": "XID 79",
                        }
                    ],
                }
            ]
            server.put("pods", train)
            await until(lambda: pods.pods["u1"].health)
            (health,) = pods.pods["u1"].health
            assert (
                health.container,
                health.claim,
                health.resource_id,
                health.health,
                health.message,
            ) == ("main", "gpu", "gpu.example.com/node-a/s0-dev0", "Unhealthy", "XID 79")
            assert server.requests.count(("list", "pods")) == 1
            assert ("get", "pods") not in server.requests
    finally:
        server.stop()
