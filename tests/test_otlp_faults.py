"""A collector that is down, slow or rejecting never blocks a cycle, never grows memory
without bound, and shows in the export self-metrics."""

from __future__ import annotations

import asyncio
import gc
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from exporter.app import Exporter
from exporter.settings.config import Config, OtlpConfig
from exporter.sinks.otlp import OtlpSink
from simulator.ports import free_port
from tests.otlp_receivers import Behaviour, GrpcReceiver, HttpReceiver, Receiver, points_of
from tests.otlp_snapshots import FakeGpus, energy_snapshot, sink_for

PROTOCOLS = ["grpc", "http/protobuf"]
TIMEOUT_MS = "300"
"""Export timeout for these tests (OTEL_EXPORTER_OTLP_TIMEOUT, milliseconds)."""


def make_receiver(protocol: str, **kwargs: Any) -> Receiver:
    return GrpcReceiver(**kwargs) if protocol == "grpc" else HttpReceiver(**kwargs)


def sdk_attribute_sets(sink: OtlpSink) -> int:
    """How many attribute sets the SDK holds state for, over all our instruments."""
    assert sink._provider is not None
    storage = sink._provider._measurement_consumer._reader_storages[sink._reader]  # type: ignore[index]
    return sum(
        len(stream._attributes_aggregation)
        for streams in storage._instrument_view_instrument_matches.values()
        for stream in streams
    )


@pytest.fixture(autouse=True)
def short_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", TIMEOUT_MS)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_receiver_down_at_start_then_back(protocol: str) -> None:
    port = free_port()
    sink = sink_for(f"http://127.0.0.1:{port}", protocol)
    sink.start()
    receiver: Receiver | None = None
    try:
        sink.update(energy_snapshot(100.0, 1.0, 1))
        started = time.monotonic()
        sink.force_flush()
        assert time.monotonic() - started < 2.0  # bounded by the 300 ms export timeout
        assert sink.stats.read() == (0, 1, 0)
        failure = {s.attributes: s.value for s in sink.self_samples()}
        assert failure[(("sink", "otlp"), ("result", "failure"))] == 1.0

        receiver = make_receiver(protocol, port=port)
        sink.update(energy_snapshot(150.0, 1.0, 2))
        sink.force_flush()
        assert sink.stats.read() == (1, 1, 0)
        [energy] = [p for p in points_of(receiver.accepted()) if p.metric == "hw.energy"]
        assert energy.value == 150.0  # the latest snapshot; nothing queued from the outage
    finally:
        started = time.monotonic()
        sink.shutdown()
        assert time.monotonic() - started < 3.0
        if receiver is not None:
            receiver.stop()


CYCLES, WARMUP = 200, 50


@pytest.mark.slow
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("answer", ["down", "unavailable", "partial"])
def test_memory_stays_bounded_over_many_cycles(protocol: str, answer: str) -> None:
    """A new pod every cycle against a failing receiver: memory and SDK state stay flat.
    (Without forgetting departed series this grows ~13 KiB per cycle: ~2.6 MiB here.)"""
    receiver = make_receiver(protocol)
    receiver.behaviour = Behaviour(answer=answer, rejected=2)
    if answer == "down":
        receiver.stop()
    sink = sink_for(receiver.endpoint, protocol, forget_after=0.0)
    sink.start()
    tracemalloc.start()
    try:
        for cycle in range(CYCLES):
            sink.update(energy_snapshot(float(cycle), 1.0, cycle, pod=f"job-{cycle}"))
            sink.force_flush()
            receiver.clear()  # the in-process receiver's own records are not ours
            if cycle == WARMUP:
                gc.collect()
                baseline = tracemalloc.get_traced_memory()[0]
                attribute_sets = sdk_attribute_sets(sink)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - baseline
        assert sdk_attribute_sets(sink) == attribute_sets
        success, failure, rejected = sink.stats.read()  # before shutdown's last export
    finally:
        tracemalloc.stop()
        sink.shutdown()
        if answer != "down":
            receiver.stop()
    assert grown < 256 * 1024, f"grew {grown / 1024:.0f} KiB over {CYCLES - WARMUP} cycles"
    if answer == "partial":
        assert (success, failure, rejected) == (CYCLES, 0, 2 * CYCLES)
    else:
        assert (success, failure, rejected) == (0, CYCLES, 0)


@pytest.mark.slow
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_hanging_receiver_is_cut_off_by_the_export_timeout(protocol: str) -> None:
    receiver = make_receiver(protocol)
    receiver.behaviour = Behaviour(answer="hang", hang_seconds=10.0)
    sink = sink_for(receiver.endpoint, protocol)
    sink.start()
    try:
        sink.update(energy_snapshot(1.0, 1.0, 1))
        started = time.monotonic()
        sink.force_flush()
        assert time.monotonic() - started < 2.0  # not the receiver's 10 s
        assert sink.stats.read() == (0, 1, 0)
    finally:
        sink.shutdown()
        receiver.stop()


@pytest.mark.slow
@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_slow_collector_never_delays_a_cycle(protocol: str) -> None:
    receiver = make_receiver(protocol)
    receiver.behaviour = Behaviour(answer="hang", hang_seconds=10.0)
    interval = 0.05
    with tempfile.TemporaryDirectory(prefix="kde-otlp-") as tmp:
        config = Config(
            kubelet_socket=Path(tmp) / "absent.sock",  # no kubelet: cycles still run
            listen_address=None,
            collect_interval=interval,
            collect_timeout=interval,
            node_name="node-a",
            otlp=OtlpConfig(endpoint=receiver.endpoint, protocol=protocol),
        )
        exporter = Exporter(config, sources={"fake": FakeGpus()})
        await exporter.start()
        sink = exporter.otlp
        assert sink is not None
        try:
            await exporter.wait_ready()
            started = time.monotonic()
            # Three exports have started (each hangs until the 300 ms timeout cuts it off).
            hung = await asyncio.to_thread(receiver.wait_for, 3, 10.0)
            elapsed = time.monotonic() - started
            assert len(hung) >= 3
            snapshot = exporter.poller.snapshot
            assert snapshot is not None
            # Cycles went on at their own pace (at least half of the ideal count).
            assert snapshot.cycles_total >= elapsed / interval / 2
            # An export that held the cycle would hold it for the export timeout (the
            # receiver hangs for 10 s): a cycle well under it was not held. Not the 50 ms
            # interval itself: on a loaded 2-core CI machine one cycle took 56 ms.
            assert snapshot.cycle_duration_seconds < int(TIMEOUT_MS) / 1000 / 2
            assert sink.stats.read()[1] >= 2

            # While an export is hanging, update() is a reference swap.
            def longest_update() -> float:
                worst = 0.0
                for _ in range(1000):
                    t = time.perf_counter()
                    sink.update(snapshot)
                    worst = max(worst, time.perf_counter() - t)
                return worst

            assert await asyncio.to_thread(longest_update) < 0.005
        finally:
            started = time.monotonic()
            await exporter.stop()
            assert time.monotonic() - started < 3.0  # the final export is bounded too
            receiver.stop()


def test_a_failing_collection_does_not_stop_the_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception while pinning a snapshot must not end the reader's thread."""
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "50")
    receiver = GrpcReceiver()
    sink = sink_for(receiver.endpoint)
    calls = {"n": 0}
    pin = sink._begin_collection

    def flaky() -> None:
        calls["n"] += 1
        if calls["n"] <= 2:
            raise RuntimeError("a bug")
        pin()

    monkeypatch.setattr(sink, "_begin_collection", flaky)
    sink.update(energy_snapshot(7.0, 1.0, 1))
    sink.start()
    try:
        receiver.wait_for(1, timeout=10.0)  # nothing pinned yet: nothing to export before
        assert calls["n"] >= 3
        energy = [p for p in points_of(receiver.accepted()) if p.metric == "hw.energy"]
        assert energy and energy[0].value == 7.0
    finally:
        sink.shutdown()
        receiver.stop()


@pytest.mark.slow
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_shutdown_returns_within_the_export_timeout_while_an_export_hangs(
    protocol: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/otlp.md: shutdown is bounded by the export timeout, even with a periodic export
    in flight to a collector that never answers (the SDK would wait for both exports)."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1000")
    receiver = make_receiver(protocol)
    receiver.behaviour = Behaviour(answer="hang", hang_seconds=10.0)
    sink = sink_for(receiver.endpoint, protocol)
    sink.start()
    try:
        sink.update(energy_snapshot(1.0, 1.0, 1))
        in_flight = threading.Thread(target=sink.force_flush, daemon=True)
        in_flight.start()
        time.sleep(0.2)  # the periodic export is now waiting on the receiver
        started = time.monotonic()
        sink.shutdown()
        took = time.monotonic() - started
    finally:
        receiver.stop()
    assert sink.timeout == 1.0
    assert took < 1.3, f"shutdown took {took:.2f}s with a 1s export timeout"


@pytest.mark.slow
@pytest.mark.parametrize("answer", ["drip", "endless"])
def test_a_dripped_or_endless_answer_is_a_counted_failure_within_the_timeout(
    answer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A collector that answers 200 and drips its body a byte at a time, or never ends it
    (issue 41: an export held past its timeout, uncounted; 1.5 GiB in 18 s): the export
    timeout covers the whole exchange, the answer is read to 1 MiB at most, the export is
    counted failed and why in `peer_answers_refused`; the next export goes out as usual."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "800")
    receiver = HttpReceiver()
    receiver.behaviour = Behaviour(answer=answer, drip_seconds=0.05)
    sink = sink_for(receiver.endpoint, "http/protobuf")
    sink.start()
    try:
        sink.update(energy_snapshot(100.0, 1.0, 1))
        tracemalloc.start()
        started = time.monotonic()
        sink.force_flush()
        took = time.monotonic() - started
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert took < 2.0, took
        assert peak < 8 * 1024 * 1024, peak
        assert sink.stats.read()[:2] == (0, 1)
        refused = {dict(s.attributes).get("reason"): s.value for s in sink.self_samples()
                   if s.metric == "kube_device_exporter.peer.answers.refused"}  # fmt: skip
        assert refused == {"time" if answer == "drip" else "bytes": 1.0}
        receiver.behaviour = Behaviour()
        sink.update(energy_snapshot(150.0, 1.0, 2))
        sink.force_flush()
        assert sink.stats.read()[:2] == (1, 1)
    finally:
        sink.shutdown()
        receiver.stop()


def test_departed_series_are_forgotten_after_three_export_intervals() -> None:
    """Not 5 minutes (at 100 pods a second that kept 30,000 pods' series: 208 MiB against 66
    without OTLP): three export intervals, a cycle or two of a failing source still kept."""
    config = Config(collect_interval=10.0, otlp=OtlpConfig(endpoint="http://127.0.0.1:1"))
    assert OtlpSink(config).forget_after == 30.0
    assert OtlpSink(config, forget_after=5.0).forget_after == 5.0
