"""A kubelet whose PodResources answers do not decode (issue 41): random bytes, a pod name that
is not UTF-8, one varint of a megabyte, garbage from GetAllocatableResources.

A bad answer costs the kubelet's data only: every cycle runs and serves the devices (the
first one too, when the kubelet never answered well), the answer is counted and said once,
`podresources_up` reads 0, the last good pods and allocatable list are kept; the kubelet is
asked again the next cycle (GetAllocatableResources at the next poll, not 300 s later), so
its data is back one cycle after it is mended; a List that
is one endless varint costs microseconds, not minutes. The kubelet is tests/support/
hostile.py's, a real gRPC server on a unix socket; the cycle is the product's
(tests/support/cycle.py).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from exporter.model import Container, ContainerDevices, Pod, Snapshot
from exporter.podresources.client import PodResourcesClient
from exporter.podresources.parse import OrderFreeKey, order_free_key
from simulator.kubelet_wire import allocatable_to_v1
from tests.support import StaticSource, hostile
from tests.support.cycle import make_poller
from tests.support.fake_gpu import GPU, gpu_result

TRAINER = Pod("trainer", "ml", (Container("main", (ContainerDevices("nvidia.com/gpu", (GPU,)),)),))
GOOD = {
    "List": hostile.v1_list((TRAINER,)),
    "GetAllocatableResources": allocatable_to_v1(
        (ContainerDevices("nvidia.com/gpu", (GPU,)),)
    ).SerializeToString(),
}


@pytest.fixture
async def kubelet(tmp_path: Path) -> AsyncIterator[hostile.RawKubelet]:
    raw = hostile.RawKubelet(tmp_path / "kubelet.sock", dict(GOOD))
    await raw.start()
    yield raw
    await raw.stop()


def poller_for(kubelet: hostile.RawKubelet) -> tuple[object, PodResourcesClient]:
    client = PodResourcesClient(kubelet.socket, timeout=2.0, allocatable_interval=0.0)
    poller = make_poller(node="n1", sources={"fake": StaticSource(gpu_result())}, client=client,
                         interval=1.0)  # fmt: skip
    return poller, client


def holders(snapshot: Snapshot) -> set[str]:
    return {a.holder.pod for a in snapshot.allocations}


def gpu_read(snapshot: Snapshot) -> bool:
    return any(d.reading.device.id == GPU for d in snapshot.devices)


async def test_a_kubelet_that_never_answered_well_still_gets_its_devices_served(
    kubelet: hostile.RawKubelet, caplog: pytest.LogCaptureFixture
) -> None:
    kubelet.answers["List"] = lambda: os.urandom(5000)
    poller, client = poller_for(kubelet)
    with caplog.at_level(logging.WARNING):
        first = await poller.run_once()  # type: ignore[attr-defined]
        second = await poller.run_once()  # type: ignore[attr-defined]
    assert gpu_read(first) and gpu_read(second), "the first cycle serves the devices"
    assert not first.podresources.connected and holders(first) == set()
    assert client.health().refused == {("List", "decode"): 2}, "asked again each cycle"
    said = [r.getMessage() for r in caplog.records if "do not decode" in r.getMessage()]
    assert len(said) == 1, said
    kubelet.answers["List"] = GOOD["List"]
    mended = await poller.run_once()  # type: ignore[attr-defined]
    assert mended.podresources.connected and holders(mended) == {"trainer"}
    await client.close()


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(hostile.pod_name_not_utf8(), id="a pod name not UTF-8"),
        pytest.param(hostile.endless_varint(1 << 20), id="one varint of 1 MB"),
        pytest.param(b"\x0a\x80", id="cut short"),
    ],
)
async def test_a_bad_list_mid_run_keeps_the_last_pods_and_every_cycle(
    kubelet: hostile.RawKubelet, bad: bytes
) -> None:
    poller, client = poller_for(kubelet)
    good = await poller.run_once()  # type: ignore[attr-defined]
    assert holders(good) == {"trainer"}
    kubelet.answers["List"] = bad
    for _ in range(3):
        kept = await poller.run_once()  # type: ignore[attr-defined]
        assert gpu_read(kept) and holders(kept) == {"trainer"}, "the last good pods kept"
        assert not kept.podresources.connected
    assert client.health().refused[("List", "decode")] == 3
    kubelet.answers["List"] = GOOD["List"]
    assert (await poller.run_once()).podresources.connected  # type: ignore[attr-defined]
    await client.close()


async def test_garbage_from_get_allocatable_keeps_the_last_list_and_asks_again_next_poll(
    kubelet: hostile.RawKubelet,
) -> None:
    poller, client = poller_for(kubelet)
    good = await poller.run_once()  # type: ignore[attr-defined]
    assert good.allocatable and holders(good) == {"trainer"}
    kubelet.answers["GetAllocatableResources"] = lambda: os.urandom(3000)
    calls = kubelet.calls["GetAllocatableResources"]
    for _ in range(2):
        kept = await poller.run_once()  # type: ignore[attr-defined]
        assert kept.allocatable == good.allocatable and holders(kept) == {"trainer"}
        assert kept.podresources.connected, "the List of the poll stands"
    assert kubelet.calls["GetAllocatableResources"] == calls + 2, "asked every poll, not 300 s on"
    assert client.health().refused[("GetAllocatableResources", "decode")] == 2
    await client.close()


def test_reading_a_megabyte_varint_is_linear() -> None:
    """Its key used to cost 38 s of CPU (each byte shifted into an ever longer integer); the
    reader now stops at a varint's 10 bytes."""
    started = time.process_time()
    for size in (1 << 16, 1 << 20, 1 << 23):  # up to the 8 MiB receive cap
        key = order_free_key(OrderFreeKey(), hostile.endless_varint(size))
        assert key == (hostile.endless_varint(size),)  # not an answer: the bytes themselves
    assert time.process_time() - started < 0.5
