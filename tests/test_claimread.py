"""The ResourceClaim reads (exporter/dra/claimread.py) against the loopback API server
(simulator/apiserver.py): one `get` per claim PodResources lists, again on the settle
schedule and never more; a claim gone (404) dropped; reads denied (403) said once, backed
off, and nothing held back meanwhile; what was read kept through a failure.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.dra.claimread import ClaimReader
from exporter.kubeapi.answers import Limits
from simulator.apiserver import ApiServer
from tests.support.kubeapi import connector, fast, running
from tests.support.waiting import until


def rclaim(name: str, namespace: str = "ml", memory: str = "20Gi") -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.example.com", "pool": "node-a",
                 "device": "gpu-0", "shareID": f"share-{name}",
                 "consumedCapacity": {"memory": memory}}]}}}}  # fmt: skip


@pytest.fixture
def server() -> Iterator[ApiServer]:
    srv = ApiServer().start()
    srv.put("resourceclaims", rclaim("a"))
    srv.put("resourceclaims", rclaim("b"))
    yield srv
    srv.stop()


def reader(server: ApiServer, tmp: Path, **options: Any) -> ClaimReader:
    options.setdefault("settle", (0.2,))
    options.setdefault("refresh", 30.0)
    connect = connector(server.kubeconfig(tmp / "kubeconfig"))
    return ClaimReader(connect, timing=fast(), **options)


def gets(server: ApiServer) -> int:
    return server.requests.count(("get", "resourceclaims"))


async def test_each_listed_claim_is_read_then_again_on_the_schedule_only(
    server: ApiServer, tmp_path: Path
) -> None:
    r = reader(server, tmp_path)
    async with running(r):
        r.want([("ml", "a")])
        assert r.pending(("ml", "a"))  # listed, not read yet: held back
        await until(lambda: ("ml", "a") in r.current())
        assert not r.pending(("ml", "a"))
        (result,) = r.current()[("ml", "a")].results
        assert (result.share_id, result.consumed) == ("share-a", (("gpu.example.com/memory",
                                                                   20 * 2**30),))  # fmt: skip
        assert r.up and gets(server) == 1
        # The settle read (0.2 s here) sees what changed since; then nothing until refresh.
        server.put("resourceclaims", rclaim("a", memory="30Gi"))
        await until(lambda: r.current()[("ml", "a")].results[0].consumed[0][1] == 30 * 2**30)
        assert gets(server) == 2
        r.want([("ml", "a"), ("ml", "b")])  # a new claim is read at once, the other not again
        await until(lambda: ("ml", "b") in r.current())
        await until(lambda: gets(server) == 4, what="b's settle read")
        r.want([("ml", "b")])  # a claim no longer listed is forgotten
        await until(lambda: ("ml", "a") not in r.current())
        assert gets(server) == 4


async def test_a_deleted_claim_is_dropped(server: ApiServer, tmp_path: Path) -> None:
    r = reader(server, tmp_path)
    async with running(r):
        r.want([("ml", "a"), ("ml", "gone")])
        # Answered 404: no longer held back, joined as PodResources lists it (well within
        # the 10 s hold, so the answer did it). The server counts a request before the
        # reader has its answer: wait on the reader, not on the count.
        await until(lambda: ("ml", "a") in r.current() and not r.pending(("ml", "gone")))
        assert ("ml", "gone") not in r.current()
        assert r.up and gets(server) >= 2


async def test_denied_reads_are_said_once_kept_and_hold_nothing_back(
    server: ApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "exporter.kubeapi.claims")
    r = reader(server, tmp_path, settle=(0.05,), refresh=0.05)
    async with running(r):
        r.want([("ml", "a")])
        await until(lambda: ("ml", "a") in r.current())
        server.forbidden.add("resourceclaims")
        r.want([("ml", "a"), ("ml", "b")])
        await until(lambda: r.denied, what="403 seen")
        assert not r.pending(("ml", "b"))  # no read is coming: PodResources' word stands
        assert ("ml", "a") in r.current()  # what was read is kept
        seen = gets(server)
        await until(lambda: gets(server) > seen, timeout=2.0, what="a retry after the back-off")
        warnings = [m for m in caplog.messages if "cannot read ResourceClaims" in m]
        assert len(warnings) == 1 and "RBAC" in warnings[0]
        server.forbidden.clear()
        await until(lambda: ("ml", "b") in r.current(), timeout=2.0)
        assert r.up and not r.denied
        assert "ResourceClaims readable again" in caplog.messages


async def test_a_claim_not_read_is_held_back_only_for_a_while(tmp_path: Path) -> None:
    """An API server that never answers: a listed claim is pending for `hold`, then not."""
    r = ClaimReader(connector(tmp_path / "missing-kubeconfig"), timing=fast(), hold=0.2)
    async with running(r):
        r.want([("ml", "a")])
        assert r.pending(("ml", "a"))
        await until(lambda: not r.pending(("ml", "a")), timeout=2.0)
        assert not r.up and r.current() == {}


async def test_a_claim_answer_refused_at_the_boundary_keeps_the_last_read_and_recovers(
    server: ApiServer, tmp_path: Path
) -> None:
    """A claim over the byte bound, then one whose status is not an object: each counted
    in `refused` (the peer_answers_refused series), what was read of it kept, the other
    claims still read; a good answer is read again after the claim's own back-off."""
    connect = connector(
        server.kubeconfig(tmp_path / "kubeconfig"), limits=Limits(answer_bytes=4096)
    )
    r = ClaimReader(connect, timing=fast(), settle=(0.2,), refresh=30.0)
    async with running(r):
        r.want([("ml", "a")])
        await until(lambda: ("ml", "a") in r.current())
        r.want([("ml", "a"), ("ml", "b")])
        big = rclaim("a")
        big["metadata"]["annotations"] = {"padding": "x" * 8192}
        server.put("resourceclaims", big)
        await until(lambda: r.refused["bytes"] >= 1, what="the oversized claim refused")
        await until(lambda: ("ml", "b") in r.current(), what="b read while a is refused")
        assert r.current()[("ml", "a")].results[0].share_id == "share-a"  # kept
        broken = rclaim("a")
        broken["status"] = ["not", "an", "object"]
        server.put("resourceclaims", broken)
        await until(lambda: r.refused["decode"] >= 1, what="the misshapen claim refused")
        assert ("ml", "a") in r.current()
        server.put("resourceclaims", rclaim("a", memory="30Gi"))
        await until(lambda: r.current()[("ml", "a")].results[0].consumed[0][1] == 30 * 2**30)
        assert r.up
