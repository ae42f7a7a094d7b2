"""Device events (exporter/derive/events.py): detected once per cycle, named after every holder,
published as OTLP log records (a real OTLP receiver) and, with --kubernetes.events, as
Kubernetes Events at the loopback API server, deduplicated per pod, device and code."""

from __future__ import annotations

import asyncio
import ctypes
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from exporter.app import Exporter, build_sources
from exporter.cli.flags import parse_config
from exporter.derive.devicecodes import Severity
from exporter.derive.events import DeviceEvent, EventDetector, EventHub
from exporter.kubeapi.client import http_client, load_config
from exporter.model import (
    Allocation,
    Device,
    DeviceReading,
    Holder,
    JoinedDevice,
    Sample,
    Snapshot,
    SourceResult,
)
from exporter.podresources.client import PodResourcesClient
from exporter.settings.config import Config, OtlpConfig
from exporter.sinks.k8sevents import EventGate, KubeEventPoster
from exporter.sinks.otlp_logs import OtlpLogSink
from simulator.apiserver import ApiServer
from simulator.kubelet import SimulatedKubelet
from simulator.node import SimulatedNode
from simulator.scenario import load_scenario, parse_scenario
from tests.nvml_support import NvidiaNode, fakenvml, nvidia_node  # noqa: F401 - fixtures
from tests.otlp_receivers import GrpcReceiver, HttpReceiver, Receiver
from tests.support import Clock, StaticSource
from tests.support.cycle import make_poller
from tests.support.waiting import until

GPU = "GPU-5e1f0a2b-7c3d-4e5f-8a9b-000000000000"
A = Holder("ml", "trainer-a", "pytorch")
B = Holder("research", "trainer-b", "jupyter")


# --- detection, on hand-made snapshots ---------------------------------------------------


def _snapshot(*samples: Sample, holders: tuple[Holder, ...] = (A, B), t: float = 0.0) -> Snapshot:
    device = Device(GPU, "gpu", "nvidia", "NVIDIA H100 80GB HBM3", "nvml")
    allocations = tuple(
        Allocation(h, "nvidia.com/gpu.shared", f"{GPU}::{i}", GPU, str(i), shared=True)
        for i, h in enumerate(holders)
    )
    return Snapshot(
        timestamp=t,
        node="node-1",
        devices=(JoinedDevice(DeviceReading(device, samples)),),
        allocations=allocations,
    )


def _xid(code: int, count: float) -> Sample:
    return Sample("hw.gpu.xid.errors", count, (("hw.gpu.xid", str(code)),))


def test_the_first_snapshot_is_only_the_baseline() -> None:
    detector = EventDetector()
    assert detector.detect(_snapshot(_xid(79, 3))) == []
    assert detector.detect(_snapshot(_xid(79, 3))) == []


def test_an_xid_on_a_shared_gpu_is_one_event_naming_both_holders() -> None:
    detector = EventDetector()
    detector.detect(_snapshot())
    (event,) = detector.detect(_snapshot(_xid(79, 1)))  # the series appears: its first XID
    assert (event.code, event.xid, event.count) == ("xid.79", 79, 1)
    assert event.holders == (A, B)
    assert event.info.klass == "hardware"
    assert event.info.severity is Severity.ERROR
    assert event.summary.startswith(f"XID 79 (GPU has fallen off the bus) on gpu {GPU}")
    (again,) = detector.detect(_snapshot(_xid(79, 4)))
    assert again.count == 3
    assert detector.detect(_snapshot(_xid(79, 4))) == []
    (after_reset,) = detector.detect(_snapshot(_xid(79, 1)))  # driver reloaded: from zero
    assert after_reset.count == 1


def test_states_that_turn_bad_are_events_once() -> None:
    detector = EventDetector()
    failed = ("hw.state", "failed")
    detector.detect(_snapshot(Sample("hw.status", 0.0, (failed,))))
    (event,) = detector.detect(_snapshot(Sample("hw.status", 1.0, (failed,))))
    assert event.code == "gpu_failed"
    assert detector.detect(_snapshot(Sample("hw.status", 1.0, (failed,)))) == []


def test_a_link_that_went_down_is_one_event_though_two_series_say_so() -> None:
    detector = EventDetector()
    downed = Sample("hw.errors", 2.0, (("error.type", "link_downed"),))
    detector.detect(_snapshot(Sample("hw.network.up", 1.0), downed))
    (event,) = detector.detect(
        _snapshot(Sample("hw.network.up", 0.0), Sample("hw.errors", 3.0, downed.attributes))
    )
    assert (event.code, event.count, event.info.klass) == ("link_down", 1, "network")


def test_corrected_ecc_errors_are_no_event_uncorrected_ones_are() -> None:
    detector = EventDetector()
    detector.detect(_snapshot())
    found = detector.detect(
        _snapshot(
            Sample("hw.errors", 50.0, (("error.type", "ecc_corrected"),)),
            Sample("hw.errors", 1.0, (("error.type", "ecc_uncorrected"),)),
        )
    )
    assert [e.code for e in found] == ["ecc_uncorrected"]


def test_the_gate_deduplicates_per_pod_device_and_code_and_rate_limits_per_pod() -> None:
    now = [0.0]
    gate = EventGate(clock=lambda: now[0])
    pod = ("ml", "trainer-a")
    assert gate.admit(pod, GPU, "xid.79") == "created"
    assert gate.admit(pod, GPU, "xid.79") == "deduplicated"
    assert gate.admit(("research", "trainer-b"), GPU, "xid.79") == "created"
    assert gate.admit(pod, GPU, "xid.48") == "created"
    now[0] = 599.0
    assert gate.admit(pod, GPU, "xid.79") == "deduplicated"
    now[0] = 601.0
    assert gate.admit(pod, GPU, "xid.79") == "created"
    # 25 a pod at once (client-go's spam filter), then one more every 5 minutes
    flood = [gate.admit(("ns", "noisy"), GPU, f"xid.{i}") for i in range(30)]
    assert flood.count("created") == 25
    assert flood[25:] == ["rate_limited"] * 5
    now[0] += 300.0
    assert gate.admit(("ns", "noisy"), GPU, "xid.100") == "created"
    assert gate.admit(("ns", "noisy"), GPU, "xid.101") == "rate_limited"


# --- end to end: the simulated driver's XID, a real receiver, the loopback API server -----

SCENARIO = f"""
node: events-node
kubelet: {{api: v1}}
allocatable:
  - resource: nvidia.com/gpu.shared
    ids: ["{GPU}::0", "{GPU}::1"]
pods:
  - name: trainer-a
    namespace: ml
    containers:
      - name: pytorch
        devices: [{{resource: nvidia.com/gpu.shared, ids: ["{GPU}::0"]}}]
  - name: trainer-b
    namespace: research
    containers:
      - name: jupyter
        devices: [{{resource: nvidia.com/gpu.shared, ids: ["{GPU}::1"]}}]
nvidia:
  gpus:
    - uuid: {GPU}
      pci_bus_id: "0000:18:00.0"
  xid:
    - {{at: 5, device: {GPU}, xid: 79}}
    - {{at: 8, device: {GPU}, xid: 79}}
"""


@pytest.fixture(params=["grpc", "http/protobuf"])
def receiver(request: pytest.FixtureRequest) -> Iterator[Receiver]:
    made: Receiver = GrpcReceiver() if request.param == "grpc" else HttpReceiver()
    yield made
    made.stop()


@pytest.fixture
def api() -> Iterator[ApiServer]:
    server = ApiServer().start()
    yield server
    server.stop()


@pytest.mark.slow
async def test_an_xid_on_a_shared_gpu_reaches_the_receiver_and_each_pod(
    nvidia_node: Callable[[str], NvidiaNode],  # noqa: F811
    fakenvml: ctypes.CDLL,  # noqa: F811
    receiver: Receiver,
    api: ApiServer,
    tmp_path: Path,
) -> None:
    node = nvidia_node(SCENARIO)
    source = node.source()
    config = Config(
        node_name="events-node",
        otlp=OtlpConfig(endpoint=receiver.endpoint, protocol=receiver.protocol),
    )
    logs = OtlpLogSink(config)
    logs.start()
    http = http_client(load_config(api.kubeconfig(tmp_path / "kubeconfig")), 10.0)
    poster = KubeEventPoster(http, "events-node", wall_clock=lambda: 1_700_000_000.0 + node.now)
    hub = EventHub([logs.publish, poster.publish])
    kubelet = SimulatedKubelet(node.scenario, tmp_path / "kubelet.sock", clock=lambda: node.now)
    await kubelet.start()
    client = PodResourcesClient(tmp_path / "kubelet.sock")
    poller = make_poller(node="events-node", sources={"nvml": source}, client=client, sinks=[hub])
    stop = asyncio.Event()
    posting = asyncio.create_task(poster.run(stop))
    try:
        for t, xids in ((1.0, 0), (6.0, 1), (9.0, 2)):
            node.at(t)
            await poller.run_once()  # its collect() takes the XIDs queued since the last
            assert sum(source.xids.snapshot().values()) == xids, t
        logs.force_flush()
        receiver.wait_for_log_records(2)
        await until(lambda: len(api.events) >= 2, 10, "two Events")
        await asyncio.sleep(0.3)  # an Event too many would have arrived by now
    finally:
        stop.set()
        await posting
        logs.shutdown()
        await client.close()
        await http.aclose()
        await kubelet.stop()

    records = receiver.log_records()
    assert len(records) == 2, "one record per occurrence, each naming both holders"
    resource, first = records[0]
    assert resource["k8s.node.name"] == "events-node"
    assert resource["service.name"] == "kube-device-exporter"
    attrs = {kv.key: kv.value for kv in first.attributes}
    names = [v.string_value for v in attrs["k8s.pod.name"].array_value.values]
    namespaces = [v.string_value for v in attrs["k8s.namespace.name"].array_value.values]
    assert list(zip(namespaces, names, strict=True)) == [
        ("ml", "trainer-a"),
        ("research", "trainer-b"),
    ]
    assert attrs["hw.id"].string_value == GPU
    assert attrs["hw.gpu.xid"].int_value == 79
    assert attrs["hw.event.class"].string_value == "hardware"
    assert first.severity_number == 17
    assert first.severity_text == "ERROR"
    assert first.event_name == "kube_device_exporter.device.event"
    assert "GPU has fallen off the bus" in first.body.string_value

    by_pod = {
        (e["involvedObject"]["namespace"], e["involvedObject"]["name"]): e for e in api.events
    }
    assert set(by_pod) == {("ml", "trainer-a"), ("research", "trainer-b")}
    event = by_pod[("ml", "trainer-a")]
    assert event["reason"] == "DeviceXID"
    assert event["type"] == "Warning"
    assert event["source"] == {"component": "kube-device-exporter", "host": "events-node"}
    assert GPU in event["message"] and "container pytorch" in event["message"]
    assert api.count("create", "events") == 2, "the second XID 79 is inside the dedup window"
    results = {dict(s.attributes)["result"]: s.value for s in poster.self_samples()}
    assert results == {"created": 2.0, "deduplicated": 2.0}
    (counted,) = hub.self_samples()
    assert (dict(counted.attributes), counted.value) == ({"hw.event.class": "hardware"}, 2.0)


async def test_events_the_api_server_refuses_are_counted_failed(
    api: ApiServer, tmp_path: Path
) -> None:
    api.forbidden.add("events")
    detector = EventDetector()
    detector.detect(_snapshot())
    events = detector.detect(_snapshot(_xid(48, 1)))
    http = http_client(load_config(api.kubeconfig(tmp_path / "kubeconfig")), 10.0)
    poster = KubeEventPoster(http, "node-1")
    stop = asyncio.Event()
    posting = asyncio.create_task(poster.run(stop))
    await asyncio.sleep(0)  # run() takes the loop before publish() hands anything over
    try:
        await asyncio.to_thread(poster.publish, events)
        await until(lambda: api.count("create", "events") == 2, 10, "two attempts")
        await until(lambda: len(poster.self_samples()) == 1, 10, "counted")
    finally:
        stop.set()
        await posting
        await http.aclose()
    assert {dict(s.attributes)["result"]: s.value for s in poster.self_samples()} == {"failed": 2.0}
    assert api.events == []


async def test_a_link_going_down_on_the_simulated_dgx_node_names_the_pod_holding_the_nic(
    tmp_path: Path,
) -> None:
    """The rdma source over the simulated sysfs tree (mlx5_4's link is down from 20 to 26 s),
    the simulated kubelet, the poller: one `link_down` event, naming trainer-bad."""
    scenario = load_scenario("dgx")
    clock = Clock()
    node = SimulatedNode(scenario, tmp_path / "node", clock=clock)
    config = parse_config([*node.exporter_args(), "--no-collector.nvml"], env={})
    sources = build_sources(config, clock=clock)
    found: list[DeviceEvent] = []
    kubelet = SimulatedKubelet(scenario, tmp_path / "kubelet.sock", clock=lambda: clock.now)
    await kubelet.start()
    client = PodResourcesClient(tmp_path / "kubelet.sock")
    hub = EventHub([found.extend])
    poller = make_poller(node=scenario.node, sources=sources, client=client, sinks=[hub])
    try:
        for t in (18.0, 19.0, 21.0, 24.0, 27.0):
            clock.now = t
            node.advance()
            await poller.run_once()
    finally:
        await client.close()
        await kubelet.stop()
        for source in sources.values():
            source.close()
        for part in node.parts:
            part.close()
    assert [(e.code, e.device.id, e.holders) for e in found] == [
        ("link_down", "mlx5_4/1", (Holder("ml-team", "trainer-bad", "pytorch"),))
    ]


ONE_POD = f"""
node: n1
allocatable: [{{resource: nvidia.com/gpu, ids: [{GPU}]}}]
pods:
  - name: trainer-a
    namespace: ml
    containers: [{{name: pytorch, devices: [{{resource: nvidia.com/gpu, ids: [{GPU}]}}]}}]
"""


CREATED = 'kube_device_exporter_kubernetes_events_total{k8s_node_name="n1",result="created"}'
DETECTED = 'kube_device_exporter_device_events_total{hw_event_class="hardware",k8s_node_name="n1"}'


def _gpu_with_xids(count: float) -> SourceResult:
    device = Device(GPU, "gpu", "nvidia", "NVIDIA H100 80GB HBM3", "fake")
    return SourceResult("fake", (DeviceReading(device, (_xid(79, count),)),))


async def test_the_exporter_wires_events_to_otlp_and_the_api_server(
    api: ApiServer, tmp_path: Path
) -> None:
    """The composition root: --otlp.endpoint and --kubernetes.events on, one XID later one
    record at the receiver, one Event, and the self-metrics on /metrics."""
    receiver = GrpcReceiver()
    sock = tmp_path / "kubelet.sock"
    kubelet = SimulatedKubelet(parse_scenario(ONE_POD), sock, clock=lambda: 0.0)
    await kubelet.start()
    config = parse_config(
        ["--kubelet-socket", str(sock), "--web.listen-address", "127.0.0.1:0",
         "--collect-interval", "200ms", "--collect-timeout", "200ms", "--node-name", "n1",
         "--otlp.endpoint", receiver.endpoint, "--kubernetes.events",
         "--kubernetes.kubeconfig", str(api.kubeconfig(tmp_path / "kubeconfig"))],
        env={}, sources={}, min_collect_interval=0.1,
    )  # fmt: skip
    source = StaticSource(_gpu_with_xids(0))
    exporter = Exporter(config, sources={"fake": source})
    await exporter.start()
    try:
        await exporter.wait_ready(10)
        await until(lambda: bool(exporter.poller.snapshot and exporter.poller.snapshot.allocations),
                    10, "the pod holds the GPU")  # fmt: skip
        source.result = _gpu_with_xids(1)
        await until(lambda: len(api.events) == 1, 10, "the Event")
        assert exporter.log_sink is not None
        await asyncio.to_thread(exporter.log_sink.force_flush)
        await asyncio.to_thread(receiver.wait_for_log_records, 1)
        text = ""

        def counted() -> bool:
            nonlocal text
            rendered = exporter.prometheus.rendered
            text = rendered.text.decode() if rendered else ""
            return f"{CREATED} 1.0" in text

        await until(counted, 10, "the self-metric")
    finally:
        await exporter.stop()
        await kubelet.stop()
        receiver.stop()
    (_, record), *more = receiver.log_records()
    assert more == []
    attrs = {kv.key: kv.value for kv in record.attributes}
    assert [v.string_value for v in attrs["k8s.pod.name"].array_value.values] == ["trainer-a"]
    assert api.events[0]["involvedObject"]["name"] == "trainer-a"
    assert f"{DETECTED} 1.0" in text
