"""The OTLP sink against real in-process OTLP receivers (gRPC MetricsService, OTLP/HTTP):
names, units, instrument types, temporality, attributes, resource, configuration."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.app import Exporter
from exporter.cli.flags import parse_config
from exporter.cli.parser import UsageError
from exporter.metrics import SPECS, Kind, prometheus_label, prometheus_name
from exporter.settings.config import Config, OtlpConfig
from exporter.sinks.otlp_transport import export_timeout, http_url
from simulator.kubelet import SimulatedKubelet
from simulator.scenario import load_scenario
from tests.otlp_receivers import GrpcReceiver, HttpReceiver, Point, Receiver, points_of
from tests.otlp_snapshots import GPU0, MIG102, FakeGpus, energy_snapshot, sink_for
from tests.support import Clock

PROTOCOLS = ["grpc", "http/protobuf"]
CUMULATIVE, DELTA = 2, 1


def make_receiver(protocol: str, **kwargs: Any) -> Receiver:
    return GrpcReceiver(**kwargs) if protocol == "grpc" else HttpReceiver(**kwargs)


@pytest.fixture(params=PROTOCOLS)
def receiver(request: pytest.FixtureRequest) -> Iterator[Receiver]:
    r = make_receiver(request.param)
    yield r
    r.stop()


def by_metric(pts: list[Point], metric: str) -> list[Point]:
    return [p for p in pts if p.metric == metric]


# --- a simulated node, end to end ----------------------------------------------------


@pytest.fixture
async def demo_kubelet() -> AsyncIterator[tuple[SimulatedKubelet, Clock]]:
    clock = Clock()
    # A short directory: unix socket paths are limited to ~107 bytes.
    with tempfile.TemporaryDirectory(prefix="kde-otlp-") as tmp:
        kubelet = SimulatedKubelet(load_scenario("demo"), Path(tmp) / "kubelet.sock", clock=clock)
        await kubelet.start()
        yield kubelet, clock
        await kubelet.stop()


def _kind(point: Point) -> Kind:
    if point.type == "gauge":
        return Kind.GAUGE
    return Kind.COUNTER if point.monotonic else Kind.UPDOWN


@pytest.mark.parametrize("protocol,web", [("grpc", False), ("http/protobuf", True)])
async def test_simulated_node_end_to_end(
    protocol: str, web: bool, demo_kubelet: tuple[SimulatedKubelet, Clock]
) -> None:
    kubelet, clock = demo_kubelet
    receiver = make_receiver(protocol)
    config = Config(
        kubelet_socket=kubelet.socket_path,
        listen_address=("127.0.0.1", 0) if web else None,
        collect_interval=3600.0,
        node_name="demo-node-1",
        otlp=OtlpConfig(endpoint=receiver.endpoint, protocol=protocol),
    )
    exporter = Exporter(config, sources={"fake": FakeGpus()})
    await exporter.start()
    try:
        await exporter.wait_ready()
        assert exporter.otlp is not None
        # OTLP alone needs no listening port; next to Prometheus both run.
        assert (exporter.port is not None) is web
        await asyncio.to_thread(exporter.otlp.force_flush)
        pts = points_of(receiver.accepted())

        for p in pts:
            spec = SPECS[p.metric]
            assert (p.unit, p.description, _kind(p)) == (spec.unit, spec.help, spec.kind)
            if p.type == "sum":
                assert p.temporality == CUMULATIVE
            assert "k8s.node.name" not in p.attributes  # it is the resource's
            assert p.scope == "kube-device-exporter"
        resource = pts[0].resource
        assert resource["k8s.node.name"] == "demo-node-1"
        assert resource["host.name"] == "demo-node-1"
        assert resource["service.name"] == "kube-device-exporter"
        assert resource["service.version"] == "0.1.0"
        assert resource["service.instance.id"] == "demo-node-1"

        [util] = by_metric(pts, "hw.gpu.utilization")
        assert util.type == "gauge" and util.value == 0.75
        assert util.attributes == {
            "hw.id": GPU0,
            "hw.type": "gpu",
            "hw.vendor": "nvidia",
            "hw.model": "NVIDIA A100-SXM4-80GB",
            "hw.gpu.task": "general",
            "k8s.namespace.name": "ml-team",
            "k8s.pod.name": "trainer-0",
            "k8s.container.name": "pytorch",
        }
        [energy] = by_metric(pts, "hw.energy")
        assert (energy.type, energy.monotonic, energy.value) == ("sum", True, 1010.0)
        memory = {p.attributes["hw.id"]: p for p in by_metric(pts, "hw.gpu.memory.usage")}
        assert (memory[GPU0].monotonic, memory[GPU0].value) == (False, 40e9)
        assert memory[MIG102].attributes["k8s.pod.name"] == "short-job"
        assert "hw.gpu.mig.profile" not in memory[MIG102].attributes  # identity: on hw.info
        info = {p.attributes["hw.id"]: p for p in by_metric(pts, "hw.info")}
        assert info[MIG102].attributes["hw.gpu.mig.profile"] == "1g.10gb"
        holders = {p.attributes["k8s.pod.name"] for p in by_metric(pts, "hw.allocation.info")}
        assert {"trainer-0", "short-job", "notebook-alice", "batch-a"} <= holders
        [cycles] = by_metric(pts, "kube_device_exporter.cycles")
        assert cycles.value == 1.0

        # The short job ends at t=40: gone from the very next export.
        clock.now = 50.0
        await exporter.poller.run_once()
        receiver.clear()
        await asyncio.to_thread(exporter.otlp.force_flush)
        pts = points_of(receiver.accepted())
        assert not [p for p in pts if p.attributes.get("k8s.pod.name") == "short-job"]
        memory = {p.attributes["hw.id"]: p for p in by_metric(pts, "hw.gpu.memory.usage")}
        assert "k8s.pod.name" not in memory[MIG102].attributes
        assert by_metric(pts, "hw.energy")[0].value == 1020.0
        assert by_metric(pts, "kube_device_exporter.cycles")[0].value == 2.0
        batches = {
            p.attributes["result"]: p.value
            for p in by_metric(pts, "kube_device_exporter.export.batches")
            if p.attributes["sink"] == "otlp"  # the device events' log records: "otlp-logs"
        }
        assert batches == {"success": 1.0, "failure": 0.0}  # the first flush, seen by cycle 2
    finally:
        await exporter.stop()
        receiver.stop()


def _scrape(text: str) -> set[tuple[str, frozenset[tuple[str, str]], float]]:
    return {
        (s.name, frozenset(s.labels.items()), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _as_prometheus(pts: list[Point]) -> set[tuple[str, frozenset[tuple[str, str]], float]]:
    """What a Collector's Prometheus exporter makes of the stream (resource_to_telemetry
    _conversion for k8s.node.name)."""
    out = set()
    for p in pts:
        labels = {prometheus_label(k): str(v) for k, v in p.attributes.items()}
        labels["k8s_node_name"] = p.resource["k8s.node.name"]
        out.add((prometheus_name(p.metric, p.unit, _kind(p)), frozenset(labels.items()), p.value))
    return out


async def test_otlp_translated_to_prometheus_equals_the_scrape(
    demo_kubelet: tuple[SimulatedKubelet, Clock],
) -> None:
    kubelet, _ = demo_kubelet
    receiver = GrpcReceiver()
    config = Config(
        kubelet_socket=kubelet.socket_path,
        listen_address=("127.0.0.1", 0),
        collect_interval=3600.0,
        node_name="demo-node-1",
        otlp=OtlpConfig(endpoint=receiver.endpoint),
    )
    exporter = Exporter(config, sources={"fake": FakeGpus()})
    await exporter.start()
    try:
        await exporter.wait_ready()
        assert exporter.otlp is not None and exporter.prometheus.rendered is not None
        await asyncio.to_thread(exporter.otlp.force_flush)
        scraped = _scrape(exporter.prometheus.rendered.text.decode())
        # process_* come from prometheus_client's process collector, on /metrics only
        # (an OTLP pipeline has the Collector's own hostmetrics/process receivers).
        assert {s for s in scraped if s[0].startswith("process_")}
        scraped = {s for s in scraped if not s[0].startswith("process_")}
        pushed = _as_prometheus(points_of(receiver.accepted()))
        assert len(pushed) > 30
        assert pushed == scraped
    finally:
        await exporter.stop()
        receiver.stop()


# --- temporality ---------------------------------------------------------------------


@pytest.mark.parametrize("preference", ["CUMULATIVE", "DELTA"])
def test_temporality(preference: str, receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", preference)
    sink = sink_for(receiver.endpoint, receiver.protocol)
    sink.start()
    try:
        for cycle, (joules, bytes_) in enumerate([(100.0, 5.0), (150.0, 7.0), (175.0, 6.0)]):
            sink.update(energy_snapshot(joules, bytes_, cycle))
            sink.force_flush()
    finally:
        sink.shutdown()
    pts = points_of(receiver.accepted())
    energy = by_metric(pts, "hw.energy")
    memory = by_metric(pts, "hw.gpu.memory.usage")
    power = by_metric(pts, "hw.power")
    # The shutdown adds one last export of the same snapshot.
    assert len(energy) == len(memory) == len(power) == 4
    assert {p.type for p in power} == {"gauge"} and power[0].value == 300.0
    # Up-down counters stay cumulative under DELTA (the spec's preference table).
    assert [p.value for p in memory] == [5.0, 7.0, 6.0, 6.0]
    assert {(p.temporality, p.monotonic) for p in memory} == {(CUMULATIVE, False)}
    if preference == "CUMULATIVE":
        assert [p.value for p in energy] == [100.0, 150.0, 175.0, 175.0]
        assert {p.temporality for p in energy} == {CUMULATIVE}
        assert len({p.start_ns for p in energy}) == 1
    else:
        assert [p.value for p in energy] == [100.0, 50.0, 25.0, 0.0]
        assert {p.temporality for p in energy} == {DELTA}
        # Each delta starts where the previous ended.
        for before, after in itertools.pairwise(energy):
            assert after.start_ns == before.time_ns
    assert {p.monotonic for p in energy} == {True}


def test_departed_series_are_forgotten_after_a_grace_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A series missing for one cycle keeps its delta state; one gone longer is released."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "DELTA")
    receiver = GrpcReceiver()
    sink = sink_for(receiver.endpoint, forget_after=10.0)
    clock = [0.0]
    sink._clock = lambda: clock[0]
    sink.start()
    try:

        def export(at: float, pod: str | None, energy: float) -> list[Point]:
            clock[0] = at
            sink.update(energy_snapshot(energy, 1.0, int(at), pod=pod or "other"))
            receiver.clear()
            sink.force_flush()
            return [
                p
                for p in by_metric(points_of(receiver.accepted()), "hw.energy")
                if p.attributes["k8s.pod.name"] == "trainer-0"
            ]

        assert [p.value for p in export(0, "trainer-0", 100.0)] == [100.0]
        assert export(5, None, 120.0) == []  # absent: nothing exported, state kept
        assert [p.value for p in export(6, "trainer-0", 130.0)] == [30.0]
        assert export(7, None, 140.0) == []
        assert export(30, None, 150.0) == []  # unseen 23 s > 10 s: released
        assert [p.value for p in export(31, "trainer-0", 160.0)] == [160.0]  # starts over
    finally:
        sink.shutdown()
        receiver.stop()


# --- configuration from the standard OTEL_* variables --------------------------------


def test_headers_compression_resource_and_service_name_from_env(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20s3cret,x-tenant=gpu")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    monkeypatch.setenv(
        "OTEL_RESOURCE_ATTRIBUTES", "k8s.cluster.name=c1,deployment.environment=prod"
    )
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gpu-exporter")
    receiver.behaviour.required_headers = {"authorization": "Bearer s3cret", "x-tenant": "gpu"}
    sink = sink_for(receiver.endpoint, receiver.protocol)
    sink.start()
    try:
        sink.update(energy_snapshot(1.0, 1.0, 1))
        sink.force_flush()
    finally:
        sink.shutdown()
    [first, *_] = receiver.received
    assert first.answer == "ok"
    if receiver.protocol == "http/protobuf":
        assert first.headers["content-encoding"] == "gzip"
    resource = points_of([first.request])[0].resource
    assert resource["service.name"] == "gpu-exporter"
    assert resource["k8s.cluster.name"] == "c1"
    assert resource["deployment.environment"] == "prod"
    assert resource["k8s.node.name"] == "node-a"


def test_compression_none_is_accepted(receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "none")
    sink = sink_for(receiver.endpoint, receiver.protocol)
    sink.start()
    try:
        sink.update(energy_snapshot(1.0, 1.0, 1))
        sink.force_flush()
        assert sink.stats.read() == (1, 0, 0)
        assert "content-encoding" not in receiver.received[0].headers
    finally:
        sink.shutdown()


def test_missing_credentials_count_as_failures(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver.behaviour.required_headers = {"authorization": "Bearer s3cret"}
    sink = sink_for(receiver.endpoint, receiver.protocol)
    sink.start()
    try:
        sink.update(energy_snapshot(1.0, 1.0, 1))
        sink.force_flush()
        assert sink.stats.read() == (0, 1, 0)
        assert receiver.received[0].answer == "unauthenticated"
    finally:
        sink.shutdown()


@pytest.fixture(scope="module")
def tls_files() -> Iterator[tuple[Path, bytes, bytes]]:
    """A self-signed certificate for 127.0.0.1, made with the openssl command."""
    with tempfile.TemporaryDirectory() as tmp:
        key, cert = Path(tmp) / "key.pem", Path(tmp) / "cert.pem"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1",
             "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
            check=True,
            capture_output=True,
        )  # fmt: skip
        yield cert, key.read_bytes(), cert.read_bytes()


@pytest.mark.peer
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_tls_with_certificate_from_env(
    protocol: str, tls_files: tuple[Path, bytes, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    import ssl

    cert_path, key, cert = tls_files
    if protocol == "grpc":
        receiver: Receiver = GrpcReceiver(tls=(key, cert))
    else:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert_path, cert_path.with_name("key.pem"))
        receiver = HttpReceiver(tls=context)
    assert receiver.endpoint.startswith("https://")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(cert_path))
    # A CA bundle in the environment (common in images) must not override it.
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", ssl.get_default_verify_paths().openssl_cafile)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "3000")
    sink = sink_for(receiver.endpoint, protocol)
    sink.start()
    try:
        sink.update(energy_snapshot(1.0, 1.0, 1))
        sink.force_flush()
        assert sink.stats.read()[:2] == (1, 0)
        assert by_metric(points_of(receiver.accepted()), "hw.energy")
    finally:
        sink.shutdown()
        receiver.stop()


def test_export_interval_defaults_to_the_collect_interval(receiver: Receiver) -> None:
    config = Config(
        node_name="n",
        collect_interval=0.1,
        otlp=OtlpConfig(receiver.endpoint, receiver.protocol),
    )
    from exporter.sinks.otlp import OtlpSink

    sink = OtlpSink(config)
    sink.update(energy_snapshot(1.0, 1.0, 1))
    sink.start()
    try:
        assert len(receiver.wait_for(3, timeout=10)) >= 3  # nobody flushes: the reader does
    finally:
        sink.shutdown()


def test_export_interval_from_env(receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "100")
    sink = sink_for(receiver.endpoint, receiver.protocol)
    sink.update(energy_snapshot(1.0, 1.0, 1))
    sink.start()
    try:
        assert len(receiver.wait_for(3, timeout=10)) >= 3  # collect interval is an hour
    finally:
        sink.shutdown()


def test_signal_specific_http_endpoint_is_used_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    receiver = HttpReceiver(path="/otlp/custom/metrics")
    env = {
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": f"{receiver.endpoint}/otlp/custom/metrics",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://wrong.invalid:1",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "NODE_NAME": "node-a",
    }
    config = parse_config(["--collect-interval", "1h"], env=env, sources={})
    assert config.otlp.signal_endpoint
    from exporter.sinks.otlp import OtlpSink

    sink = OtlpSink(config)
    sink.start()
    try:
        sink.update(energy_snapshot(1.0, 1.0, 1))
        sink.force_flush()
        assert receiver.accepted()
    finally:
        sink.shutdown()
        receiver.stop()


def test_endpoint_and_protocol_parsing() -> None:
    base = parse_config(
        [], env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/", "OTEL_EXPORTER_OTLP_PROTOCOL":
                 "http/protobuf"}, sources={}
    )  # fmt: skip
    assert (base.otlp.signal_endpoint, http_url(base.otlp)) == (False, "http://c:4318/v1/metrics")
    flag = parse_config(
        ["--otlp.endpoint", "https://c/otlp", "--otlp.protocol", "http/protobuf"],
        env={"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://ignored:1/x"},
        sources={},
    )
    assert http_url(flag.otlp) == "https://c/otlp/v1/metrics"
    grpc = parse_config([], env={"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "c:4317"}, sources={})
    assert (grpc.otlp.protocol, grpc.otlp.endpoint) == ("grpc", "c:4317")
    with pytest.raises(UsageError, match="http:// or https://"):
        parse_config(["--otlp.endpoint", "c:4318", "--otlp.protocol", "http/protobuf"], env={})


def test_timeout_variables_are_milliseconds() -> None:
    assert export_timeout({}) == 10.0
    assert export_timeout({"OTEL_EXPORTER_OTLP_TIMEOUT": "10000"}) == 10.0
    assert export_timeout({"OTEL_EXPORTER_OTLP_TIMEOUT": "500"}) == 0.5
    both = {"OTEL_EXPORTER_OTLP_TIMEOUT": "500", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "2500"}
    assert export_timeout(both) == 2.5
    assert export_timeout({"OTEL_EXPORTER_OTLP_TIMEOUT": "soon"}) == 10.0
    assert export_timeout({"OTEL_EXPORTER_OTLP_TIMEOUT": "-1"}) == 10.0


@pytest.mark.peer
def test_otlp_only_process_from_the_command_line() -> None:
    """The real process with `--web.listen-address none`: pushes, listens nowhere, stops on
    SIGTERM."""
    import os
    import signal
    import sys

    receiver = GrpcReceiver()
    with tempfile.TemporaryDirectory(prefix="kde-otlp-") as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "KDE_"))}
        proc = subprocess.Popen(
            [sys.executable, "-m", "exporter", "--web.listen-address", "none",
             "--otlp.endpoint", receiver.endpoint, "--collect-interval", "1s",
             "--kubelet-socket", f"{tmp}/absent.sock", "--node-name", "node-cli"],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            arrived = receiver.wait_for(2, timeout=30.0)
            assert len(arrived) >= 2
        finally:
            proc.send_signal(signal.SIGTERM)
            _, stderr = proc.communicate(timeout=15)
            receiver.stop()
    assert proc.returncode == 0, stderr
    assert "serving on" not in stderr
    pts = points_of([r.request for r in arrived])
    assert pts[0].resource["k8s.node.name"] == "node-cli"
    assert by_metric(pts, "kube_device_exporter.cycles")
