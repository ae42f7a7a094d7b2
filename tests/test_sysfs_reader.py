"""The shared sysfs reading layer: one read per file, errors counted, counters monotonic."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from exporter.sources.sysfs.hwmon import read_hwmon
from exporter.sources.sysfs.reader import BUFFER_BYTES, Reader
from exporter.sources.sysfs.source import Counters, Rates
from tests.support import Clock
from tests.sysfs_support import blocking_file


def write(root: Path, rel: str, content: str | bytes) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())


def test_values_and_whitespace(tmp_path: Path) -> None:
    write(tmp_path, "a", "42\n")
    write(tmp_path, "hex", "0x1002\n")
    write(tmp_path, "f", " 1.5 \n")
    reader = Reader(tmp_path, set())
    assert reader.integer("a") == 42
    assert reader.integer("hex") == 0x1002
    assert reader.number("f") == 1.5
    assert reader.errors == 0


def test_each_file_is_read_once_per_cycle(tmp_path: Path) -> None:
    write(tmp_path, "a", "1\n")
    reader = Reader(tmp_path, set())
    assert reader.integer("a") == 1
    write(tmp_path, "a", "2\n")
    assert reader.integer("a") == 1, "a second read in the same cycle must come from the cache"
    assert Reader(tmp_path, set()).integer("a") == 2


def test_one_small_read(tmp_path: Path) -> None:
    write(tmp_path, "big", "7" * (BUFFER_BYTES * 3))
    text = Reader(tmp_path, set()).text("big")
    assert text is not None
    assert len(text) == BUFFER_BYTES


@pytest.mark.parametrize(
    "content",
    [b"garbage\n", b"\n", b"12abc\n", b"\xff\xfe\n", b"1.5\n"],
    ids=["word", "empty", "partial", "not-utf8", "float-for-int"],
)
def test_garbage_skips_the_field_and_counts(tmp_path: Path, content: bytes) -> None:
    write(tmp_path, "x", content)
    reader = Reader(tmp_path, set())
    assert reader.integer("x") is None
    assert reader.errors == 1


def test_a_file_never_there_is_not_an_error_but_one_that_vanished_is(tmp_path: Path) -> None:
    seen: set[str] = set()
    write(tmp_path, "power1_average", "1\n")
    first = Reader(tmp_path, seen)
    assert first.integer("power1_input") is None
    assert first.integer("power1_average") == 1
    assert first.errors == 0, "an unsupported file is silence, not an error"
    (tmp_path / "power1_average").unlink()
    second = Reader(tmp_path, seen)
    assert second.integer("power1_average") is None
    assert second.errors == 1, "a file that was readable and is gone is an error"
    third = Reader(tmp_path, seen)
    assert third.integer("power1_average") is None
    assert third.errors == 1, "still skipped, still counted"


def test_eagain_from_a_real_blocking_file_is_counted_not_waited_for(tmp_path: Path) -> None:
    """A FIFO with a writer that never writes: a blocking read would hang the worker."""
    with blocking_file(tmp_path / "gpu_busy_percent"):
        reader = Reader(tmp_path, set())
        # None, not "": the read failed with EAGAIN (an empty read would give "")
        assert reader.text("gpu_busy_percent") is None
        assert reader.errors == 1


def test_ras_lines(tmp_path: Path) -> None:
    write(tmp_path, "ok", "ue: 2\nce: 31\n")
    write(tmp_path, "busy", "Query currently inaccessible\n")
    write(tmp_path, "cut", "ue: 2\nce:")
    reader = Reader(tmp_path, set())
    assert reader.keyed("ok") == {"ue": 2, "ce": 31}
    assert reader.keyed("busy") is None
    assert reader.keyed("cut") is None
    assert reader.errors == 2


def test_pci_address_through_a_device_link(tmp_path: Path) -> None:
    pci = tmp_path / "devices/pci0000:00/0000:00:01.0/0000:19:00.0"
    (pci / "drm/card1").mkdir(parents=True)
    os.symlink("../../../0000:19:00.0", pci / "drm/card1/device")
    reader = Reader(tmp_path, set())
    rel = "devices/pci0000:00/0000:00:01.0/0000:19:00.0/drm/card1/device"
    assert reader.pci_address_of(rel) == "0000:19:00.0"


def test_hwmon_units(tmp_path: Path) -> None:
    """µW -> W, m°C -> °C, µJ -> J, Hz stays Hz; labels name the sensors."""
    chip = "dev/hwmon/hwmon0"
    for name, value in {
        "name": "amdgpu",
        "power1_average": "612500000",
        "power1_cap": "750000000",
        "temp2_input": "67500",
        "temp2_label": "junction",
        "temp3_input": "-1500",
        "temp3_label": "mem",
        "freq1_input": "2100000000",
        "freq1_label": "sclk",
        "energy1_input": "1234567891",
    }.items():
        write(tmp_path, f"{chip}/{name}", f"{value}\n")
    [reading] = read_hwmon(Reader(tmp_path, set()), "dev")
    assert reading.name == "amdgpu"
    assert reading.power_watts == 612.5
    assert reading.power_limit_watts == 750.0
    assert reading.temperatures_celsius == {"junction": 67.5, "memory": -1.5}
    assert reading.clocks_hertz == {"graphics": 2.1e9}
    assert reading.energy_joules == pytest.approx(1234.567891)


def test_counters_hold_through_failed_reads_and_never_go_backwards() -> None:
    counters = Counters()
    raws: list[float | None] = [100, None, 150, None, None, 40, 60, None, 10, 12]
    out = [counters.value("dev", "hw.errors", raw) for raw in raws]
    # held while unreadable; a drop (driver reload) is held until the next read confirms it,
    # then the count since the reset is added: never down
    assert out == [100, 100, 150, 150, 150, 150, 210, 210, 210, 222]


def test_counters_are_kept_per_series() -> None:
    counters = Counters()
    assert counters.value("a", "m", 5, (("dir", "rx"),)) == 5
    assert counters.value("a", "m", 7, (("dir", "tx"),)) == 7
    assert counters.value("a", "m", None, (("dir", "rx"),)) == 5
    assert counters.value("b", "m", None) is None, "no value ever read: no series"


def test_rates_use_the_injected_clock() -> None:
    clock = Clock(100.0)
    rates = Rates(clock)
    assert rates.per_second("e", 1000.0) is None, "one point is no rate"
    clock.now = 110.0
    assert rates.per_second("e", 1950.0) == 95.0
    clock.now = 110.0
    assert rates.per_second("e", 2000.0) is None, "no time passed"
    clock.now = 120.0
    assert rates.per_second("e", None) is None
    assert rates.per_second("e", 10.0) is None, "a reset is no rate"


def test_paths_join_the_root_as_pathlib_would(tmp_path: Path) -> None:
    reader = Reader(tmp_path, set())
    assert reader.path("class/drm") == f"{tmp_path}/class/drm"
    assert reader.path("/proc/1/fdinfo") == "/proc/1/fdinfo"  # absolute stays itself
    assert Reader(Path("/"), set()).path("class") == "/class"
