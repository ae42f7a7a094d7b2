"""A List that names the same pod more than once gives one series per identity (issue 25,
item 7); no golden output holds a series twice. promtool does not flag duplicate series
(it parses them as valid), so the check here is our own, and promtool lints the result."""

from __future__ import annotations

import pytest

from exporter.join import merged_pods
from exporter.model import (
    Container,
    ContainerDevices,
    Pod,
    PodResourcesState,
)
from tests.peers import promtool_check_metrics
from tests.support import GOLDEN
from tests.support.duplicates import TRAINER, duplicate_series, text_of
from tests.support.fake_gpu import GPU


@pytest.mark.peer
async def test_a_pod_listed_three_times_gives_each_series_once() -> None:
    text = await text_of(PodResourcesState(pods=(TRAINER, TRAINER, TRAINER), api_version="v1"))
    assert "hw_container_cpus_exclusive{" in text
    assert duplicate_series(text) == []
    promtool_check_metrics(text)
    once = await text_of(PodResourcesState(pods=(TRAINER,), api_version="v1"))
    assert text == once, "three copies of a pod read as one"


def test_copies_that_differ_are_merged_each_item_once() -> None:
    other = Pod(
        "trainer",
        "ml",
        (
            Container(
                "main", (ContainerDevices("nvidia.com/gpu", ("GPU-other",)),), cpu_ids=(3, 4)
            ),
            Container("sidecar"),
        ),
    )
    [merged] = merged_pods((TRAINER, other, TRAINER))
    main, sidecar = merged.containers
    assert [d.device_ids for d in main.devices] == [(GPU,), ("GPU-other",)]
    assert main.cpu_ids == (2, 3, 4)
    assert sidecar.name == "sidecar"
    assert merged_pods((TRAINER,)) == (TRAINER,)


@pytest.mark.parametrize("golden", sorted(p.name for p in GOLDEN.glob("*.prom")))
def test_no_golden_output_holds_a_series_twice(golden: str) -> None:
    text = (GOLDEN / golden).read_text()
    assert duplicate_series(text) == []
