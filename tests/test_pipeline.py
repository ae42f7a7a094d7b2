"""The cycle pipeline (exporter/cycle/pipeline.py): every step isolated the same way.

For each step of the exporter's own pipeline: a good cycle, then cycles in which that step
raises. /metrics, scraped over HTTP as Prometheus does, keeps answering with the last good
devices and pods, and counts the step's failures in
`kube_device_exporter_cycle_step_failures_total{step=...}`; the failure is logged once.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.app import Exporter
from exporter.cli.flags import parse_config
from exporter.cycle.pipeline import Cycle, Pipeline, Stage, Step
from exporter.model import Device, DeviceReading, Sample, Snapshot, SourceResult
from simulator.kubelet import SimulatedKubelet
from simulator.scenario import parse_scenario
from tests.support import StaticSource
from tests.support.cycle import make_poller

GPU = "GPU-6a3f1c2e-1b7d-4c1e-9a55-000000000000"
SCENARIO = f"""
node: n1
allocatable: [{{resource: nvidia.com/gpu, ids: [{GPU}]}}]
pods:
  - {{name: trainer, namespace: ml, containers: [{{name: main, devices: [{{resource: nvidia.com/gpu, ids: [{GPU}]}}]}}]}}
"""

STEPS = [
    "collect",
    "join",
    "dra",
    "snapshot",
    "attribution",
    "placement",
    "energy",
    "unseen-warnings",
    "exporter-series",
    "series-budget",
    "prometheus",
    "landing",
    "heap-trim",
    "metrics-bodies",
]
"""The exporter's steps without OTLP, device events or the Kubernetes API, in order."""


def gpu_result(util: float = 0.5) -> SourceResult:
    device = Device(GPU, "gpu", "nvidia", "NVIDIA H100 80GB HBM3", "fake")
    reading = DeviceReading(device, (Sample("hw.gpu.utilization", util),))
    return SourceResult("fake", (reading,))


class Bug(Exception):
    pass


def _raise(*_: object) -> None:
    raise Bug("a bug in the step")


async def _raise_async(*_: object) -> None:
    raise Bug("a bug in the step")


@pytest.fixture
async def exporter(tmp_path: Path) -> AsyncIterator[Exporter]:
    sock = tmp_path / "k.sock"
    kubelet = SimulatedKubelet(parse_scenario(SCENARIO), sock, clock=lambda: 0.0)
    await kubelet.start()
    config = parse_config(
        ["--kubelet-socket", str(sock), "--web.listen-address", "127.0.0.1:0",
         "--node-name", "n1", "--path.sysfs", str(tmp_path), "--path.procfs", str(tmp_path),
         "--collect-interval", "1h"],
        env={}, sources={},
    )  # fmt: skip
    exporter = Exporter(config, sources={"fake": StaticSource(gpu_result())})
    await exporter.start()  # its first cycle, then an hour's wait: the test runs the others
    try:
        await exporter.wait_ready()
        yield exporter
    finally:
        await exporter.stop()
        await kubelet.stop()


async def _scrape(exporter: Exporter) -> dict[str, list[tuple[dict[str, str], float]]]:
    async with aiohttp.ClientSession() as http, http.get(f"{exporter.url}metrics") as r:
        assert r.status == 200
        text = await r.text()
    return {
        f.name: [(s.labels, s.value) for s in f.samples]
        for f in text_string_to_metric_families(text)
    }


def _failures(families: dict[str, list[tuple[dict[str, str], float]]]) -> dict[str, float]:
    series = families.get("kube_device_exporter_cycle_step_failures", [])
    return {labels["step"]: value for labels, value in series}


def test_the_exporter_runs_these_steps_in_this_order(exporter: Exporter) -> None:
    pipeline = exporter.poller.pipeline
    assert [pipeline.collect.name, *(s.name for s in pipeline.steps)] == STEPS


@pytest.mark.parametrize("name", STEPS)
async def test_a_raising_step_leaves_metrics_serving_the_last_good_snapshot_and_its_count(
    exporter: Exporter, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    pipeline = exporter.poller.pipeline
    good = await _scrape(exporter)
    assert good["hw_gpu_utilization_ratio"][0][1] == 0.5
    assert _failures(good) == {}

    original = pipeline.steps
    if name == "collect":
        pipeline.collect.run = _raise_async  # type: ignore[assignment]
    else:
        pipeline.steps = tuple(
            Step(s.name, s.stage, _raise) if s.name == name else s for s in pipeline.steps
        )
    with caplog.at_level(logging.ERROR, logger="exporter.poller"):
        for _ in range(3):
            snapshot = await exporter.poller.run_once()
    families = await _scrape(exporter)

    assert snapshot.devices and snapshot.devices[0].reading.device.id == GPU
    ((labels, value),) = families["hw_gpu_utilization_ratio"]
    assert value == 0.5 and labels["k8s_pod_name"] == "trainer"
    said = [r for r in caplog.records if f"cycle step {name} failed" in r.getMessage()]
    assert len(said) == 1 and said[0].exc_info is not None  # once, with the traceback
    if name == "prometheus":  # the body is that step's: the last good one stays meanwhile
        assert _failures(families) == {}
    else:  # a step after the exporter's series is counted from the next cycle on
        assert _failures(families)[name] >= 2

    pipeline.steps = original
    if name == "collect":
        del pipeline.collect.run  # the class's own again
    with caplog.at_level(logging.INFO, logger="exporter.poller"):
        await exporter.poller.run_once()
        await exporter.poller.run_once()
    assert _failures(await _scrape(exporter)) == {name: 3.0}
    assert f"cycle step {name} works again" in caplog.text


class Recorder:
    def __init__(self) -> None:
        self.got: list[Snapshot] = []

    def update(self, snapshot: Snapshot) -> None:
        self.got.append(snapshot)


async def test_a_first_cycle_whose_join_fails_still_publishes_the_exporter_series() -> None:
    sink = Recorder()
    poller = make_poller(
        node="n1", sources={"fake": StaticSource(gpu_result())}, client=None, sinks=[sink]
    )
    pipeline = poller.pipeline
    pipeline.steps = tuple(
        Step(s.name, s.stage, _raise) if s.name == "join" else s for s in pipeline.steps
    )
    snapshot = await poller.run_once()
    await poller.close()
    assert snapshot.devices == () and snapshot.node == "n1"
    (published,) = sink.got
    assert published.devices == ()
    assert Sample("kube_device_exporter.cycle.step.failures", 1.0, (("step", "join"),)) in (
        published.self_samples
    )


async def test_a_derived_step_that_fails_loses_only_its_own_part() -> None:
    parts: list[str] = []

    def fine(snapshot: Snapshot, cpu_nodes: object) -> Snapshot:
        parts.append("fine")
        return snapshot

    def broken(snapshot: Snapshot, cpu_nodes: object) -> Snapshot:
        raise Bug("a bug")

    poller = make_poller(
        node="n1",
        sources={"fake": StaticSource(gpu_result(0.25))},
        client=None,
        parts=[broken, fine],
    )
    first = await poller.run_once()
    second = await poller.run_once()
    await poller.close()
    assert parts == ["fine", "fine"]
    assert second.devices[0].reading.samples[0].value == 0.25  # the cycle's own readings
    assert first.cycles_total == 1 and second.cycles_total == 2


def test_steps_out_of_stage_order_are_refused() -> None:
    def noop(cycle: Cycle) -> None:
        return None

    poller = make_poller(node="n1", sources={}, client=None)
    collect = poller.pipeline.collect
    with pytest.raises(ValueError, match="stage order"):
        Pipeline(collect, [Step("a", Stage.PUBLISH, noop), Step("b", Stage.BUILD, noop)], node="n")
    with pytest.raises(ValueError, match="repeat"):
        Pipeline(collect, [Step("a", Stage.BUILD, noop), Step("a", Stage.BUILD, noop)], node="n")
