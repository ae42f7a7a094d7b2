"""What a cycle reads of NVML, and what it leaves to the slow interval (readings.Reader and
its processes.ProcessLists).

Process lists: the compute list every cycle; the graphics and MPS lists every cycle only
while they list a process, otherwise on the slow interval. GPM: a read without a rate is
retried a few cycles, then left to the slow interval. The NVML process lists are stand-in C
functions with the library's names and arguments (as `exporter/sources/nvml/direct.py`
calls them), so each cycle's calls are counted exactly."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pynvml
import pytest

from exporter.sources.nvml import processes
from exporter.sources.nvml.calls import Calls
from exporter.sources.nvml.direct import NOT_AVAILABLE, PROCESSES_KEPT
from exporter.sources.nvml.readings import Reader

GIB = float(2**30)


@dataclass
class _Proc:
    pid: int
    usedGpuMemory: int | None


class _Lists:
    """The three `_v3` process lists as C functions (nvml.h: `infoCount` in, the count out;
    INSUFFICIENT_SIZE with the count needed when the array is too small)."""

    def __init__(self) -> None:
        self.procs: dict[str, list[_Proc]] = {"compute": [], "graphics": [], "mps": []}
        self.calls: Counter[str] = Counter()

    def function(self, name: str) -> Any:
        kind = next(k for k, n in KINDS.items() if n == name)

        def fn(handle: object, count_ref: Any, infos: Any) -> int:
            self.calls[kind] += 1
            listed, count = self.procs[kind], count_ref._obj
            if count.value < len(listed):
                count.value = len(listed)
                return INSUFFICIENT_SIZE
            for info, proc in zip(infos, listed, strict=False):
                info.pid = proc.pid
                used = proc.usedGpuMemory
                info.usedGpuMemory = NOT_AVAILABLE if used is None else used
            count.value = len(listed)
            return SUCCESS

        return fn


SUCCESS: int = pynvml.NVML_SUCCESS
INSUFFICIENT_SIZE: int = pynvml.NVML_ERROR_INSUFFICIENT_SIZE
KINDS = dict(zip(("compute", "graphics", "mps"), processes.PROCESS_LISTS, strict=True))


@pytest.fixture
def lists(monkeypatch: pytest.MonkeyPatch) -> _Lists:
    fake = _Lists()
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", fake.function)
    return fake


def _cycle(
    reader: Reader, lists: _Lists, *, slow: bool
) -> tuple[dict[int, float | None], set[str]]:
    lists.calls.clear()
    found = reader.procs.read("MIG-1", object(), None, slow=slow)
    return {pid: memory for pid, memory, _ in found}, set(lists.calls)


def test_an_mps_client_is_read_every_cycle_while_listed(lists: _Lists) -> None:
    reader = Reader(
        Calls(logging.getLogger("test")), clock=lambda: 0.0, slow_interval=10.0, gpm_interval=10.0
    )
    lists.procs["mps"] = [_Proc(7, 2**30)]
    # The first read of a device reads every list.
    assert _cycle(reader, lists, slow=False) == ({7: GIB}, {"compute", "graphics", "mps"})
    # The MPS list listed a process: it is read every cycle, the empty graphics list not.
    assert _cycle(reader, lists, slow=False) == ({7: GIB}, {"compute", "mps"})
    lists.procs["mps"] = [_Proc(7, 2**30), _Proc(8, 2**29)]
    assert _cycle(reader, lists, slow=False) == ({7: GIB, 8: GIB / 2}, {"compute", "mps"})
    # Once empty, it is left to the slow interval.
    lists.procs["mps"] = []
    assert _cycle(reader, lists, slow=False) == ({}, {"compute", "mps"})
    assert _cycle(reader, lists, slow=False) == ({}, {"compute"})


def test_a_new_graphics_or_mps_process_shows_on_the_slow_interval(lists: _Lists) -> None:
    reader = Reader(
        Calls(logging.getLogger("test")), clock=lambda: 0.0, slow_interval=10.0, gpm_interval=10.0
    )
    lists.procs["compute"] = [_Proc(5, 2**30)]
    assert _cycle(reader, lists, slow=True)[1] == {"compute", "graphics", "mps"}
    lists.procs["graphics"] = [_Proc(9, 2**28)]
    # Between slow reads the (so far empty) graphics list is not asked...
    assert _cycle(reader, lists, slow=False) == ({5: GIB}, {"compute"})
    # ...the next slow read finds the process, and from then on every cycle does.
    assert _cycle(reader, lists, slow=True) == (
        {5: GIB, 9: GIB / 4},
        {"compute", "graphics", "mps"},
    )
    assert _cycle(reader, lists, slow=False) == ({5: GIB, 9: GIB / 4}, {"compute", "graphics"})


def test_a_process_in_two_lists_counts_its_memory_once(lists: _Lists) -> None:
    reader = Reader(
        Calls(logging.getLogger("test")), clock=lambda: 0.0, slow_interval=10.0, gpm_interval=10.0
    )
    lists.procs["compute"] = [_Proc(7, 2**30)]
    lists.procs["mps"] = [_Proc(7, 2**30)]
    assert _cycle(reader, lists, slow=True)[0] == {7: GIB}


def test_a_list_longer_than_the_buffer_grows_it_and_loses_no_process(lists: _Lists) -> None:
    reader = Reader(
        Calls(logging.getLogger("test")), clock=lambda: 0.0, slow_interval=10.0, gpm_interval=10.0
    )
    many = PROCESSES_KEPT + 10
    lists.procs["compute"] = [_Proc(100 + i, None if i % 2 else 2**20) for i in range(many)]
    found, _ = _cycle(reader, lists, slow=True)
    assert len(found) == many
    assert found[100] == 2**20 and found[101] is None  # NOT_AVAILABLE: unknown, not 0
    assert lists.calls["compute"] == 2  # INSUFFICIENT_SIZE once, then the bigger buffer
    _cycle(reader, lists, slow=False)
    assert lists.calls["compute"] == 1  # the buffer kept its size


def test_a_gpm_that_gives_no_rate_is_retried_a_few_cycles_then_left_to_the_gpm_interval() -> None:
    """nvmlGpmMetricsGet costs 1.5 ms per device on an H100 (docs/nvml.md): a device whose
    GPM never yields a rate must not cost that every cycle."""
    import pynvml

    from exporter.sources.nvml.gpm import Gpm

    now = [0.0]
    reader = Reader(
        Calls(logging.getLogger("test")),
        clock=lambda: now[0],
        slow_interval=10.0,
        gpm_interval=10.0,
    )
    asked: list[int] = []

    def failing_sample(buffer: object) -> None:
        asked.append(1)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    gpm = Gpm(previous=object(), current=object())
    reads = []
    for cycle in range(25):
        now[0] = float(cycle)  # one cycle a second
        asked.clear()
        assert reader._gpm("MIG-1", failing_sample, gpm=gpm, mig=True) == []
        reads.append(len(asked))
    # The first read and two retries, then one read per GPM interval (cycles 10, 20).
    assert [c for c, n in enumerate(reads) if n] == [0, 1, 2, 10, 20]
