"""The real kubelet (KDE_E2E_KUBELET, v1.32 here), Debian's containerd and runc, our device
plugin and static pods with busybox containers: the 14 behaviours of
docs/podresources.md ("Real-kubelet behaviours"), each test naming its
number. The answers are read with a plain gRPC client (tests/realnode/podresources.py),
so what is asserted is the kubelet's, not the exporter's.

Tier: real node (tests/realnode). Skips with one line when the kubelet binary, root or a
Debian tool is missing.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from exporter._proto.podresources.v1 import api_pb2 as v1
from tests.realnode.deviceplugin import ENV as DEVICES_ENV
from tests.realnode.kubelet import container_ids
from tests.realnode.podresources import Lister, allocatable_ids, code, containers, holdings
from tests.realnode.pods import Container, Pod
from tests.realnode.procs import environ, pids_in_container, pod_pids
from tests.realnode.standalone import (
    DUO,
    FAILING,
    GPU,
    GPUS,
    INIT,
    MIG,
    MIGS,
    NAMESPACE,
    PAIR,
    SIDECAR,
    SOLO,
    StandaloneNode,
    kubelet_or_skip,
    standalone_node,
)

pytestmark = pytest.mark.peer

KUBELET = kubelet_or_skip()
RUNNING = (SOLO, PAIR, DUO, INIT, SIDECAR)


@pytest.fixture(scope="module")
def node() -> Iterator[StandaloneNode]:
    yield from standalone_node(KUBELET)


@pytest.fixture
def fresh_node() -> Iterator[StandaloneNode]:
    """A node of its own, for tests that restart the kubelet or kill pods."""
    yield from standalone_node(KUBELET)


@pytest.fixture
def lister(node: StandaloneNode) -> Iterator[Lister]:
    client = Lister(node.socket)
    yield client
    client.close()


def name(node: StandaloneNode, pod: Pod) -> str:
    return pod.static_name(node.name)


def wait_until(check: Callable[[], bool], timeout: float, what: str, step: float = 0.02) -> float:
    """Seconds until `check()` is true; fails after `timeout`."""
    started = time.monotonic()
    deadline = started + timeout
    while time.monotonic() < deadline:
        if check():
            return time.monotonic() - started
        time.sleep(step)
    raise AssertionError(f"{what}: not within {timeout} s")


def test_1_one_entry_per_device(node: StandaloneNode, lister: Lister) -> None:
    """Behaviour 1: a container holding 2 GPUs gets two ContainerDevices, one ID each; so
    does every device in GetAllocatableResources."""
    listed = dict(containers(lister.list()))
    pair = listed[(NAMESPACE, name(node, PAIR), "main")]
    assert [(d.resource_name, len(d.device_ids)) for d in pair.devices] == [(GPU, 1), (GPU, 1)]
    allocatable = lister.allocatable()
    assert sorted(len(d.device_ids) for d in allocatable.devices) == [1] * (len(GPUS) + len(MIGS))


def test_2_order_changes_between_calls(node: StandaloneNode, lister: Lister) -> None:
    """Behaviour 2: the same state answers in another order (and other bytes) from call to
    call; the content is the same."""
    answers = []
    for _ in range(20):
        answers.append(lister.list_bytes())
        time.sleep(0.02)  # far under the rate limit (behaviour 12)
    # The failed pod's device leaves List whenever the device manager next frees it
    # (behaviour 6, observed mid-run here): only the running pods' content must not change.
    failed = name(node, FAILING)
    parsed = [
        {
            h: r
            for h, r in holdings(v1.ListPodResourcesResponse.FromString(a)).items()
            if h[1] != failed
        }
        for a in answers
    ]
    for i, p in enumerate(parsed):
        assert p == parsed[0], (
            i,
            [(h, r) for h, r in parsed[0].items() if p.get(h) != r],
            [(h, r) for h, r in p.items() if parsed[0].get(h) != r],
        )
    assert len(set(answers)) > 1, "20 List answers were byte-identical"
    orders = {
        tuple(p.name for p in v1.ListPodResourcesResponse.FromString(a).pod_resources)
        for a in answers
    }
    assert len(orders) > 1, "pods came in one order every time"


def test_3_socket_stays_behind_a_stopped_kubelet(fresh_node: StandaloneNode) -> None:
    """Behaviour 3: a stopped kubelet leaves kubelet.sock; connecting answers UNAVAILABLE
    (connection refused) until a new kubelet replaces the file."""
    lister = Lister(fresh_node.socket)
    try:
        before = _identity(fresh_node.socket)
        fresh_node.kubelet.stop()
        assert fresh_node.socket.exists()
        with pytest.raises(grpc.RpcError) as refused:
            lister.list()
        assert code(refused.value) == grpc.StatusCode.UNAVAILABLE
        assert "Connection refused" in str(refused.value.details())
        fresh_node.kubelet.start()
        fresh_node.kubelet.wait_ready()
        wait_until(lambda: _identity(fresh_node.socket) != before, 20, "a new socket file")
        wait_until(lambda: _answers(lister), 20, "the new kubelet answering on the old channel")
    finally:
        lister.close()


def _identity(path: Path) -> tuple[int, int]:
    """(inode, ctime): the new file often gets the freed inode number back (the exporter's
    client tells sockets apart the same way)."""
    st = path.stat()
    return st.st_ino, st.st_ctime_ns


def _answers(lister: Lister) -> bool:
    try:
        lister.list()
    except grpc.RpcError:
        return False
    return True


def _restart_with_plugins_down(
    node: StandaloneNode, lister: Lister, down: float
) -> list[tuple[float, int, int, int]]:
    """Stop the plugins, restart the kubelet, register the plugins `down` seconds after
    the kubelet started; every ~25 ms until 1.5 s after that: (seconds since start, pods
    in List, device IDs in List, device IDs in GetAllocatableResources); -1s for a failed
    call. Two calls per round stay under the rate limit (behaviour 12)."""
    for plugin in node.plugins:
        plugin.stop()
    node.kubelet.stop()
    node.kubelet.start()
    started = time.monotonic()
    seen = []
    registered = False
    while time.monotonic() < started + down + 1.5:
        if not registered and time.monotonic() >= started + down:
            for plugin in node.plugins:
                plugin.start()
            registered = True
        at = time.monotonic() - started
        try:
            listed, allocatable = lister.list(), lister.allocatable()
        except grpc.RpcError:
            seen.append((at, -1, -1, -1))
        else:
            ids = sum(len(d.device_ids) for _, c in containers(listed) for d in c.devices)
            free = sum(len(d.device_ids) for d in allocatable.devices)
            seen.append((at, len(listed.pod_resources), ids, free))
        time.sleep(0.025)
    return seen


def test_4_restart_window_list_from_checkpoint_allocatable_waits_for_plugin(
    fresh_node: StandaloneNode,
) -> None:
    """Behaviour 4: after a restart List is back from the device manager's checkpoint while
    GetAllocatableResources stays empty for as long as the plugins are away; it is whole
    again once they register. (The reference's first ~0.25 s with both answers empty is
    printed when seen: a race this test measures, not asserts.)"""
    lister = Lister(fresh_node.socket)
    held_before = holdings(lister.list())
    try:
        seen = _restart_with_plugins_down(fresh_node, lister, down=2.5)
    finally:
        lister.close()
    answered = [s for s in seen if s[1] >= 0]
    assert answered, f"the kubelet never answered after the restart: {seen}"
    empty_both = [s for s in answered if s[1] == 0 and s[3] == 0]
    listed_again = next((s[0] for s in answered if s[1] > 0), None)
    print(
        f"behaviour 4: first answer {answered[0][0]:.3f} s after the start, {len(empty_both)} "
        f"answers with List and allocatable both empty, List back at {listed_again} s"
    )
    while_down = [s for s in answered if s[0] < 2.5]
    assert while_down, f"no answer while the plugins were away: {seen}"
    running_ids = sum(
        len(ids)
        for h, r in held_before.items()
        for ids in r.values()
        if h[1] != name(fresh_node, FAILING)
    )
    assert any(s[2] >= running_ids - 1 for s in while_down), (
        f"List never came back while the plugins were away: {seen}"
    )
    assert all(s[3] == 0 for s in while_down), (
        f"allocatable not empty while the plugins were away: {seen}"
    )
    assert answered[-1][3] == len(GPUS) + len(MIGS), (
        f"allocatable not whole after the plugins registered: {seen}"
    )


def test_5_restart_kills_pod_whose_finished_init_container_held_a_gpu(
    fresh_node: StandaloneNode,
) -> None:
    """Behaviour 5: a kubelet restart while the plugin is away rejects the pod whose finished
    init container held a GPU at re-admission ("Allocate failed due to no healthy devices
    present"), kills it (Failed), and its devices leave List; pods whose GPU containers run
    survive with the same devices."""
    lister = Lister(fresh_node.socket)
    try:
        before = holdings(lister.list())
        _restart_with_plugins_down(fresh_node, lister, down=1.5)
        killed = fresh_node.kubelet.wait_pod(INIT.name, "Failed", timeout=30)
        assert killed["status"]["reason"] == "UnexpectedAdmissionError"
        assert "no healthy devices present" in killed["status"]["message"]
        gone = wait_until(
            lambda: not any(holdings(lister.list()).get((NAMESPACE, name(fresh_node, INIT), "app"), {}).values()),
            30, "the killed pod's devices leaving List", step=0.2,
        )  # fmt: skip
        print(
            f"behaviour 5: the killed pod's devices left List {gone:.1f} s after the plugins were back"
        )
        after = holdings(lister.list())
    finally:
        lister.close()
    for pod in (SOLO, PAIR, DUO, SIDECAR):
        assert fresh_node.kubelet.wait_pod(pod.name, "Running", timeout=5)
        for holder, held in before.items():
            if holder[1] == name(fresh_node, pod):
                assert after[holder] == held, holder


def test_6_failed_pod_stays_in_list(node: StandaloneNode, lister: Lister) -> None:
    """Behaviour 6: a Failed pod stays in List with its containers. Its device is freed when
    the device manager next allocates (here: a new pod takes the failed pod's MIG slice),
    and List then shows the failed pod's container with no devices."""
    failed = name(node, FAILING)
    listed = holdings(lister.list())
    assert (NAMESPACE, failed, "crash") in listed
    taker = Pod("taker", [Container("main", {MIG: 1})])
    node.place([taker])
    try:
        after = holdings(lister.list())
        assert (NAMESPACE, failed, "crash") in after
        assert after[(NAMESPACE, failed, "crash")] == {}
        held = listed[(NAMESPACE, failed, "crash")].get(MIG, [])
        print(f"behaviour 6: the failed pod held {held} when the test began")
        taken = after[(NAMESPACE, name(node, taker), "main")][MIG]
        held_by_duo = {
            i for h, r in after.items() if h[1] == name(node, DUO) for i in r.get(MIG, [])
        }
        assert set(taken) | held_by_duo == set(MIGS)
    finally:
        taker.remove(node.kubelet.manifests)
        wait_until(
            lambda: (NAMESPACE, name(node, taker), "main") not in holdings(lister.list()),
            20,
            "taker gone",
        )


def test_7_static_pod_leaves_list_while_its_containers_still_run(
    node: StandaloneNode, lister: Lister
) -> None:
    """Behaviour 7: removing a static pod's manifest takes it out of List within a moment,
    while its container still runs for its grace period (sleep as PID 1 ignores SIGTERM)."""
    leaving = Pod("leaving", [Container("main", {GPU: 1})], grace_seconds=4)
    node.place([leaving])
    uid = node.kubelet.wait_pod(leaving.name)["metadata"]["uid"]
    pids = pod_pids(uid)
    assert pids, "no process in the pod's cgroup"
    removed = time.monotonic()
    leaving.remove(node.kubelet.manifests)
    holder = (NAMESPACE, name(node, leaving), "main")
    gone = wait_until(lambda: holder not in holdings(lister.list()), 10, "the pod leaving List")
    alive = [p for p in pids if Path(f"/proc/{p}").exists()]
    print(
        f"behaviour 7: left List {gone:.2f} s after its manifest was removed; {len(alive)} of {len(pids)} processes still running"
    )
    assert alive, "the containers stopped before the pod left List"
    wait_until(lambda: not pod_pids(uid), 20, "the pod's processes ending")
    assert time.monotonic() - removed >= 3, "the grace period was not honoured"


def test_8_init_containers(node: StandaloneNode, lister: Lister) -> None:
    """Behaviour 8: an ordinary init container never appears in List and its device goes
    to the app container (Allocate is called twice with the same ID); a sidecar init
    container (restartPolicy: Always) is listed, before the app containers."""
    answer = lister.list()
    by_pod = {p.name: p for p in answer.pod_resources}
    init_pod = by_pod[name(node, INIT)]
    assert [c.name for c in init_pod.containers] == ["app"]
    (app_device,) = [i for d in init_pod.containers[0].devices for i in d.device_ids]
    assert node.gpu.allocations.count([app_device]) == 2, node.gpu.allocations
    sidecar = by_pod[name(node, SIDECAR)]
    assert [c.name for c in sidecar.containers] == ["helper", "app"]
    assert all(len(c.devices) == 1 for c in sidecar.containers)
    # The app container got the device in its environment (the plugin's Allocate answer).
    app_cid = container_ids(node.kubelet.wait_pod(INIT.name))["app"]
    envs = [environ(p) for p in pids_in_container(app_cid)]
    assert any(e.get(DEVICES_ENV) == app_device for e in envs), envs


def test_9_unhealthy_device_leaves_allocatable_stays_in_list(
    node: StandaloneNode, lister: Lister
) -> None:
    """Behaviour 9: a device the plugin marks unhealthy leaves GetAllocatableResources on
    the next call, stays in List on its pod, and the pod keeps running."""
    holder = (NAMESPACE, name(node, SOLO), "main")
    (device,) = holdings(lister.list())[holder][GPU]
    node.gpu.set_health(device, False)
    try:
        took = wait_until(
            lambda: device not in allocatable_ids(lister.allocatable())[GPU],
            5,
            "leaving allocatable",
        )
        print(f"behaviour 9: left allocatable {took:.3f} s after ListAndWatch said Unhealthy")
        assert holdings(lister.list())[holder][GPU] == [device]
        assert node.kubelet.wait_pod(SOLO.name, "Running", timeout=1)
        assert len(allocatable_ids(lister.allocatable())[GPU]) == len(GPUS) - 1
    finally:
        node.gpu.set_health(device, True)
    wait_until(
        lambda: device in allocatable_ids(lister.allocatable())[GPU], 5, "back in allocatable"
    )


def test_10_stopped_plugin_takes_all_its_devices_out_at_once(
    node: StandaloneNode, lister: Lister
) -> None:
    """Behaviour 10: a plugin that stops takes all its devices out of
    GetAllocatableResources at once; List is unchanged; they return when it registers."""
    held = holdings(lister.list())
    node.mig.stop()
    try:
        answers = []

        def mig_gone() -> bool:
            answers.append(allocatable_ids(lister.allocatable()).get(MIG, []))
            return len(answers[-1]) < len(MIGS)

        wait_until(mig_gone, 10, "the MIG slices leaving allocatable", step=0.02)
        assert answers[-1] == [], f"the slices left one by one: {answers[-3:]}"
        assert holdings(lister.list()) == held
        assert allocatable_ids(lister.allocatable())[GPU] == sorted(GPUS)
    finally:
        node.mig.start()
    wait_until(
        lambda: allocatable_ids(lister.allocatable()).get(MIG) == sorted(MIGS),
        10,
        "the slices back",
    )


def test_11_no_cpus_or_memory_and_numa_zero_as_empty_node(
    node: StandaloneNode, lister: Lister
) -> None:
    """Behaviour 11: allocatable CPUs and memory are absent with the default CPU and memory
    manager policies; NUMA node 0 arrives as `topology { nodes { } }` (ID 0 is proto3's
    default), node 1 as `nodes { ID: 1 }`."""
    answer = lister.allocatable()
    assert list(answer.cpu_ids) == [] and list(answer.memory) == []
    raw = lister.allocatable_bytes()
    # ContainerDevices.topology (field 3) = TopologyInfo{nodes (field 1): NUMANode{...}}
    numa0 = b"\x1a\x02\x0a\x00"
    numa1 = b"\x1a\x04\x0a\x02\x08\x01"
    assert raw.count(numa0) == len(GPUS), raw
    assert raw.count(numa1) == len(MIGS), raw
    for _, container in containers(lister.list()):
        assert list(container.cpu_ids) == [] and list(container.memory) == []


def test_12_one_token_bucket_for_every_client_and_method(
    node: StandaloneNode, lister: Lister
) -> None:
    """Behaviour 12: one token bucket, 100 calls/s with a burst of 10, shared by every
    method and v1alpha1; failed calls spend tokens too. 200 back-to-back calls of four
    kinds: the answered ones fit one bucket (not one per method), the rest are
    RESOURCE_EXHAUSTED "rejected by rate limit"."""
    time.sleep(0.2)  # a full bucket
    calls: list[Callable[[], object]] = [
        lister.list, lister.allocatable, lister.list_v1alpha1,
        lambda: lister.get("no-such-pod", NAMESPACE),  # fails: UNKNOWN, spends a token
    ]  # fmt: skip
    outcomes: list[str] = []
    started = time.monotonic()
    for i in range(200):
        try:
            calls[i % 4]()
            outcomes.append("OK")
        except grpc.RpcError as exc:
            outcomes.append(code(exc).name + ":" + str(exc.details()))
    elapsed = time.monotonic() - started
    limited = [o for o in outcomes if o.startswith("RESOURCE_EXHAUSTED")]
    answered = len(outcomes) - len(limited)
    print(f"behaviour 12: {answered} of 200 answered in {elapsed:.3f} s")
    assert set(limited) == {"RESOURCE_EXHAUSTED:rejected by rate limit"}
    assert 10 <= answered <= 10 + 100 * elapsed + 2, (answered, elapsed)
    for kind in range(4):
        assert any(o.startswith("RESOURCE_EXHAUSTED") for o in outcomes[kind::4]), (
            f"method {kind} never limited"
        )
    assert any(o.startswith("UNKNOWN") for o in outcomes[3::4])
    time.sleep(0.2)  # leave the bucket full for the next test


def test_13_errors_and_v1alpha1(node: StandaloneNode, lister: Lister) -> None:
    """Behaviour 13: Get for an unknown pod answers UNKNOWN "pod NAME in namespace NS not
    found"; v1alpha1 List is served on the same socket, without topology, and (found
    here, not in the reference) without sidecar init containers: v1 lists them."""
    with pytest.raises(grpc.RpcError) as missing:
        lister.get("no-such-pod", NAMESPACE)
    assert code(missing.value) == grpc.StatusCode.UNKNOWN
    assert missing.value.details() == f"pod no-such-pod in namespace {NAMESPACE} not found"
    got = lister.get(name(node, SOLO), NAMESPACE).pod_resources
    assert [c.name for c in got.containers] == ["main"] and len(got.containers[0].devices) == 1
    raw = lister.v1alpha1_bytes()
    # Read with the v1 message: a topology field, if the kubelet sent one, would show.
    legacy = v1.ListPodResourcesResponse.FromString(raw)
    sidecar = (NAMESPACE, name(node, SIDECAR), "helper")
    current = holdings(lister.list())
    assert sidecar in current and sidecar not in holdings(legacy)
    assert holdings(legacy) == {h: r for h, r in current.items() if h != sidecar}
    assert all(not d.HasField("topology") for _, c in containers(legacy) for d in c.devices)


def test_14_plugin_folder_is_fixed_and_cleared_at_start(fresh_node: StandaloneNode) -> None:
    """Behaviour 14: the registration socket is in the fixed /var/lib/kubelet/device-plugins
    whatever --root-dir says, and a starting kubelet deletes every socket there (ours,
    another plugin's); plugins must register again."""
    folder = fresh_node.node.plugin_folder
    assert (folder / "kubelet.sock").is_socket()
    assert not (fresh_node.kubelet.root_dir / "device-plugins").exists()
    stranger = socket.socket(socket.AF_UNIX)
    stranger.bind(str(folder / "stranger.sock"))
    (folder / "notes.txt").write_text("not a socket")
    try:
        registrations = fresh_node.gpu.registrations
        fresh_node.kubelet.stop()
        assert (folder / fresh_node.gpu.endpoint).is_socket()
        fresh_node.kubelet.start()
        wait_until(
            lambda: not (folder / "stranger.sock").exists(), 20, "the kubelet clearing the folder"
        )
        wait_until(
            lambda: fresh_node.gpu.registrations > registrations, 20, "our plugin registering again"
        )
        print(
            f"behaviour 14: after the restart the folder holds {sorted(p.name for p in folder.iterdir())}"
        )
        fresh_node.kubelet.wait_ready()
        fresh_node.wait_allocatable()
    finally:
        stranger.close()
