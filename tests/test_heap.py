"""The heap trimmer: when it trims (after a shrink, on the next cycle and a minute later),
what a trim does (a full collection, glibc's malloc_trim), and that the exporter runs it."""

from __future__ import annotations

import ctypes
import gc
import json
import os
import platform
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path

import pytest

from exporter.app import Exporter
from exporter.cli.flags import parse_config
from exporter.cycle.pipeline import Stage
from exporter.model import (
    Container,
    ContainerDevices,
    Device,
    DeviceReading,
    Pod,
    PodResourcesState,
    Sample,
    Snapshot,
    SourceResult,
)
from exporter.runtime import heap
from exporter.runtime.heap import MIN_DROP, HeapTrimmer, malloc_trim
from tests.support import Clock, FixedKubelet, StaticSource
from tests.support.cycle import make_poller

GPU = "GPU-6a3f1c2e-1b7d-4c1e-9a55-000000000000"
GLIBC = platform.libc_ver()[0] == "glibc"


class Counter:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> bool:
        self.calls += 1
        return True


class Kubelet(FixedKubelet):
    """`pods` pods, each holding a replica of the one GPU; change `pods` between cycles."""

    def __init__(self, pods: int) -> None:
        super().__init__(PodResourcesState(api_version="v1"))
        self.pods = pods

    async def poll(self, *, fresh_allocatable: bool = False) -> PodResourcesState:
        pods = tuple(
            Pod(f"job-{n}", "batch", (Container("main", (ContainerDevices("nvidia.com/gpu", (f"{GPU}::{n}",)),)),))
            for n in range(self.pods)
        )  # fmt: skip
        return PodResourcesState(pods=pods, api_version="v1")


def gpu() -> StaticSource:
    device = Device(GPU, "gpu", "nvidia", "NVIDIA H100 80GB HBM3", "fake")
    reading = DeviceReading(device, (Sample("hw.gpu.utilization", 0.5),))
    return StaticSource(SourceResult("fake", (reading,)))


def sized(n: int) -> Snapshot:
    """A snapshot whose size (heap.snapshot_size) is n."""
    return Snapshot(0.0, "n1", allocatable=(ContainerDevices("nvidia.com/gpu", ("x",)),) * n)


async def test_a_node_that_shrinks_is_trimmed_on_the_next_cycle_and_a_minute_later() -> None:
    clock, trim, kubelet = Clock(), Counter(), Kubelet(600)
    trimmer = HeapTrimmer(trim, clock=clock)
    poller = make_poller(
        node="n1",
        sources={"fake": gpu()},
        client=kubelet,
        after_cycle=[trimmer.after_cycle],
        interval=1.0,
    )
    trims = []
    try:
        for second in range(200):
            clock.now = float(second)
            if second == 10:
                kubelet.pods = 10  # 590 pods leave: their allocations and placements with them
            if second == 100:
                kubelet.pods = 600  # and come back: growing never trims
            await poller.run_once()
            trims.append(trim.calls)
    finally:
        await poller.close()
    assert trims[10] == 0  # the shrinking cycle: its snapshot's predecessor is still held
    assert trims[11] == 1
    assert trims[69] == 1 and trims[70] == 2  # 60 s after the shrink was seen
    assert trims[-1] == 2 and trimmer.trims == 2


def test_only_a_drop_to_half_the_peak_and_by_min_drop_items_trims() -> None:
    clock, trim = Clock(), Counter()
    trimmer = HeapTrimmer(trim, clock=clock)

    def cycle(size: int) -> int:
        clock.now += 1.0
        trimmer.after_cycle(sized(size))
        return trim.calls

    assert [cycle(n) for n in (100, 900, 450, 450)] == [0, 0, 0, 0]  # half, but by 450 only
    assert [cycle(n) for n in (9000, 5000, 5000)] == [0, 0, 0]  # 56 % of the peak
    assert [cycle(n) for n in (4500, 4500)] == [0, 1]  # half of the peak since the last trim
    clock.now += 60.0
    assert cycle(4500) == 2
    assert [cycle(n) for n in (4500, 2300, 2300)] == [2, 2, 2]  # the peak is 4,500 now
    assert [cycle(n) for n in (2250 - MIN_DROP, 2250 - MIN_DROP)] == [2, 3]


def _garbage_cycle() -> weakref.ref[object]:
    """A reference cycle only the collector frees; the reference dies with it."""

    class Node:
        other: object = None

    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def _trim_with_the_collector_off(trimmer: HeapTrimmer) -> None:
    enabled = gc.isenabled()
    gc.disable()  # so that only the trim can free the cycle
    try:
        trimmer.trim()
    finally:
        if enabled:
            gc.enable()


def test_a_trim_collects_reference_cycles_then_trims_the_c_heap() -> None:
    gone, trim, seen = _garbage_cycle(), Counter(), []

    def look_then_trim() -> bool:
        seen.append(gone() is None)
        return trim()

    trimmer = HeapTrimmer(look_then_trim, clock=Clock())
    _trim_with_the_collector_off(trimmer)
    assert seen == [True]  # collected before malloc_trim walks the heap
    assert trim.calls == 1 and trimmer.trims == 1


def test_without_malloc_trim_a_trim_only_collects(monkeypatch: pytest.MonkeyPatch) -> None:
    class Musl:  # a C library without glibc's extension
        def __init__(self, name: object) -> None:
            self.name = name

    monkeypatch.setattr(ctypes, "CDLL", Musl)  # the module heap calls it through
    assert malloc_trim() is None
    gone, trimmer = _garbage_cycle(), HeapTrimmer(clock=Clock())
    _trim_with_the_collector_off(trimmer)
    assert gone() is None and trimmer.trims == 1


@pytest.mark.peer
@pytest.mark.skipif(not GLIBC, reason="malloc_trim is glibc's")
def test_malloc_trim_hands_freed_pages_in_the_middle_of_the_heap_back(tmp_path: Path) -> None:
    """64 MiB in 1 KiB buffers (glibc's, not pymalloc's: over 512 bytes) with one kept in
    every 64: the free ranges between them are not the heap's top, so free() keeps them;
    malloc_trim(0) hands their pages back."""
    script = textwrap.dedent(
        """
        import json
        from exporter.runtime.heap import _rss_bytes, malloc_trim

        buffers = [bytearray(1024) for _ in range(64 * 1024)]
        for b in buffers:
            b[0] = 1  # touched: resident
        kept = buffers[::64]
        del buffers
        before = _rss_bytes()
        trim = malloc_trim()
        assert trim is not None
        released = trim()
        print(json.dumps([before, _rss_bytes(), released, len(kept)]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    before, after, released, kept = json.loads(done.stdout)
    assert kept == 1024 and released is True
    assert before - after > 40 * 2**20, (before / 2**20, after / 2**20)


def test_the_exporter_trims_as_an_after_cycle_step_not_as_a_sink() -> None:
    config = parse_config(
        ["--kubelet-socket", "/nonexistent/kubelet.sock", "--node-name", "n1"],
        env={}, sources={},
    )  # fmt: skip
    exporter = Exporter(config, sources={"fake": gpu()})
    after = [s.name for s in exporter.poller.pipeline.steps if s.stage is Stage.AFTER]
    assert after == ["heap-trim", "metrics-bodies"]


def broken(snapshot: Snapshot) -> None:
    raise RuntimeError("boom")


async def test_a_failing_after_cycle_step_is_logged_by_name_and_the_cycle_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, trim, kubelet = Clock(), Counter(), Kubelet(600)
    trimmer = HeapTrimmer(trim, clock=clock)
    built: list[int] = []
    poller = make_poller(
        node="n1",
        sources={"fake": gpu()},
        client=kubelet,
        after_cycle=[broken, trimmer.after_cycle, lambda _: built.append(1)],
        interval=1.0,
    )
    try:
        with caplog.at_level("ERROR", logger="exporter.poller"):
            snapshot = await poller.run_once()
        assert len(snapshot.allocations) == 600
        assert "cycle step after-0 failed" in caplog.text
        assert "RuntimeError: boom" in caplog.text
        assert built == [1]  # the /metrics body is still built
        kubelet.pods = 0
        await poller.run_once()
        await poller.run_once()  # the shrink's trim: on the next cycle, after the broken step
    finally:
        await poller.close()
    assert trim.calls == 1 and built == [1, 1, 1]


@pytest.mark.peer
@pytest.mark.skipif(not GLIBC, reason="the image's allocator is glibc's malloc")
def test_as_the_image_runs_it_memory_goes_back_after_each_swing_of_a_big_node() -> None:
    """The pipeline in a process of its own with the image's environment (heap.SHIPPED_ENV),
    through bench/churn.py: 200 pods, then 3,000 pods each holding all 8 GPUs, then 200 again,
    three times. After each swing RSS must have given back at least three quarters of what
    the big node added (here about 7-15 % stays, at a constant few MiB). On Python's own
    allocator 38-62 % stays, growing with each swing, and without the trimmer all of it."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.churn", "50", "3000", "1"],
        env={**os.environ, **heap.SHIPPED_ENV},
        capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parent.parent,
    )  # fmt: skip
    c = json.loads(done.stdout.strip().splitlines()[-1])
    assert c["trims"] >= 6  # two after each of the three shrinks
    warm = c["warm_rss"]
    for n in (1, 2, 3):
        added, kept = c[f"big_rss_{n}"] - warm, c[f"shrunk_rss_{n}"] - warm
        assert added > 60 * 2**20, (n, added / 2**20)  # the big node did take memory
        assert kept < 0.25 * added, (n, kept / 2**20, added / 2**20)


def test_the_trimmer_says_when_python_s_own_allocator_keeps_memory(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")  # in a pod
    for blocks, said in ((12345, True), (0, False)):  # pymalloc counts its blocks, malloc not
        monkeypatch.setattr(sys, "getallocatedblocks", lambda b=blocks: b)
        caplog.clear()
        with caplog.at_level("INFO", logger="exporter.heap"):
            HeapTrimmer(clock=Clock())
        assert ("PYTHONMALLOC=malloc" in caplog.text) is said


def test_a_local_run_is_not_told_about_the_allocator_at_info(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kube-device-exporter` from a checkout: no pod, no info line on every start."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setattr(sys, "getallocatedblocks", lambda: 12345)
    with caplog.at_level("INFO", logger="exporter.heap"):
        HeapTrimmer(clock=Clock())
    assert "PYTHONMALLOC" not in caplog.text
