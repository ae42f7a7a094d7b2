"""The pod cache read from the kubelet Pods API (exporter/kubeapi/podsapi.py) against the
simulated Pods API (tests/support/podsapi.py): the initial sync, events, a kubelet restart
(reconnect with back-off, the old cache served until INITIAL_SYNC_COMPLETE, one log line per
state change), and no pod list or watch on the API server, which still names the owners above
a ReplicaSet or Job.

Tier: simulated node (the Pods API) + loopback API server (owners).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import yaml

from exporter._proto.podsapi.v1alpha1 import api_pb2 as pb
from exporter.app import build_watchers
from exporter.cli.flags import parse_config
from exporter.kubeapi.podsapi import SOURCE_KUBELET, KubeletPods, decode_pod
from exporter.kubeapi.watcher import ApiPods, PodWatcher
from exporter.settings.config import DEFAULTS
from simulator.apiserver import ApiServer
from tests import kustomize
from tests.support.kubeapi import NODE, owner_object, pod, pod_watcher, put_owner, running
from tests.support.podsapi import FakePodsApi, encode
from tests.support.waiting import until

TRAIN = pod("train-7d9f-abcde", "ml", labels={"team": "vision", "pod-template-hash": "7d9f"},
            owner=("ReplicaSet", "train-7d9f", "rs-1"))  # fmt: skip
DB = pod("db-0", "data", owner=("StatefulSet", "db", "sts-1"))
BARE = pod("debug", "default")
NEW = pod("new-0", "ml", labels={"team": "nlp"})
HOLDERS = [("ml", "train-7d9f-abcde"), ("data", "db-0"), ("default", "debug"), ("ml", "new-0")]


@pytest.fixture
def server() -> Iterator[ApiServer]:
    srv = ApiServer().start()
    put_owner(
        srv, owner_object("ReplicaSet", "train-7d9f", "rs-1", "ml", ("Deployment", "train", "d-1"))
    )
    yield srv
    srv.stop()


@pytest.fixture
async def podsapi(tmp_path: Path) -> AsyncIterator[FakePodsApi]:
    fake = FakePodsApi(tmp_path / "pods-api.sock")
    for obj in (TRAIN, DB, BARE):
        fake.add(obj)
    await fake.start()
    yield fake
    await fake.stop()


def make_watcher(server: ApiServer, socket: Path, tmp_path: Path, grace: float = 0.5) -> PodWatcher:
    feed = functools.partial(KubeletPods, socket=socket, restart_grace=grace)
    return pod_watcher(server.kubeconfig(tmp_path / "kubeconfig"), [r"team"], feed=feed)


def streams(watcher: PodWatcher) -> int:
    """WatchPods calls the watcher made."""
    assert isinstance(watcher.feed, KubeletPods)
    return watcher.feed.streams


def workloads(watcher: PodWatcher) -> dict[str, str]:
    return {p.pod: dict(p.attributes)["k8s.workload.name"] for p in watcher.pod_infos(HOLDERS)}


def test_decode_pod_reads_the_controlling_owner_labels_and_uid() -> None:
    meta = decode_pod(encode(TRAIN))
    assert (meta.namespace, meta.name, meta.uid) == (
        "ml",
        "train-7d9f-abcde",
        "uid-ml-train-7d9f-abcde",
    )
    assert meta.labels == (("pod-template-hash", "7d9f"), ("team", "vision"))
    assert meta.owner is not None and (meta.owner.kind, meta.owner.name) == (
        "ReplicaSet",
        "train-7d9f",
    )


async def test_pods_from_the_kubelet_owners_from_the_api(
    server: ApiServer, podsapi: FakePodsApi, tmp_path: Path
) -> None:
    watcher = make_watcher(server, podsapi.socket, tmp_path)
    async with running(watcher):
        await until(lambda: len(watcher.pod_infos(HOLDERS)) == 3)
        got = {p.pod: dict(p.attributes) for p in watcher.pod_infos(HOLDERS)}
        assert got["train-7d9f-abcde"] == {
            "k8s.pod.uid": "uid-ml-train-7d9f-abcde",
            "k8s.replicaset.name": "train-7d9f",
            "k8s.deployment.name": "train",
            "k8s.workload.kind": "Deployment",
            "k8s.workload.name": "train",
            "k8s.pod.label.team": "vision",
        }
        assert workloads(watcher) == {"train-7d9f-abcde": "train", "db-0": "db", "debug": "debug"}
        podsapi.add(NEW)
        podsapi.delete(BARE)
        await until(lambda: "new-0" in workloads(watcher) and "debug" not in workloads(watcher))
        health = watcher.health()
    assert (health.up, health.pods, health.source) == (True, 3, SOURCE_KUBELET)
    # The API server served one owner read and no pod list or watch.
    assert server.count("list", "pods") == server.count("watch", "pods") == 0
    assert server.count("get", "replicasets") == 1
    assert podsapi.watches == 1


@pytest.mark.slow
async def test_a_kubelet_restart_keeps_the_cache_until_the_new_initial_sync(
    server: ApiServer, podsapi: FakePodsApi, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="exporter.kubeapi.podsapi")
    watcher = make_watcher(server, podsapi.socket, tmp_path)
    async with running(watcher):
        await until(lambda: len(workloads(watcher)) == 3)
        await podsapi.stop()
        await until(lambda: not watcher.health().up)
        made = streams(watcher)
        await until(lambda: streams(watcher) >= made + 3)  # three more tries, socket gone
        assert workloads(watcher) == {"train-7d9f-abcde": "train", "db-0": "db", "debug": "debug"}
        # The kubelet is back: debug was deleted meanwhile, new-0 started.
        podsapi.pods.pop(BARE["metadata"]["uid"])
        podsapi.add(NEW)
        podsapi.hold_sync = True
        await podsapi.start()
        await until(lambda: podsapi.watches == 2)
        assert not watcher.health().up  # replayed, not yet synced: the old cache still serves
        assert set(workloads(watcher)) == {"train-7d9f-abcde", "db-0", "debug"}
        podsapi.release_sync()
        await until(lambda: watcher.health().up)
        # debug, missing from the replay, stays the restart grace (0.5 s here), then goes.
        assert set(workloads(watcher)) == {"train-7d9f-abcde", "db-0", "debug", "new-0"}
        await until(lambda: "debug" not in workloads(watcher))
        assert workloads(watcher) == {"train-7d9f-abcde": "train", "db-0": "db", "new-0": "new-0"}
    lines = [r for r in caplog.records if r.name == "exporter.kubeapi.podsapi"]
    warnings = [r.getMessage() for r in lines if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings  # one line for the outage, not one per retry
    assert "UNAVAILABLE" in warnings[0] and "serving the 3 pods last synced" in warnings[0]
    assert [r.getMessage() for r in lines if r.levelno == logging.INFO][-1].endswith(
        "answering again"
    )
    assert server.count("list", "pods") == server.count("watch", "pods") == 0


@pytest.mark.slow
async def test_an_empty_replay_after_a_restart_loses_no_pod(
    server: ApiServer, podsapi: FakePodsApi, tmp_path: Path
) -> None:
    """As the real 1.36 kubelet after a restart (tests/test_real_cluster_podsapi.py): the first
    WatchPods replays no pod, INITIAL_SYNC_COMPLETE, then ADDED for each pod it runs."""
    watcher = make_watcher(server, podsapi.socket, tmp_path, grace=1.0)
    seen: list[int] = []
    async with running(watcher):
        await until(lambda: len(workloads(watcher)) == 3)
        await podsapi.stop()
        running_pods = list(podsapi.pods.values())
        podsapi.pods.clear()  # the restarted kubelet's pod manager is empty at first
        await podsapi.start()
        await until(lambda: podsapi.watches == 2 and watcher.health().up)
        seen.append(len(workloads(watcher)))
        for obj in running_pods:
            if obj is not BARE:  # debug was deleted while the kubelet was down
                podsapi.add(obj)
        await until(lambda: watcher.health().pods == 3)  # two re-added + debug, kept
        seen.append(len(workloads(watcher)))
        await until(lambda: "debug" not in workloads(watcher), timeout=3)
        assert workloads(watcher) == {"train-7d9f-abcde": "train", "db-0": "db"}
    assert seen == [3, 3]


async def test_pod_bytes_that_do_not_decode_reconnect_and_keep_the_cache(
    server: ApiServer, podsapi: FakePodsApi, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="exporter.kubeapi.podsapi")
    watcher = make_watcher(server, podsapi.socket, tmp_path)
    async with running(watcher):
        await until(lambda: len(workloads(watcher)) == 3)
        podsapi._send(pb.WatchPodsEvent(type=pb.ADDED, pod=b"\x0a\xff"))  # a truncated field
        await until(lambda: podsapi.watches == 2 and watcher.health().up)
        assert set(workloads(watcher)) == {"train-7d9f-abcde", "db-0", "debug"}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "(Error parsing message" in warnings[0], warnings


def test_the_socket_chooses_the_source(server: ApiServer, tmp_path: Path) -> None:
    socket = tmp_path / "pods-api.sock"
    kubeconfig = server.kubeconfig(tmp_path / "kubeconfig")
    args = ["--kubernetes.api", "--node-name", NODE, "--kubernetes.kubeconfig", str(kubeconfig),
            "--kubernetes.pods-api-socket", str(socket)]  # fmt: skip
    assert type(build_watchers(parse_config(args, {}))[0].feed) is ApiPods
    socket.touch()
    assert type(build_watchers(parse_config(args, {}))[0].feed) is KubeletPods
    off = [*args[:-1], ""]
    assert type(build_watchers(parse_config(off, {}))[0].feed) is ApiPods


@pytest.mark.peer
def test_the_kit_component_mounts_the_folder_the_flag_names(tmp_path: Path) -> None:
    """deploy/components/pods-api mounts the folder of --kubernetes.pods-api-socket's
    default, beside kubernetes-api's token and RBAC."""
    deploy = Path(__file__).resolve().parent.parent / "deploy"
    overlay = tmp_path / "mine"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(deploy / "base", overlay)],
        "components": [os.path.relpath(deploy / "components" / c, overlay)
                       for c in ("kubernetes-api", "pods-api")],
    }))  # fmt: skip
    (daemonset,) = [r for r in kustomize.build(overlay) if r["kind"] == "DaemonSet"]
    spec = daemonset["spec"]["template"]["spec"]
    folder = str(Path(DEFAULTS.pods_api_socket).parent)
    (volume,) = [v for v in spec["volumes"] if v["name"] == "pods-api"]
    assert volume["hostPath"]["path"] == folder
    (mount,) = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "pods-api"]
    assert (mount["mountPath"], mount["readOnly"]) == (folder, True)
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env["KDE_KUBERNETES_API"] == "true"
