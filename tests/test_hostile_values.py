"""Hostile values (issue 14, item 1): one bad read never corrupts a counter, never spreads.

Each defect of the issue is reproduced first (values from the attack: 2^64-1 in
pcie_replay_count, -3, a 400-digit integer, a busy percentage of -5 and 10^30), then the
parsers are given arbitrary input by hypothesis.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.model import SourceResult
from exporter.sources.amdgpu import AmdgpuSource
from exporter.sources.counters import COUNTER_MAX, MonotonicCounters
from exporter.sources.sysfs.reader import PERCENT, U64, Reader, parse_integer, parse_number
from simulator.sysfs import SysfsPart
from tests.support import Clock
from tests.support.sysfs_nodes import AMD, AMD_DEV
from tests.sysfs_support import context, make_tree

TWO_GPUS = (
    AMD
    + """    - pci: "0000:04:00.0"
      card: 2
      busy_percent: 50
      vram_gib: 64
      vram_used_gib: 2
      power_w: 100
      temperature_c: {edge: 40}
      pcie_replays: 1
      ras: {umc: {ue: 0, ce: 1}}
"""
)
GPU_A, GPU_B = "0000:03:00.0", "0000:04:00.0"
REPLAYS = ("hw.errors", (("error.type", "pcie_replay"),))
BUSY = ("hw.gpu.utilization", (("hw.gpu.task", "general"),))
HUGE = "9" * 400


def samples(
    result: SourceResult, device_id: str
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    [reading] = [r for r in result.readings if r.device.id == device_id]
    return {(s.metric, s.attributes): s.value for s in reading.samples}


@pytest.fixture
def two_gpus(tmp_path: Path) -> Iterator[tuple[SysfsPart, AmdgpuSource]]:
    part = make_tree(tmp_path, TWO_GPUS)
    yield part, AmdgpuSource(context(part, Clock()))


def test_one_read_of_u64_max_does_not_corrupt_a_counter(
    two_gpus: tuple[SysfsPart, AmdgpuSource],
) -> None:
    part, source = two_gpus
    replays = part.root / AMD_DEV / "pcie_replay_count"
    seen = [samples(source.collect(), GPU_A)[REPLAYS]]
    for raw in ("18446744073709551615", "10", "11"):
        replays.write_text(raw + "\n")
        seen.append(samples(source.collect(), GPU_A)[REPLAYS])
    assert seen == [9, 9, 10, 11], "all ones is -1 printed unsigned: a field error"


def test_a_jump_beyond_the_limit_is_held_until_confirmed(
    two_gpus: tuple[SysfsPart, AmdgpuSource],
) -> None:
    part, source = two_gpus
    replays = part.root / AMD_DEV / "pcie_replay_count"
    seen = [samples(source.collect(), GPU_A)[REPLAYS]]
    for raw in (2**60, 10, 2**60, 2**60 + 2**20):
        replays.write_text(f"{raw}\n")
        seen.append(samples(source.collect(), GPU_A)[REPLAYS])
    # held, refuted (a glitch: dropped), held again, confirmed by the next read (real growth)
    assert seen == [9, 9, 10, 10, 2**60 + 2**20]


def test_a_negative_counter_is_a_field_error_not_a_step_back(
    two_gpus: tuple[SysfsPart, AmdgpuSource],
) -> None:
    part, source = two_gpus
    source.collect()
    (part.root / AMD_DEV / "pcie_replay_count").write_text("-3\n")
    result = source.collect()
    assert samples(result, GPU_A)[REPLAYS] == 9
    assert result.field_errors == 1


def test_a_real_reset_is_taken_once_a_second_read_confirms_it(
    two_gpus: tuple[SysfsPart, AmdgpuSource],
) -> None:
    part, source = two_gpus
    replays = part.root / AMD_DEV / "pcie_replay_count"
    seen = [samples(source.collect(), GPU_A)[REPLAYS]]
    for raw in ("0", "2", "5"):  # a driver reload: counting starts again from 0
        replays.write_text(raw + "\n")
        seen.append(samples(source.collect(), GPU_A)[REPLAYS])
    assert seen == [9, 9, 11, 14]


def gpu_files(part: SysfsPart) -> list[str]:
    root = part.root / AMD_DEV
    found = []
    for dirpath, _, files in os.walk(root):
        found += [os.path.relpath(os.path.join(dirpath, f), part.root) for f in files]
    return sorted(found)


def test_a_400_digit_integer_in_any_file_loses_only_that_field(tmp_path: Path) -> None:
    part = make_tree(tmp_path, TWO_GPUS)
    source = AmdgpuSource(context(part, Clock()))
    before = source.collect()
    whole_b = samples(before, GPU_B)
    for rel in gpu_files(part):
        original = (part.root / rel).read_bytes()
        (part.root / rel).write_text(HUGE + "\n")
        result = source.collect()  # never raises
        assert samples(result, GPU_B) == whole_b, f"{rel}: the other GPU lost series"
        got = samples(result, GPU_A)
        assert len(got) >= len(samples(before, GPU_A)) - 3, f"{rel}: more than one field lost"
        (part.root / rel).write_bytes(original)
        source.collect()


@pytest.mark.parametrize("busy", ["-5", "101", str(10**30), "nan", "1e3", "٣٧"])
def test_a_gauge_out_of_its_physical_range_is_no_series(
    two_gpus: tuple[SysfsPart, AmdgpuSource], busy: str
) -> None:
    part, source = two_gpus
    (part.root / AMD_DEV / "gpu_busy_percent").write_text(busy + "\n")
    result = source.collect()
    assert BUSY not in samples(result, GPU_A)
    assert result.field_errors == 1


# --- property-based: the parsers ------------------------------------------------------------

sysfs_text = st.one_of(
    st.text(max_size=60),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.integers(min_value=0, max_value=2**70).map(hex),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(
        ["", " ", "\x00", "-0", "0x", "1_000", "+5", "\uff11\uff12", "1e400", HUGE, "9" * 5000]
    ),
)


@given(sysfs_text, st.sampled_from([U64, PERCENT, (-273_150, 500_000)]))
def test_integer_parser_never_raises_and_respects_bounds(
    text: str, bounds: tuple[float, float]
) -> None:
    value = parse_integer(text, bounds)
    if value is not None:
        assert bounds[0] <= value <= bounds[1]
        assert text.strip().isascii()


@given(st.integers(min_value=0, max_value=2**64 - 2))
def test_every_u64_parses_back(n: int) -> None:
    assert parse_integer(f"{n}\n") == n
    assert parse_integer(hex(n)) == n


@given(st.integers().filter(lambda n: n < 0 or n >= 2**64 - 1))
def test_integers_outside_u64_are_rejected(n: int) -> None:
    assert parse_integer(str(n)) is None


@given(sysfs_text)
def test_number_parser_never_raises_and_is_finite(text: str) -> None:
    value = parse_number(text, (0, 10**5))
    assert value is None or (math.isfinite(value) and 0 <= value <= 10**5)


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(sysfs_text, st.lists(sysfs_text, max_size=4).map("\n".join)))
def test_keyed_files_never_raise(tmp_path: Path, text: str) -> None:
    path = tmp_path / "ras"
    path.write_text(text.replace("\x00", ""), errors="surrogateescape")
    reader = Reader(tmp_path, set())
    values = reader.keyed("ras")
    if values is not None:
        assert all(0 <= v <= 2**64 - 1 for v in values.values())


# --- property-based: the counter rule -------------------------------------------------------

hostile_raw = st.one_of(
    st.integers(min_value=0, max_value=2**64 - 1).map(float),
    st.sampled_from([-3.0, math.nan, math.inf, -math.inf, 2.0**64, 1e30, COUNTER_MAX]),
)


@given(st.lists(st.one_of(st.none(), hostile_raw), max_size=40))
def test_totals_never_go_backwards_whatever_the_reads(raws: list[float | None]) -> None:
    counters = MonotonicCounters()
    last = 0.0
    for raw in raws:
        total = counters.last("k") if raw is None else counters.update("k", raw)
        if total is not None:
            assert math.isfinite(total) and total >= last
            last = total


@given(
    st.lists(st.integers(min_value=0, max_value=10**6), min_size=3, max_size=30),
    st.data(),
)
def test_one_glitch_in_a_growing_counter_changes_nothing(
    steps: list[int], data: st.DataObject
) -> None:
    """A growing counter with one hostile read in the middle ends where it would without it."""
    raws = [float(sum(steps[: i + 1])) for i in range(len(steps))]
    at = data.draw(st.integers(min_value=1, max_value=len(raws) - 2))
    glitch = data.draw(st.sampled_from([COUNTER_MAX, 0.0, -3.0, 1e30, math.nan, 2.0**60]))
    clean, hit = MonotonicCounters(), MonotonicCounters()
    expected = [clean.update("k", r) for r in raws][-1]
    got = [hit.update("k", r) for r in [*raws[:at], glitch, *raws[at:]]][-1]
    assert got == expected


# --- property-based: a hostile file never spreads ------------------------------------------


@settings(max_examples=40, deadline=None)
@given(data=st.data(), content=st.one_of(sysfs_text.map(str.encode), st.binary(max_size=80)))
def test_any_content_in_any_file_of_one_gpu_leaves_the_other_whole(
    data: st.DataObject, content: bytes
) -> None:
    with tempfile.TemporaryDirectory(prefix="kde-hostile-") as tmp:
        part = make_tree(Path(tmp), TWO_GPUS)
        source = AmdgpuSource(context(part, Clock()))
        whole_b = samples(source.collect(), GPU_B)
        rel = data.draw(st.sampled_from(gpu_files(part)))
        (part.root / rel).write_bytes(content)
        result = source.collect()
    assert samples(result, GPU_B) == whole_b
    assert all(math.isfinite(s.value) for r in result.readings for s in r.samples)
