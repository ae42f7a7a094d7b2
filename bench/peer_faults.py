"""Hostile peers (issue 41) against real exporter processes: an API server, a kubelet Pods
API, a kubelet PodResources and an OTLP/HTTP collector that answer what no real one does
(tests/support/hostile.py, tests/otlp_receivers.py), each on a simulated node (NVML, AMD
sysfs) at 1 s cycles. For each case: what the exporter did while the peer was broken (its
RSS peak, `kubernetes_up`, cycles run, the scrapes), whether it came back once the peer was
mended (requests after the fix, data back) and how long SIGTERM took. `python -m
bench.faults` runs it; alone:

    python -m bench.peer_faults [--tree DIR] [--only WORD]

`--tree DIR` runs the exporter processes from another checkout (the figures "before" in
docs/reliability.md come from the base commit run this way); `--only` runs the cases whose
name holds WORD.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.fault_harness import (
    Case,
    Process,
    Row,
    Watched,
    cases_main,
    read_metrics,
    run_cases,
    value,
)
from simulator.apiserver import ApiServer
from simulator.kubelet_wire import allocatable_to_v1
from simulator.node import SimulatedNode
from simulator.scenario import parse_scenario
from tests.otlp_receivers import Behaviour, GrpcReceiver, HttpReceiver
from tests.support import hostile
from tests.support.kubeapi import owner_object, pod, put_owner
from tests.support.waiting import within

NODE_NAME = "peer-node"
GPU = "GPU-41000000-0000-4000-8000-000000000041"
AMD = "0000:03:00.0"
SCENARIO = f"""
node: {NODE_NAME}
allocatable:
  - {{resource: nvidia.com/gpu, ids: ["{GPU}"]}}
  - {{resource: amd.com/gpu, ids: ["{AMD}"]}}
pods:
  - name: trainer-7d9f-x1
    namespace: ml
    containers:
      - name: main
        devices:
          - {{resource: nvidia.com/gpu, ids: ["{GPU}"]}}
          - {{resource: amd.com/gpu, ids: ["{AMD}"]}}
nvidia:
  gpus:
    - uuid: {GPU}
      utilization: {{pattern: sine, min: 0.1, max: 0.9, period: 7}}
sysfs:
  amdgpu:
    - {{pci: "{AMD}", card: 1, busy_percent: 37, vram_gib: 64, unique_id: 00ab, product: MI210}}
"""
TRAINER = pod("trainer-7d9f-x1", "ml", node=NODE_NAME, labels={"team": "vision"},
              owner=("ReplicaSet", "trainer-7d9f", "rs-41"))  # fmt: skip
INFO = "k8s_pod_workload_info"
UP = "kube_device_exporter_kubernetes_up"
CYCLES = "kube_device_exporter_cycles_total"
ATTACK_SECONDS = 15.0
KUBELET_SECONDS = 35.0
"""A kubelet attack's window: past one poll interval (30 s, the default)."""


@dataclass
class Node:
    """A simulated node (its kubelet ticking) and an exporter process on it."""

    work: Path
    tree: Path
    name: str
    sim: SimulatedNode = field(init=False)
    p: Process | None = None
    _ticking: asyncio.Task[None] | None = None
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.sim = SimulatedNode(parse_scenario(SCENARIO, name="peers"), self.work / self.name)

    async def start(self, args: list[str], env: dict[str, str] | None = None) -> Process:
        await self.sim.start()
        self._ticking = asyncio.create_task(self.sim.tick_forever(self._stop, 0.5))
        base = [*self.sim.exporter_args(), "--collect-interval", "1s"]
        self.p = Process(self.tree, self.work / f"{self.name}.log", [*base, *args],
                         {**self.sim.env(), **(env or {})})  # fmt: skip
        return self.p

    async def stop(self) -> str:
        """SIGTERM to exit, as the row says it."""
        took = None
        if self.p is not None:
            took = self.p.sigterm(20.0) if self.p.proc.poll() is None else -1.0
            self.p.kill()
        self._stop.set()
        if self._ticking is not None:
            await self._ticking
        await self.sim.stop()
        if took is None:
            return "SIGTERM: still running after 20 s (SIGKILL)"
        return "SIGTERM: killed before" if took < 0 else f"SIGTERM to exit {took:.1f} s"


async def metrics(p: Process) -> Metrics:
    async with aiohttp.ClientSession() as http:
        return await read_metrics(http, p.url)


Metrics = dict[str, list[tuple[dict[str, str], float]]]


async def wait_for(p: Process, check: Callable[[Metrics], bool], timeout: float) -> float | None:
    async def ok() -> bool:
        return check(await metrics(p))

    return await within(ok, timeout, 0.1)


def _took(seconds: float | None, timeout: float) -> str:
    return f"{seconds:.1f} s" if seconds is not None else f"not within {timeout:g} s"


def _named(m: Metrics) -> bool:
    return any(labels.get("k8s_pod_name") == TRAINER["metadata"]["name"]
               for labels, _ in m.get(INFO, []))  # fmt: skip


# --- the API server ---------------------------------------------------------------------


def api_server() -> hostile.HostileApiServer:
    server = hostile.HostileApiServer().start()
    put_owner(server, owner_object("ReplicaSet", "trainer-7d9f", "rs-41", "ml",
                                   ("Deployment", "trainer", "d-41")))  # fmt: skip
    server.put("pods", TRAINER)
    return server


Check = Callable[[Metrics], bool]


def _deployment_named(m: Metrics) -> bool:
    return any(labels.get("k8s_deployment_name") == "trainer" for labels, _ in m.get(INFO, []))


def _slices_up(m: Metrics) -> bool:
    return value(m, "kube_device_exporter_dra_slices_up") == 1.0


@dataclass
class ApiCase:
    name: str
    verb: str
    resource: str
    attack: Callable[[], hostile.Attack]
    dra: bool = False
    wait_after: float = 70.0
    """Past the back-off's longest step (60 s): the data is back within one."""
    back: Check = lambda m: _named(m) and value(m, UP) == 1.0
    """What /metrics shows once the exporter is whole again."""
    up: str = UP
    """The `_up` series that vouches for this peer's data."""


API_CASES = (
    *(ApiCase(f"API server: pod list, {what}", "list", "pods",
              lambda items=items: hostile.list_of(*items))  # type: ignore[misc]
      for what, items in hostile.BAD_POD_LISTS.items() if what in ("labels are a list",
                                                                  "an item is a string")),
    ApiCase("API server: pod watch line that is a JSON array", "watch", "pods",
            lambda: hostile.watch_lines(hostile.BAD_WATCH_LINES["a JSON array"])),
    ApiCase("API server: pod watch line not UTF-8", "watch", "pods",
            lambda: hostile.watch_lines(hostile.BAD_WATCH_LINES["not UTF-8"])),
    ApiCase("API server: a continue token on every page", "list", "pods", hostile.pages_forever),
    ApiCase("API server: one pod watch line that never ends", "watch", "pods",
            hostile.endless_line),
    ApiCase("API server: a pod list page dripped at 1 byte/s", "list", "pods",
            lambda: hostile.drip(json.dumps({"items": []}).encode() * 40, 1.0), ),
    ApiCase("API server: a ResourceSlice watch event whose object is an array", "watch",
            "resourceslices",
            lambda: hostile.watch_lines(hostile.BAD_WATCH_LINES["the object is an array"]),
            dra=True, back=_slices_up, up="kube_device_exporter_dra_slices_up"),
    ApiCase("API server: a DeviceTaintRule whose spec is a list", "list", "devicetaintrules",
            lambda: hostile.list_of({"metadata": {"name": "r"}, "spec": []}), dra=True,
            back=lambda m: False, up="kube_device_exporter_dra_slices_up"),
    ApiCase("API server: a ReplicaSet owner reference without a uid", "get", "replicasets",
            lambda: hostile.answer({"metadata": {"name": "trainer-7d9f", "ownerReferences": [
                {"kind": "Deployment", "name": "trainer", "controller": True}]}}),
            back=_deployment_named),
)  # fmt: skip


async def api_case(tree: Path, work: Path, case: ApiCase) -> Row:
    server = api_server()
    node = Node(work, tree, "api")
    kubeconfig = server.kubeconfig(work / "api-kubeconfig")
    args = ["--kubernetes.api", "--kubernetes.kubeconfig", str(kubeconfig),
            "--kubernetes.pods-api-socket", str(work / "no-pods-api.sock")]  # fmt: skip
    if case.dra:
        args.append("--kubernetes.dra")
    server.attack(case.verb, case.resource, case.attack())
    p = await node.start(args)
    try:
        await wait_for(p, bool, 20.0)
        async with Watched(p) as w:
            await asyncio.sleep(3.0)
            first = await metrics(p)
            await asyncio.sleep(ATTACK_SECONDS - 3.0)
            last = await metrics(p)
        up = value(last, case.up)
        cycles = (value(last, CYCLES) or 0) - (value(first, CYCLES) or 0)
        amd = value(last, "kube_device_exporter_source_success", source="amdgpu")
        before = len(server.requests)
        server.mend()
        mended = time.monotonic()

        def whole(m: Metrics) -> bool:
            asked = any(r[1] == case.resource for r in server.requests[before:])
            return asked and case.back(m) if case.resource != "devicetaintrules" else asked

        back = await wait_for(p, whole, case.wait_after)
        requests = [r for r in server.requests[before:] if r[1] == case.resource]
        waited = time.monotonic() - mended
    finally:
        sigterm = await node.stop()
        server.stop()
    return Row(
        case.name,
        f"during {ATTACK_SECONDS:g} s: {case.up.removeprefix('kube_device_exporter_')} {up}, "
        f"{cycles:.0f} cycles, amdgpu success {amd}, peak RSS {w.memory()}, {w.scrapes()}; "
        f"{sigterm}",
        f"{len(requests)} {case.resource} requests in {waited:.0f} s after the fix; asked "
        f"again and its data back in {_took(back, case.wait_after)}",
    )


# --- the kubelet's Pods API -------------------------------------------------------------


@dataclass
class PodsCase:
    name: str
    script: Callable[[], hostile.Script]


PODS_CASES = (
    PodsCase("Pods API: a pod whose label key is not UTF-8",
             lambda: hostile.bad_pod(hostile.pod_bytes_with_label(
                 pod("other", "ml", node=NODE_NAME, uid="u-other"), b"\xff\xfe", b"v"))),
    PodsCase("Pods API: endless ADDED events of new pods before INITIAL_SYNC_COMPLETE",
             lambda: hostile.endless_new_pods(synced_first=False)),
    PodsCase("Pods API: endless ADDED events of new pods after INITIAL_SYNC_COMPLETE",
             lambda: hostile.endless_new_pods(synced_first=True)),
    PodsCase("Pods API: every stream replays, syncs and hangs up", hostile.replay_and_hang_up),
)  # fmt: skip


async def pods_case(tree: Path, work: Path, case: PodsCase) -> Row:
    server = ApiServer().start()
    put_owner(server, owner_object("ReplicaSet", "trainer-7d9f", "rs-41", "ml",
                                   ("Deployment", "trainer", "d-41")))  # fmt: skip
    socket = work / "pods-api.sock"
    api = hostile.HostilePodsApi(socket)
    await api.start()
    api.pods[TRAINER["metadata"]["uid"]] = TRAINER
    node = Node(work, tree, "podsapi")
    args = ["--kubernetes.api", "--kubernetes.kubeconfig", str(server.kubeconfig(
        work / "pods-kubeconfig")), "--kubernetes.pods-api-socket", str(socket)]  # fmt: skip
    api.script = case.script()
    p = await node.start(args)
    try:
        await wait_for(p, bool, 20.0)
        async with Watched(p) as w:
            await asyncio.sleep(ATTACK_SECONDS)
            last = await metrics(p)
        watches = api.watches
        warned = sum(" WARNING " in ln and "Pods API" in ln for ln in p.log().splitlines())
        up, cached = value(last, UP), value(last, "kube_device_exporter_kubernetes_pods")
        api.script = None
        api.stop_streams()  # a stream still open (the flood) ends: the next one is mended
        before = api.watches
        back = await wait_for(p, lambda m: _named(m) and value(m, UP) == 1.0, 70.0)
        after = api.watches - before
    finally:
        sigterm = await node.stop()
        await api.stop()
        server.stop()
    return Row(
        case.name,
        f"during {ATTACK_SECONDS:g} s: {watches} WatchPods streams, {warned} warning lines, "
        f"kubernetes_up {up}, {cached} pods cached, peak RSS {w.memory()}, {w.scrapes()}; "
        f"{sigterm}",
        f"pod info and kubernetes_up 1 back {_took(back, 70.0)} after the fix ({after} streams)",
    )


# --- the kubelet's PodResources ---------------------------------------------------------


@dataclass
class KubeletCase:
    name: str
    method: str
    bad: Callable[[], bytes]
    from_start: bool


KUBELET_CASES = (
    KubeletCase("PodResources: List answers 5 kB of random bytes, from start", "List",
                lambda: os.urandom(5000), True),
    KubeletCase("PodResources: List names a pod that is not UTF-8, mid-run", "List",
                hostile.pod_name_not_utf8, False),
    KubeletCase("PodResources: GetAllocatableResources answers random bytes, mid-run",
                "GetAllocatableResources", lambda: os.urandom(5000), False),
    KubeletCase("PodResources: GetAllocatableResources answers random bytes, from start",
                "GetAllocatableResources", lambda: os.urandom(5000), True),
    KubeletCase("PodResources: List is one varint of 1 MB (0xFF), mid-run", "List",
                lambda: hostile.endless_varint(1 << 20), False),
)  # fmt: skip


def _kubelet_back(m: Metrics) -> bool:
    return value(m, "kube_device_exporter_podresources_up") == 1.0 and any(
        labels.get("k8s_pod_name") == "trainer-7d9f-x1"
        for labels, _ in m.get("hw_allocation_info", [])
    )


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def kubelet_case(tree: Path, work: Path, case: KubeletCase) -> Row:
    node = Node(work, tree, "kubelet")
    node.sim.advance()
    listed = tuple(t.pod for t in node.sim.kubelet.listed())
    good = {
        "List": hostile.v1_list(listed),
        "GetAllocatableResources": allocatable_to_v1(
            node.sim.kubelet.allocatable()
        ).SerializeToString(),
    }
    socket = work / "raw-kubelet.sock"
    kubelet = await hostile.RawKubelet(socket, dict(good)).start()
    if case.from_start:
        kubelet.answers[case.method] = case.bad
    # The default poll interval (30 s): a mid-run attack is read at the next poll, within
    # the window; the recovery is what the schedule makes of a failed poll.
    p = await node.start(["--kubelet-socket", str(socket)])
    try:
        ready = await wait_for(p, bool, 20.0)
        if not case.from_start:
            await wait_for(p, lambda m: value(m, "kube_device_exporter_podresources_up") == 1.0,
                           10.0)  # fmt: skip
            kubelet.answers[case.method] = case.bad
        first = await metrics(p)
        cpu, calls = _cpu_seconds(p.proc.pid), kubelet.calls[case.method]
        async with Watched(p) as w:
            await asyncio.sleep(KUBELET_SECONDS)
            last = await metrics(p)
        cpu = _cpu_seconds(p.proc.pid) - cpu
        during = kubelet.calls[case.method] - calls
        cycles = (value(last, CYCLES) or 0) - (value(first, CYCLES) or 0)
        amd = value(last, "kube_device_exporter_source_success", source="amdgpu")
        kubelet.answers[case.method] = good[case.method]
        calls = kubelet.calls[case.method]
        fixed_at = value(await metrics(p), CYCLES) or 0.0

        def whole(m: Metrics) -> bool:
            return (value(m, CYCLES) or 0.0) > fixed_at + 1 and _kubelet_back(m)

        back = await wait_for(p, whole, 40.0)
        asked = await within(lambda: kubelet.calls[case.method] > calls, 40.0 - (back or 40.0))
        if asked is not None:
            asked += back or 0.0
    finally:
        sigterm = await node.stop()
        await kubelet.stop()
    return Row(
        case.name,
        f"first /metrics {_took(ready, 20.0)}; during {KUBELET_SECONDS:g} s: {cycles:.0f} cycles, "
        f"amdgpu success {amd}, {during} {case.method} calls, {cpu:.1f} s of CPU, peak RSS "
        f"{w.memory()}, {w.scrapes()}; {sigterm}",
        f"cycles and allocations back {_took(back, 40.0)} after the fix, {case.method} asked "
        f"again {_took(asked, 40.0)} after it",
    )


# --- an OTLP/HTTP collector -------------------------------------------------------------


async def otlp_case(tree: Path, work: Path, answer: str) -> Row:
    receiver = HttpReceiver()
    receiver.behaviour = Behaviour(answer=answer, drip_seconds=1.0)
    node = Node(work, tree, f"otlp-{answer}")
    p = await node.start(["--otlp.endpoint", receiver.endpoint, "--otlp.protocol",
                          "http/protobuf"])  # fmt: skip
    try:
        await wait_for(p, bool, 20.0)
        async with Watched(p) as w:
            await asyncio.sleep(30.0)
            last = await metrics(p)
        failed = value(last, "kube_device_exporter_export_batches_total", result="failure")
        sent = len(receiver.received)
        receiver.behaviour = Behaviour()
        before = len(receiver.received)
        back = await within(lambda: len(receiver.received) > before, 30.0)
    finally:
        sigterm = await node.stop()
        receiver.stop()
    what = ("answering 200 with a body that never ends" if answer == "endless"
            else "dripping its answer at 1 byte/s")  # fmt: skip
    return Row(
        f"OTLP/HTTP collector {what}",
        f"during 30 s: {sent} exports sent, {failed} counted failed, peak RSS {w.memory()}, "
        f"{w.scrapes()}; {sigterm}",
        f"next export received {_took(back, 30.0)} after the fix",
    )


CHURN_CHILD = """
import asyncio, gc, itertools, json, sys
from pathlib import Path
from bench.churn import ChurningKubelet, Gpus
from exporter.settings.config import Config, OtlpConfig
from tests.support.cycle import make_poller

def rss():
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20

async def main(endpoint, cycles):
    now = itertools.count()
    sinks = []
    if endpoint:
        from exporter.sinks.otlp import OtlpSink
        config = Config(node_name="churn", collect_interval=1.0,
                        otlp=OtlpConfig(endpoint=endpoint, protocol="grpc"))
        sink = OtlpSink(config, clock=lambda: float(next(now)))  # a cycle is a second
        sink.start()
        sinks.append(sink)
    kubelet = ChurningKubelet()
    kubelet.resize(200, 100)  # 100 new pods a cycle
    poller = make_poller(node="churn", sources={"nvml": Gpus()}, client=kubelet, sinks=sinks,
                         interval=1.0)
    peak = 0.0
    for i in range(cycles):
        await poller.run_once()
        if sinks:
            sinks[0].force_flush()
        if i % 50 == 0:
            gc.collect()
            peak = max(peak, rss())
    gc.collect()
    print(json.dumps({"rss": rss(), "peak": max(peak, rss())}))
    if sinks:
        sinks[0].shutdown()

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""
"""One churning node in a process of its own (`python -c`, from the tree measured): the
bench's 8 GPUs time-sliced among 200 pods, 100 of them new every cycle, a cycle a second of
the sink's clock, with or without OTLP exporting every cycle to a receiver outside."""


async def otlp_churn(tree: Path, work: Path, cycles: int = 400) -> Row:
    """RSS of a node churning 100 pods a second, with OTLP and without."""
    receiver = GrpcReceiver()
    rss: dict[str, dict[str, float]] = {}
    try:
        for label, endpoint in (("without OTLP", ""), ("with OTLP", receiver.endpoint)):
            done = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-c", CHURN_CHILD, endpoint, str(cycles)],
                cwd=tree, env={**os.environ, "PYTHONPATH": f"{tree}:{Path.cwd()}"},
                capture_output=True, text=True, check=True, timeout=600,
            )  # fmt: skip
            rss[label] = json.loads(done.stdout.strip().splitlines()[-1])
            receiver.clear()
    finally:
        receiver.stop()
    said = ", ".join(f"{k}: {v['rss']:.0f} MiB (peak {v['peak']:.0f})" for k, v in rss.items())
    return Row(f"OTLP under churn: 100 new pods a second for {cycles} s", f"RSS {said}", "n/a")


CASES: dict[str, Case] = {
    **{c.name: functools.partial(api_case, case=c) for c in API_CASES},
    **{c.name: functools.partial(pods_case, case=c) for c in PODS_CASES},
    **{c.name: functools.partial(kubelet_case, case=c) for c in KUBELET_CASES},
    "OTLP/HTTP collector, endless body": functools.partial(otlp_case, answer="endless"),
    "OTLP/HTTP collector, dripped answer": functools.partial(otlp_case, answer="drip"),
    "OTLP under churn": otlp_churn,
}


async def run(tree: Path, only: str = "") -> list[Row]:
    return await run_cases(CASES, tree, only)


if __name__ == "__main__":
    sys.exit(cases_main("bench.peer_faults", CASES))
