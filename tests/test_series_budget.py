"""Memory bounded by configuration, not by the kubelet (issue 25 items 4 and 9): a series
budget per node that drops per-holder series in a fixed order, a List size cap that
refuses a bigger answer with one line, and a real exporter process on a node of 100,000
allocated device IDs inside the DaemonSet's memory limit while the other sources keep
their deadlines."""

from __future__ import annotations

import logging
import random
import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from bench.bignode import big_pods, run
from exporter.cli.flags import parse_config
from exporter.derive.budget import Budget
from exporter.model import Container, ContainerDevices, Pod, PodResourcesState, Snapshot
from exporter.sinks.prometheus import PrometheusSink
from tests.support import FixedKubelet, StaticSource, metrics_text
from tests.support.cycle import make_poller
from tests.support.fake_gpu import GPU, gpu_result

REPO = Path(__file__).resolve().parent.parent


def _series(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def _value(text: str, name: str, **labels: str) -> float:
    for line in _series(text):
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} {labels}")


async def _cycle(pods: PodResourcesState, budget: int) -> tuple[str, Budget, Snapshot]:
    """One poller cycle over a GPU a source sees and `pods`, through the budget: the
    text, the budget, and the snapshot before it."""
    budgeted = Budget(max_series=budget)
    poller = make_poller(
        node="n1",
        sources={"fake": StaticSource(gpu_result())},
        client=FixedKubelet(pods),
        budget=budgeted,
        sinks=[PrometheusSink()],
        clock=lambda: 0.0,
        wall_clock=lambda: 1.7e9,
    )
    try:
        whole = await poller.run_once()
    finally:
        await poller.close()
    assert budgeted.last is not None
    return metrics_text(budgeted.last), budgeted, whole


def _node(devices: int, pods: int, *, shuffle: int | None = None) -> PodResourcesState:
    """`devices` IDs no source sees over `pods` pods, and one pod holding the seen GPU last
    by name (so only the rule "holders of seen devices first" keeps it)."""
    listed = [t.pod for t in big_pods(devices, pods)]
    gpu = Container("main", (ContainerDevices("nvidia.com/gpu", (GPU,)),))
    listed.append(Pod("zz-last", "zz", (gpu,)))
    if shuffle is not None:
        random.Random(shuffle).shuffle(listed)
        listed = [replace(p, containers=tuple(reversed(p.containers))) for p in listed]
    return PodResourcesState(pods=tuple(listed), api_version="v1")


async def test_under_the_budget_nothing_is_left_out() -> None:
    text, _, _ = await _cycle(_node(500, 50), budget=10_000)
    assert _value(text, "kube_device_exporter_series_dropped") == 0
    assert _value(text, "kube_device_exporter_series_limit") == 10_000
    assert len([s for s in _series(text) if s.startswith("hw_allocation_info{")]) == 501


async def test_past_the_budget_whole_containers_are_left_out_in_a_fixed_order(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "exporter.budget")
    text, budgeted, whole = await _cycle(_node(5_000, 500), budget=1_000)
    series = _series(text)
    assert len(series) <= 1_000
    dropped = _value(text, "kube_device_exporter_series_dropped")
    unbounded, _, _ = await _cycle(_node(5_000, 500), budget=10**9)
    assert dropped == len(_series(unbounded)) - len(series)
    # never left out: the device a source sees, its holder, the per-resource counts
    assert any(f'hw_id="{GPU}"' in s and "hw_allocation_info" in s for s in series)
    assert _value(text, "hw_allocated_devices", hw_allocation_resource="nvidia.com/gpu") == 5_001
    assert any(s.startswith("hw_info{") for s in series)
    assert _value(text, "kube_device_exporter_cycles_total") == 1
    # whole containers, first by name: pods big-000000.. kept, each with all 10 IDs
    allocations = "\n".join(s for s in series if s.startswith("hw_allocation_info{"))
    kept = re.findall(r'k8s_pod_name="(big-\d+)"', allocations)
    names = sorted(set(kept))
    assert names == [f"big-{i:06d}" for i in range(len(names))]
    assert all(kept.count(n) == 10 for n in names)
    # one warning while over the budget, one line when the node fits again
    budgeted.apply(whole)
    budgeted.apply(whole)
    fits = replace(whole, allocations=(), containers=())
    assert _value(metrics_text(budgeted.apply(fits)), "kube_device_exporter_series_dropped") == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "exporter.budget"]
    assert len(lines) == 2, lines
    assert "series budget passed" in lines[0] and "fits again" in lines[1]
    # the same node listed in another order keeps the same series
    shuffled, _, _ = await _cycle(_node(5_000, 500, shuffle=7), budget=1_000)
    assert sorted(_series(shuffled)) == sorted(series)


def test_budget_and_cap_flags() -> None:
    config = parse_config([], env={})
    assert config.metrics_max_series == 10_000
    assert config.podresources_max_message_bytes == 8 * 1024 * 1024
    config = parse_config(["--metrics.max-series", "500"], env={})
    assert config.metrics_max_series == 500


def _kit_memory_limit_mib() -> float:
    doc = yaml.safe_load((REPO / "deploy/base/daemonset.yaml").read_text())
    [container] = doc["spec"]["template"]["spec"]["containers"]
    limit = container["resources"]["limits"]["memory"]
    assert limit.endswith("Mi"), limit
    return float(limit.removesuffix("Mi"))


@pytest.mark.peer
@pytest.mark.parametrize("devices", [100_000])
async def test_a_node_of_100k_devices_stays_inside_the_kits_memory_limit(
    tmp_path: Path, devices: int
) -> None:
    """A real exporter process (glibc malloc, as the image runs it) at a 1 s interval on
    the mixed node plus 100,000 allocated IDs (a 6 MB List, under the 8 MiB cap)."""
    r = await run(devices, 1_000, [], tmp_path, watch=10.0)
    assert r.ready_seconds is not None, r.log_lines
    assert 0 < r.peak_rss_mib < _kit_memory_limit_mib(), r
    assert r.series is not None and r.series <= 10_000, r
    assert r.dropped is not None and r.dropped > 90_000, r
    assert r.other_sources_failed == 0, r  # amdgpu, intel, rdma, netdev every cycle
    budget_lines = [ln for ln in r.log_lines if "series budget passed" in ln]
    assert len(budget_lines) == 1, r.log_lines


@pytest.mark.peer
async def test_a_list_over_the_cap_is_refused_with_one_line(tmp_path: Path) -> None:
    r = await run(150_000, 1_000, [], tmp_path, watch=6.0)  # 9.0 MB > 8 MiB
    assert r.list_bytes > 8 * 1024 * 1024
    assert r.ready_seconds is not None
    assert r.peak_rss_mib < 128, r  # nothing of it parsed
    refused = [ln for ln in r.log_lines if "over --kubernetes.max-message-size" in ln]
    assert len(refused) == 1, r.log_lines
    assert "raise both together" in refused[0]
    assert r.other_sources_failed == 0, r


def test_numa_series_are_counted_again_when_the_containers_change() -> None:
    """The budget counts NUMA series once while the join hands on the same containers: a
    new tuple, even of the same length, is counted afresh (a stale count would let a node
    past its budget)."""
    from exporter.derive.budget import NumaSeries
    from exporter.model import ContainerNuma, Holder

    def numa(pod: str, devices: int) -> ContainerNuma:
        placed = tuple(("nvidia.com/gpu", n) for n in range(devices))
        return ContainerNuma(Holder("ns", pod, "main"), devices=placed)

    count = NumaSeries()
    one = (numa("a", 1),)
    assert count(one) == 2  # a device's NUMA node and the container's own series
    assert count(one) == 2
    assert count((numa("a", 3),)) == 4
    assert count(()) == 0
