"""The pod watch against the loopback API server (simulator/apiserver.py), which speaks the
Kubernetes list/watch protocol.

Initial list, watch events, bookmarks, a watch the server ends, 410 Gone -> re-list, 401/403,
an unreachable server; owners resolved once; and the requests it costs per hour.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import pytest

from exporter.cli.flags import parse_config
from exporter.cli.parser import UsageError
from exporter.kubeapi.client import KubeApi, describe, http_client, load_config
from exporter.kubeapi.listwatch import Timing
from exporter.kubeapi.watcher import PodWatcher
from simulator.apiserver import ApiServer
from tests.support.kubeapi import NODE, fast, owner_object, pod, pod_watcher, put_owner, running
from tests.support.waiting import until

TRAIN = pod("train-7d9f-abcde", "ml", labels={"team": "vision", "app.kubernetes.io/name": "train",
            "pod-template-hash": "7d9f"}, owner=("ReplicaSet", "train-7d9f", "rs-1"))  # fmt: skip
NIGHTLY = pod("nightly-290-x1", "ml", labels={"team": "nlp"}, owner=("Job", "nightly-290", "job-1"))
DB = pod("db-0", "data", owner=("StatefulSet", "db", "sts-1"))
BARE = pod("debug", "default")
ELSEWHERE = pod("other", "ml", node="node-b", owner=("ReplicaSet", "x-1", "rs-9"))
HOLDERS = [
    ("ml", "train-7d9f-abcde"),
    ("ml", "nightly-290-x1"),
    ("data", "db-0"),
    ("default", "debug"),
]


@pytest.fixture
def server() -> Iterator[ApiServer]:
    srv = ApiServer().start()
    put_owner(
        srv, owner_object("ReplicaSet", "train-7d9f", "rs-1", "ml", ("Deployment", "train", "d-1"))
    )
    put_owner(
        srv, owner_object("Job", "nightly-290", "job-1", "ml", ("CronJob", "nightly", "cj-1"))
    )
    for p in (TRAIN, NIGHTLY, DB, BARE, ELSEWHERE):
        srv.put("pods", p)
    yield srv
    srv.stop()


def make_watcher(
    kubeconfig: Path, timing: Timing | None = None, owner_ttl: float = 3600.0
) -> PodWatcher:
    return pod_watcher(kubeconfig, [r"team", r"app\.kubernetes\.io/.*"], timing=timing or fast(),
                       owner_ttl=owner_ttl, owner_retry=0.05)  # fmt: skip


def infos(watcher: PodWatcher) -> dict[str, dict[str, str]]:
    return {p.pod: dict(p.attributes) for p in watcher.pod_infos([*HOLDERS, ("ml", "new-0")])}


async def test_list_resolves_workloads_labels_and_uids(server: ApiServer, tmp_path: Path) -> None:
    watcher = make_watcher(server.kubeconfig(tmp_path / "kubeconfig"))
    async with running(watcher):
        await until(lambda: len(watcher.owners) == 2)
        got = infos(watcher)
    assert got == {
        "train-7d9f-abcde": {
            "k8s.pod.uid": "uid-ml-train-7d9f-abcde",
            "k8s.replicaset.name": "train-7d9f",
            "k8s.deployment.name": "train",
            "k8s.workload.kind": "Deployment",
            "k8s.workload.name": "train",
            "k8s.pod.label.app.kubernetes.io/name": "train",
            "k8s.pod.label.team": "vision",
        },
        "nightly-290-x1": {
            "k8s.pod.uid": "uid-ml-nightly-290-x1",
            "k8s.job.name": "nightly-290",
            "k8s.cronjob.name": "nightly",
            "k8s.workload.kind": "CronJob",
            "k8s.workload.name": "nightly",
            "k8s.pod.label.team": "nlp",
        },
        "db-0": {
            "k8s.pod.uid": "uid-data-db-0",
            "k8s.statefulset.name": "db",
            "k8s.workload.kind": "StatefulSet",
            "k8s.workload.name": "db",
        },
        "debug": {
            "k8s.pod.uid": "uid-default-debug",
            "k8s.workload.kind": "Pod",
            "k8s.workload.name": "debug",
        },
    }
    # Only this node's pods; one list, one GET per owner, all metadata-only.
    assert watcher.health().pods == 4
    assert (
        server.count("list", "pods"),
        server.count("get", "replicasets"),
        server.count("get", "jobs"),
    ) == (1, 1, 1)
    pods = [r for r in server.requests if r[1] == "pods"]
    assert [r for r in server.metadata_only if r[1] == "pods"] == pods
    assert watcher.health().requests_total[("list", "pods", "200")] == 1


async def test_watch_events_add_modify_delete(server: ApiServer, tmp_path: Path) -> None:
    watcher = make_watcher(server.kubeconfig(tmp_path / "kubeconfig"))
    async with running(watcher):
        await until(lambda: watcher.health().up)
        new = pod("new-0", "ml", labels={"team": "audio"})
        server.put("pods", new)
        await until(lambda: "new-0" in infos(watcher))
        assert infos(watcher)["new-0"]["k8s.pod.label.team"] == "audio"
        new["metadata"]["labels"]["team"] = "speech"
        server.put("pods", new)
        await until(lambda: infos(watcher)["new-0"].get("k8s.pod.label.team") == "speech")
        server.delete("pods", DB)
        await until(lambda: "db-0" not in infos(watcher))
        server.put("pods", pod("elsewhere-2", "ml", node="node-b"))
        await asyncio.sleep(0.1)
    assert watcher.health().pods == 4  # 4 listed, +new-0, -db-0; node-b's pod never arrives
    assert server.count("list", "pods") == 1


async def test_server_closing_the_watch_resumes_without_a_list(
    server: ApiServer, tmp_path: Path
) -> None:
    watcher = make_watcher(server.kubeconfig(tmp_path / "kubeconfig"))
    async with running(watcher):
        await until(lambda: server.count("watch", "pods") == 1)
        server.close_watches()
        await until(lambda: server.count("watch", "pods") == 2)
        server.put("pods", pod("new-0", "ml"))
        await until(lambda: "new-0" in infos(watcher))
    assert server.count("list", "pods") == 1
    assert server.watch_versions[1] == server.watch_versions[0]  # nothing happened in between


async def test_bookmark_moves_the_resume_version(tmp_path: Path) -> None:
    server = ApiServer(bookmark_every=0.1).start()
    try:
        server.put("pods", TRAIN)
        watcher = make_watcher(server.kubeconfig(tmp_path / "kubeconfig"))
        async with running(watcher):
            await until(lambda: server.count("watch", "pods") == 1)
            for i in range(5):  # changes this watch never sees: another node's pods
                server.put("pods", pod(f"b-{i}", node="node-b"))
            await asyncio.sleep(0.3)  # a bookmark carries the newer version
            server.close_watches()
            await until(lambda: server.count("watch", "pods") == 2)
        assert server.watch_versions[1] == server.version > server.watch_versions[0]
        assert server.count("list", "pods") == 1
    finally:
        server.stop()


async def test_410_gone_relists_and_drops_pods_deleted_in_the_gap(
    server: ApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="exporter.kubeapi")
    watcher = make_watcher(server.kubeconfig(tmp_path / "kubeconfig"))
    async with running(watcher):
        await until(lambda: server.count("watch", "pods") == 1)
        server.change_unseen("pods", BARE, deleted=True)
        await until(lambda: server.count("list", "pods") == 2)
        await until(lambda: "debug" not in infos(watcher))
        await until(lambda: server.count("watch", "pods") == 3)
    assert set(infos(watcher)) == {"train-7d9f-abcde", "nightly-290-x1", "db-0"}
    assert "410 Gone" in caplog.text
    assert server.watch_versions[1] < server.watch_versions[2]  # resumed from the new list


@pytest.mark.slow
async def test_forbidden_says_so_once_and_recovers(
    server: ApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server.forbidden.add("pods")
    watcher = make_watcher(server.kubeconfig(tmp_path / "kubeconfig"))
    with caplog.at_level(logging.INFO, logger="exporter.kubeapi"):
        async with running(watcher):
            denied = ("list", "pods", "403")
            await until(lambda: watcher.health().requests_total.get(denied, 0) >= 3)
            assert not watcher.health().up
            assert watcher.pod_infos(HOLDERS) == ()
            server.forbidden.clear()
            await until(lambda: watcher.health().up)
            await until(lambda: len(watcher.owners) == 2)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "403" in warnings[0] and "RBAC" in warnings[0]
    assert "answering again" in caplog.text
    assert len(infos(watcher)) == 4


async def test_wrong_token_is_401(server: ApiServer, tmp_path: Path) -> None:
    watcher = make_watcher(server.kubeconfig(tmp_path / "kubeconfig", token="stale"))
    async with running(watcher):
        await until(lambda: watcher.health().requests_total)
    assert set(watcher.health().requests_total) == {("list", "pods", "401")}
    assert not watcher.health().up


@pytest.mark.slow
async def test_unreachable_server_backs_off(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = ApiServer()  # never started: nothing listens on its port
    kubeconfig = server.kubeconfig(tmp_path / "kubeconfig")
    watcher = make_watcher(kubeconfig, fast(backoff=(0.05, 0.1)))
    async with running(watcher):
        await asyncio.sleep(0.5)
    attempts = sum(watcher.health().requests_total.values())
    assert 3 <= attempts <= 12  # backing off, not spinning
    assert all(code == "ConnectError" for (_, _, code) in watcher.health().requests_total)
    assert sum("Kubernetes API unavailable" in r.getMessage() for r in caplog.records) == 1
    # The one line names the request, the address and the cause.
    assert (
        f"Kubernetes API unavailable (ConnectError: GET {server.url}/api/v1/pods: "
        "All connection attempts failed)" in caplog.text
    )


async def test_a_silent_server_is_named_with_its_address(tmp_path: Path) -> None:
    """A server that accepts the connection and never answers: httpx's own text is empty
    ("Kubernetes API unavailable (ConnectTimeout: )" was all a user saw)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        never_started = ApiServer()
        never_started.port = int(silent.getsockname()[1])
        url = never_started.url
        kubeconfig = never_started.kubeconfig(tmp_path / "kubeconfig")
        api = KubeApi(http_client(load_config(kubeconfig), 0.2))
        try:
            with pytest.raises(httpx.TimeoutException) as timed_out:
                await api.list_pods(NODE)
        finally:
            await api.close()
    assert describe(timed_out.value) == f"ReadTimeout: GET {url}/api/v1/pods: no answer in time"


async def test_requests_are_not_logged_one_by_one(
    server: ApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The HTTP library's INFO line per request stays out of the log (they are counted in
    kubernetes_requests_total); at debug level it is there."""
    caplog.set_level(logging.INFO)
    watcher = make_watcher(server.kubeconfig(tmp_path / "kubeconfig"))
    async with running(watcher):
        await until(lambda: watcher.health().up and watcher.owners)
    assert sum(watcher.health().requests_total.values()) >= 3
    assert not [r for r in caplog.records if r.name.startswith("httpx")]
    caplog.clear()
    caplog.set_level(logging.DEBUG)
    watcher = make_watcher(server.kubeconfig(tmp_path / "kubeconfig"))
    async with running(watcher):
        await until(lambda: watcher.health().up)
    assert [r for r in caplog.records if r.name.startswith("httpx")]


async def test_no_cluster_configuration_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    watcher = make_watcher(tmp_path / "missing-kubeconfig")
    async with running(watcher):
        await asyncio.sleep(0.1)
    assert not watcher.health().up
    assert "Kubernetes API unavailable" in caplog.text


@pytest.mark.slow
async def test_requests_per_hour_in_steady_state(server: ApiServer, tmp_path: Path) -> None:
    """Steady state costs one watch request per watch timeout, plus owner re-reads.

    The server ends each watch after its `timeoutSeconds`; here 1 s stands for the 300-600 s
    the exporter asks for (client-go's randomization), and the owner TTL is scaled alike
    (3600 s -> 9 s, so none is due in the run). Counted over the run after the first sync."""
    scale = 450.0  # one test second = the mean watch timeout's worth of real seconds / 1 s
    watcher = make_watcher(server.kubeconfig(tmp_path / "kubeconfig"),
                           fast(watch_timeout=(1, 1), short_watch=0.5), owner_ttl=3600.0 / 400)  # fmt: skip
    async with running(watcher):
        await until(lambda: len(watcher.owners) == 2)
        before = list(server.requests)
        await asyncio.sleep(4.5)
        during = server.requests[len(before) :]
    watches = during.count(("watch", "pods"))
    assert 4 <= watches <= 5
    assert set(during) == {("watch", "pods")}  # no list, no owner GET in steady state
    per_hour = watches / 4.5 * 3600 / scale
    owners_per_hour = len(watcher.owners)  # each owner is re-read once an hour
    print(f"steady state: {per_hour:.1f} watch + {owners_per_hour} owner requests per node-hour")
    assert per_hour <= 10


@pytest.mark.slow
async def test_watches_cut_at_once_back_off(tmp_path: Path) -> None:
    """A proxy that ends every watch immediately: backing off, not a request loop."""
    server = ApiServer()
    server.max_watch_seconds = 0  # a proxy that ends every watch at once
    server.start()
    try:
        server.put("pods", TRAIN)
        watcher = make_watcher(server.kubeconfig(tmp_path / "kubeconfig"))
        async with running(watcher):
            await asyncio.sleep(1.0)
        assert 3 <= server.count("watch", "pods") <= 12
        assert server.count("list", "pods") == 1
        assert len(infos(watcher)) == 1
    finally:
        server.stop()


@pytest.mark.slow
async def test_410_on_every_watch_backs_off(server: ApiServer, tmp_path: Path) -> None:
    server.always_gone = True
    watcher = make_watcher(server.kubeconfig(tmp_path / "kubeconfig"))
    async with running(watcher):
        await asyncio.sleep(1.0)
    assert 3 <= server.count("list", "pods") <= 12
    assert (
        abs(server.count("watch", "pods") - server.count("list", "pods")) <= 1
    )  # one may be cut by the stop
    assert len(infos(watcher)) == 4  # each list still refreshes the cache


async def test_owners_forbidden_fall_back_to_the_direct_owner(
    server: ApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server.forbidden |= {"replicasets", "jobs"}
    watcher = make_watcher(server.kubeconfig(tmp_path / "kubeconfig"))
    async with running(watcher):
        await until(lambda: len(watcher.owners) == 2)
        await asyncio.sleep(0.2)  # owner_retry passes: nothing is re-read before the TTL
    train = infos(watcher)["train-7d9f-abcde"]
    assert (train["k8s.workload.kind"], train["k8s.workload.name"]) == ("ReplicaSet", "train-7d9f")
    assert "k8s.deployment.name" not in train
    assert (server.count("get", "replicasets"), server.count("get", "jobs")) == (1, 1)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "403" in warnings[0] and "RBAC" in warnings[0], warnings


def test_flags(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"--kubernetes\.kubeconfig: .*kc not found"):
        parse_config(["--kubernetes.api", "--kubernetes.kubeconfig", str(tmp_path / "kc")],
                     env={"NODE_NAME": "node-a"})  # fmt: skip
    (tmp_path / "kc").write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))  # fmt: skip
    config = parse_config(
        ["--kubernetes.api", "--kubernetes.pod-labels", "team", "--kubernetes.pod-labels",
         r"app\.kubernetes\.io/.*", "--kubernetes.kubeconfig", str(tmp_path / "kc")],
        env={"NODE_NAME": "node-a"},
    )  # fmt: skip
    assert config.kubernetes_api and config.node_name == "node-a"
    assert config.pod_label_patterns == ("team", r"app\.kubernetes\.io/.*")
    assert config.kubeconfig == tmp_path / "kc"
    env = parse_config([], env={"NODE_NAME": "n", "KDE_KUBERNETES_API": "true",
                                "KDE_KUBERNETES_POD_LABELS": "team|owner"})  # fmt: skip
    assert env.kubernetes_api and env.pod_label_patterns == ("team|owner",)
    assert not parse_config([], env={}).kubernetes_api
    with pytest.raises(UsageError, match="needs --node-name or NODE_NAME"):
        parse_config(["--kubernetes.api"], env={})
    with pytest.raises(UsageError, match="not a regular expression"):
        parse_config(["--kubernetes.pod-labels", "team("], env={})


def test_bad_regex_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from exporter.cli.main import main

    assert main(["--kubernetes.pod-labels", "(("]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--kubernetes.pod-labels" in err[0] and "regular expression" in err[0]


def test_otlp_carries_the_semantic_convention_attributes() -> None:
    """The info series over OTLP to a real gRPC receiver: the attributes under their OTel
    names (`k8s.pod.uid`, `k8s.deployment.name`, `k8s.pod.label.<key>`), node on the resource."""
    from exporter.model import KubeApiHealth, PodInfo, Snapshot
    from tests.otlp_receivers import GrpcReceiver, points_of
    from tests.otlp_snapshots import sink_for

    attrs = (("k8s.pod.uid", "u-1"), ("k8s.replicaset.name", "train-7d9f"),
             ("k8s.deployment.name", "train"), ("k8s.workload.kind", "Deployment"),
             ("k8s.workload.name", "train"), ("k8s.pod.label.app.kubernetes.io/name", "train"))  # fmt: skip
    snapshot = Snapshot(timestamp=1.0, node="node-a", pods=(PodInfo("ml", "train-0", attrs),),
                        kubeapi=KubeApiHealth(True, 3, {("watch", "pods", "200"): 2}))  # fmt: skip
    receiver = GrpcReceiver()
    sink = sink_for(receiver.endpoint, receiver.protocol)
    sink.start()
    try:
        sink.update(snapshot)
        sink.force_flush()
    finally:
        sink.shutdown()
        receiver.stop()
    got = points_of(receiver.accepted()[:1])  # the flush; shutdown exports again
    (info,) = [p for p in got if p.metric == "k8s.pod.workload.info"]
    assert info.attributes == {"k8s.namespace.name": "ml", "k8s.pod.name": "train-0", **dict(attrs)}
    assert info.resource["k8s.node.name"] == "node-a"
    (watches,) = [p for p in got if p.metric == "kube_device_exporter.kubernetes.requests"]
    assert (watches.value, watches.attributes["verb"], watches.monotonic) == (2, "watch", True)
