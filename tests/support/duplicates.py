"""Duplicated series, which promtool does not flag (it parses them as valid): the check of
our own, and a pod to list more than once (tests/test_duplicate_pods.py, the bench's
duplicate-pod fault)."""

from __future__ import annotations

from collections import Counter

from prometheus_client.parser import text_string_to_metric_families

from exporter.model import Container, ContainerDevices, ContainerMemory, Pod, PodResourcesState
from tests.support import FixedKubelet, StaticSource, metrics_text
from tests.support.cycle import make_poller
from tests.support.fake_gpu import GPU, gpu_result


def duplicate_series(text: str) -> list[str]:
    """Every (name, labels) that appears more than once in a Prometheus text output."""
    seen: Counter[tuple[str, tuple[tuple[str, str], ...]]] = Counter()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            seen[(s.name, tuple(sorted(s.labels.items())))] += 1
    return [f"{name}{dict(labels)} x{n}" for (name, labels), n in seen.items() if n > 1]


TRAINER = Pod(
    "trainer",
    "ml",
    (
        Container(
            "main",
            (ContainerDevices("nvidia.com/gpu", (GPU,), (0,)),),
            cpu_ids=(2, 3),
            memory=(ContainerMemory("memory", 2**30, (0,)),),
        ),
    ),
)


async def text_of(state: PodResourcesState) -> str:
    """The /metrics text of one cycle over a fake GPU and a kubelet answering `state`."""
    poller = make_poller(
        node="n1",
        sources={"fake": StaticSource(gpu_result())},
        client=FixedKubelet(state),
        clock=lambda: 0.0,
        wall_clock=lambda: 1.7e9,
    )
    try:
        return metrics_text(await poller.run_once())
    finally:
        await poller.close()
