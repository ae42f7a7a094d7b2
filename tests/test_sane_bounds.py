"""Sane bounds (issue 14, item 5) and hostile input to every parser of ours.

- `--collect-interval` below the kubelet's shared rate limit is a usage error (exit 2);
- empty or malformed device IDs from the kubelet are counted, skipped and logged once;
- property-based: device IDs, PCI addresses, scenario files, the command line and label
  escaping never fail in any other way than their documented error.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from exporter.cli.flags import MIN_COLLECT_INTERVAL, parse_config
from exporter.cli.parser import UsageError
from exporter.ids import normalize_device_id, pci_address
from exporter.model import Device, DeviceReading, Holder, JoinedDevice, Sample, Snapshot
from exporter.podresources.client import PodResourcesClient, device_id_problem
from exporter.sinks.prometheus import render
from simulator.kubelet import SimulatedKubelet
from simulator.scenario import ScenarioError, parse_scenario
from tests.support import StaticSource
from tests.support.cycle import make_poller
from tests.support.fake_gpu import gpu_result

GPU = "GPU-6a3f1c2e-1b7d-4c1e-9a55-000000000000"


# --- the collect interval ---------------------------------------------------------------------


@pytest.mark.parametrize("interval", ["1ms", "500ms", "999ms"])
def test_an_interval_below_the_minimum_is_refused(interval: str) -> None:
    with pytest.raises(UsageError, match=r"--collect-interval: .* below the minimum 1s"):
        parse_config(["--collect-interval", interval], env={}, sources={})


def test_the_minimum_itself_is_accepted() -> None:
    config = parse_config(["--collect-interval", "1s"], env={}, sources={})
    assert config.collect_interval == MIN_COLLECT_INTERVAL == 1.0


@pytest.mark.peer
def test_one_readable_line_and_exit_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "--collect-interval", "1ms"],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "rate-limited" in proc.stderr


def test_max_connections_must_be_a_positive_number() -> None:
    with pytest.raises(UsageError, match=r"--web\.max-connections"):
        parse_config(["--web.max-connections", "0"], env={}, sources={})
    assert parse_config(["--web.max-connections", "8"], env={}, sources={}).web_max_connections == 8


# --- device IDs from the kubelet ---------------------------------------------------------------

HOSTILE_IDS = f"""
node: n1
allocatable:
  - {{resource: nvidia.com/gpu, ids: ["{GPU}", "", "   "]}}
pods:
  - name: p1
    namespace: ns1
    containers:
      - name: c1
        devices: [{{resource: nvidia.com/gpu, ids: ["{GPU}", "", "bad\\u0000id", "{"x" * 2000}"]}}]
"""


async def test_empty_and_malformed_device_ids_are_counted_skipped_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    socket = tmp_path / "k.sock"
    kubelet = SimulatedKubelet(parse_scenario(HOSTILE_IDS), socket, clock=lambda: 0.0)
    await kubelet.start()
    client = PodResourcesClient(socket)
    poller = make_poller(node="n1", sources={"fake": StaticSource(gpu_result())}, client=client)
    try:
        snapshots = [await poller.run_once() for _ in range(3)]
    finally:
        await client.close()
        await kubelet.stop()
    snap = snapshots[-1]
    assert [a.raw_id for a in snap.allocations] == [GPU]
    assert [list(d.device_ids) for d in snap.allocatable] == [[GPU]]
    # per cycle: 3 bad IDs in List; 2 in the one GetAllocatableResources call
    # three cycles, each a List (3 bad IDs) and a GetAllocatableResources (2 bad IDs)
    assert snap.podresources.invalid_device_ids_total == 3 * 3 + 3 * 2
    text = render(snap).text.decode()
    assert "kube_device_exporter_podresources_invalid_device_ids_total" in text
    for family in text_string_to_metric_families(text):
        if family.name == "hw_allocation_info":
            assert all(s.labels.get("hw_allocation_device_id") for s in family.samples)
    warnings = [r.getMessage() for r in caplog.records if "malformed device IDs" in r.getMessage()]
    assert len(warnings) == 2, warnings  # once for List, once for GetAllocatableResources


@given(st.text(max_size=300))
def test_device_id_checks_never_raise(raw: str) -> None:
    problem = device_id_problem(raw)
    if not problem:
        assert raw.strip() and raw.isprintable()
    key, replica = normalize_device_id(raw)
    assert isinstance(key, str) and isinstance(replica, str)
    address = pci_address(raw)
    assert address is None or pci_address(address) == address


# --- the scenario and config parsers ---------------------------------------------------------

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10)
docs = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["node", "pods", "allocatable", "ids", "resource", "name", "x"]),
            inner,
            max_size=3,
        )
    ),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=200), docs.map(repr)))
def test_scenario_parser_fails_only_with_scenario_error(text: str) -> None:
    try:
        parse_scenario(text, name="hostile")
    except ScenarioError:
        return


flags = st.sampled_from(
    ["--collect-interval", "--collect-timeout", "--web.listen-address", "--web.max-connections",
     "--kubernetes.timeout", "--kubernetes.max-message-size", "--log.level", "--otlp.protocol",
     "--collector.nvml", "--no-collector.nvml", "--bogus"]
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(flags, st.text(max_size=12)), max_size=6))
def test_command_line_fails_only_with_usage_error(argv: list[str]) -> None:
    try:
        parse_config(argv, env={})
    except UsageError:
        return


# --- label escaping ---------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(
    st.text(min_size=1, max_size=40).filter(lambda s: "\x00" not in s),
    st.text(min_size=1, max_size=40).filter(lambda s: "\x00" not in s),
)
def test_any_pod_name_escapes_and_parses_back(pod: str, model: str) -> None:
    device = Device("GPU-1", "gpu", "nvidia", model, "fake")
    reading = DeviceReading(device, (Sample("hw.gpu.memory.usage", 1.0),))
    joined = JoinedDevice(reading, Holder("ns", pod, "c"), holders=1)
    text = render(Snapshot(timestamp=0.0, node="n", devices=(joined,))).text.decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    [sample] = families["hw_gpu_memory_usage_bytes"].samples
    assert sample.labels["k8s_pod_name"] == pod
    assert sample.labels["hw_model"] == model
