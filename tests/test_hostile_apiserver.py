"""The watches against an API server that answers what no real one does (issue 41): list items
and watch lines of the wrong shape or encoding, lists without end, lines without end,
answers dripped a byte at a time, more pods than a node runs, a ResourceSlice event that is
an array, a DeviceTaintRule whose spec is a list, an owner reference without a uid, and a
bug in applying an event.

Each: the answer is refused at the decode boundary (kubeapi/answers.py), counted by reason,
said in one line, `up` reads 0 while the data is stale, the cache is kept; and once the
server is mended the requests resume and the data comes back. No watcher stops. The bounds
are made small here (the exporter's own are in docs/reliability.md); bench/peer_faults.py
runs the same attacks at full size against exporter processes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.dra.slicewatch import SliceWatcher
from exporter.kubeapi.answers import Limits
from exporter.kubeapi.watcher import PodWatcher
from tests.support import hostile
from tests.support.hostile import HostileApiServer
from tests.support.kubeapi import (
    NODE,
    connector,
    fast,
    owner_object,
    pod,
    pod_watcher,
    put_owner,
    running,
)
from tests.support.waiting import until

TRAIN = pod("train-1", "ml", labels={"team": "vision"}, owner=("ReplicaSet", "train-7d9f", "rs-1"))
DB = pod("db-0", "data")
HOLDERS = [("ml", "train-1"), ("data", "db-0"), ("ml", "new-0")]


@pytest.fixture
def server() -> Iterator[HostileApiServer]:
    srv = HostileApiServer().start()
    put_owner(srv, owner_object("ReplicaSet", "train-7d9f", "rs-1", "ml",
                                ("Deployment", "train", "d-1")))  # fmt: skip
    srv.put("pods", TRAIN)
    srv.put("pods", DB)
    yield srv
    srv.stop()


QUICK = fast(backoff=(0.01, 0.04), denied_backoff=0.04)
"""Back-off steps a fifth of `fast()`'s: each attack is retried within tens of ms."""


def watcher_of(server: HostileApiServer, tmp_path: Path, **options: object) -> PodWatcher:
    options.setdefault("timing", QUICK)
    return pod_watcher(server.kubeconfig(tmp_path / "kubeconfig"), ["team"], owner_retry=0.05,
                       **options)  # type: ignore[arg-type]  # fmt: skip


def named(watcher: PodWatcher) -> dict[str, dict[str, str]]:
    return {p.pod: dict(p.attributes) for p in watcher.pod_infos(HOLDERS)}


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


async def refused_then_mended(
    server: HostileApiServer, watcher: PodWatcher, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    """While attacked: refused (twice: retried), not up, one warning; mended: asked again,
    up, the pods named as the server holds them."""
    with caplog.at_level(logging.WARNING, logger="exporter.kubeapi"):
        async with running(watcher):
            await until(lambda: watcher.feed.sync.refused[reason] >= 2, what="refused twice")
            assert not watcher.health().up
            assert watcher.health().refused[("kubernetes-api", "pods", reason)] >= 2
            before = len(server.requests)
            server.mend()
            server.put("pods", pod("new-0", "ml", labels={"team": "audio"}))
            await until(lambda: watcher.health().up and {"new-0", "train-1"} <= set(named(watcher)))
            assert len(server.requests) > before
            assert named(watcher)["train-1"]["k8s.deployment.name"] == "train"
    [line] = warnings(caplog)
    assert "pod answer unusable" in line and "asking again with back-off" in line, line


@pytest.mark.parametrize("what", list(hostile.BAD_POD_LISTS))
async def test_a_pod_list_no_api_server_sends_is_refused_and_retried(
    server: HostileApiServer, tmp_path: Path, what: str, caplog: pytest.LogCaptureFixture
) -> None:
    server.attack("list", "pods", hostile.list_of(*hostile.BAD_POD_LISTS[what]))
    await refused_then_mended(server, watcher_of(server, tmp_path), "decode", caplog)


@pytest.mark.parametrize("what", list(hostile.BAD_WATCH_LINES))
async def test_a_pod_watch_line_no_api_server_sends_is_refused_and_retried(
    server: HostileApiServer, tmp_path: Path, what: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The list is good; each watch answers one bad line: refused, listed again after the
    back-off (a watch resumed would replay what broke), the cache kept meanwhile."""
    server.attack("watch", "pods", hostile.watch_lines(hostile.BAD_WATCH_LINES[what], hold=0))
    watcher = watcher_of(server, tmp_path)
    await refused_then_mended(server, watcher, "decode", caplog)
    assert server.count("list", "pods") >= 3


async def test_a_list_without_end_is_refused_at_its_page_and_pod_bounds(
    server: HostileApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server.attack("list", "pods", hostile.pages_forever(per_page=1))
    watcher = watcher_of(server, tmp_path, limits=Limits(pages=5))
    await refused_then_mended(server, watcher, "pages", caplog)
    assert watcher.health().pods == 3


async def test_a_list_of_more_pods_than_a_node_runs_is_refused(
    server: HostileApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server.attack("list", "pods", hostile.pages_forever(per_page=30))
    watcher = watcher_of(server, tmp_path, limits=Limits(objects=50), max_pods=50)
    await refused_then_mended(server, watcher, "objects", caplog)


async def test_a_watch_line_without_end_is_refused_at_its_byte_bound(
    server: HostileApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server.attack("watch", "pods", hostile.endless_line())
    watcher = watcher_of(server, tmp_path, limits=Limits(answer_bytes=1 << 20))
    await refused_then_mended(server, watcher, "bytes", caplog)


@pytest.mark.slow
async def test_an_answer_dripped_a_byte_at_a_time_is_refused_at_its_deadline(
    server: HostileApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server.attack("list", "pods", hostile.drip(b'{"items": []}' * 20, 0.02))
    watcher = watcher_of(server, tmp_path, limits=Limits(read_seconds=0.2))
    await refused_then_mended(server, watcher, "time", caplog)


async def test_a_watch_past_max_pods_keeps_the_cache_and_lists_again(
    server: HostileApiServer, tmp_path: Path
) -> None:
    watcher = watcher_of(server, tmp_path, max_pods=2)
    async with running(watcher):
        await until(lambda: watcher.health().up)
        server.put("pods", pod("new-0", "ml"))  # a third pod on a node of two
        await until(lambda: watcher.feed.sync.refused["objects"] >= 1)
        assert watcher.health().pods == 2 and not watcher.health().up
        server.delete("pods", DB)  # two again: the next list is whole
        await until(lambda: watcher.health().up and "new-0" in named(watcher))
    assert set(named(watcher)) == {"train-1", "new-0"}


async def test_a_bug_applying_an_event_is_logged_with_its_traceback_and_the_watch_goes_on(
    server: HostileApiServer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    watcher = watcher_of(server, tmp_path)
    real, calls = PodWatcher.apply, []

    def buggy(self: PodWatcher, kind: str, meta: object) -> None:
        calls.append(kind)
        if len(calls) <= 2:
            raise KeyError("a bug")
        real(self, kind, meta)  # type: ignore[arg-type]

    monkeypatch.setattr(PodWatcher, "apply", buggy)
    with caplog.at_level(logging.WARNING, logger="exporter.kubeapi"):
        async with running(watcher):
            await until(lambda: watcher.health().up)
            server.put("pods", pod("new-0", "ml"))
            await until(lambda: "new-0" in named(watcher))
    [record] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "failed unexpectedly (KeyError" in record.getMessage() and record.exc_info


# --- the slice watch, the taint rules, the owners ------------------------------------------


def slice_obj(name: str) -> dict[str, object]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {"driver": "gpu.example.com", "nodeName": NODE,
                     "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0"}]}}  # fmt: skip


async def test_a_slice_watch_event_that_is_an_array_is_refused_and_retried(
    server: HostileApiServer, tmp_path: Path
) -> None:
    server.put("resourceslices", slice_obj("s1"))
    line = hostile.BAD_WATCH_LINES["the object is an array"]
    server.attack("watch", "resourceslices", hostile.watch_lines(line, hold=0))
    slices = SliceWatcher(connector(server.kubeconfig(tmp_path / "kubeconfig")), NODE,
                          timing=QUICK, rule_interval=0.02)  # fmt: skip
    async with running(slices):
        await until(lambda: slices.sync.refused["decode"] >= 2)
        assert not slices.up and set(slices.slices) == {"s1"}
        server.mend()
        server.put("resourceslices", slice_obj("s2"))
        await until(lambda: slices.up and set(slices.slices) == {"s1", "s2"})
    assert slices.refused()[("kubernetes-api", "resourceslices", "decode")] >= 2


async def test_more_slices_than_the_bound_are_refused(
    server: HostileApiServer, tmp_path: Path
) -> None:
    for i in range(3):
        server.put("resourceslices", slice_obj(f"s{i}"))
    slices = SliceWatcher(connector(server.kubeconfig(tmp_path / "kubeconfig")), NODE,
                          timing=QUICK, max_slices=2)  # fmt: skip
    async with running(slices):
        await until(lambda: slices.sync.refused["objects"] >= 2)
        server.delete("resourceslices", slice_obj("s2"))
        await until(lambda: slices.up and set(slices.slices) == {"s0", "s1"})


async def test_a_taint_rule_whose_spec_is_a_list_keeps_the_last_rules(
    server: HostileApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rule = {"metadata": {"name": "r1"}, "spec": {"deviceSelector": {"driver": "gpu.example.com"},
            "taint": {"key": "k", "value": "v", "effect": "NoSchedule"}}}  # fmt: skip
    server.put("devicetaintrules", rule)
    slices = SliceWatcher(connector(server.kubeconfig(tmp_path / "kubeconfig")), NODE,
                          timing=QUICK, rule_interval=0.02)  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="exporter.kubeapi"):
        async with running(slices):
            await until(lambda: [r.name for r in slices.rules] == ["r1"])
            server.attack("list", "devicetaintrules",
                          hostile.list_of({"metadata": {"name": "r2"}, "spec": []}))  # fmt: skip
            await until(lambda: slices.rules_refused["decode"] >= 2)
            assert [r.name for r in slices.rules] == ["r1"]
            server.mend()
            server.put("devicetaintrules", {**rule, "metadata": {"name": "r3"}})
            await until(lambda: [r.name for r in slices.rules] == ["r1", "r3"])
    [line] = warnings(caplog)
    assert "DeviceTaintRules answer unusable" in line, line


async def test_an_owner_reference_without_a_uid_is_refused_and_read_again(
    server: HostileApiServer, tmp_path: Path
) -> None:
    server.attack("get", "replicasets", hostile.answer({"metadata": {
        "name": "train-7d9f", "ownerReferences": [{"kind": "Deployment", "name": "train",
                                                   "controller": True}]}}))  # fmt: skip
    watcher = watcher_of(server, tmp_path)
    async with running(watcher):
        await until(lambda: watcher.owners_refused["decode"] >= 2)
        assert "k8s.deployment.name" not in named(watcher)["train-1"]
        server.mend()
        await until(lambda: named(watcher)["train-1"].get("k8s.deployment.name") == "train")
    assert watcher.health().refused[("kubernetes-api", "owners", "decode")] >= 2


async def test_the_decode_boundary_stops_nothing_else(
    server: HostileApiServer, tmp_path: Path
) -> None:
    """A good server through the boundary: one list, the watch open is in sync at once (no
    event needed for `up`), the pods named."""
    watcher = watcher_of(server, tmp_path)
    async with running(watcher):
        await until(lambda: watcher.health().up and len(watcher.owners) == 1)
        await asyncio.sleep(0.05)
    assert server.count("list", "pods") == 1 and not watcher.feed.sync.refused
    assert named(watcher)["train-1"]["k8s.workload.name"] == "train"
