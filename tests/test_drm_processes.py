"""Per-process usage of AMD and Intel GPUs: DRM fdinfo (amdgpu, i915, xe) and KFD, with the
kernel's key layouts (tests/data/drm-fdinfo/, as `amdgpu_fdinfo.c`, `i915_drm_client.c` and
`xe_drm_client.c` print them), over the simulated mixed node's sysfs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.model import ProcessUsage
from exporter.sources.amdgpu import AmdgpuSource
from exporter.sources.intel import IntelSource
from exporter.sources.sysfs.drmfdinfo import Busy, DrmClient, parse_fdinfo, scan
from tests.support import Clock
from tests.sysfs_support import context, make_tree

DATA = Path(__file__).parent / "data" / "drm-fdinfo"
GIB, MIB = 2**30, 2**20
MI300_0 = "8f3a1c2e5b7d9e01"  # unique_id of the mixed node's first MI300X (0000:19:00.0)
FLEX = "0000:4d:00.0"  # i915
B580 = "0000:b3:00.0"  # xe


def fixture(name: str, **replace: str) -> str:
    text = (DATA / f"{name}.txt").read_text()
    for key, value in replace.items():
        old = next(line for line in text.splitlines() if line.startswith(f"{key}:"))
        text = text.replace(old, f"{key}:\t{value}")
    return text


def test_amdgpu_fdinfo() -> None:
    client = parse_fdinfo(fixture("amdgpu"))
    assert client == DrmClient(
        driver="amdgpu",
        pdev="0000:19:00.0",
        client_id=1052,
        engines_ns={"gfx": 1_500_000_000, "compute": 4_000_000_000, "dma": 1000},
        memory_bytes=10 * GIB,  # drm-resident-vram; gtt and cpu are not device memory
    )


def test_amdgpu_legacy_keys_only() -> None:
    """Kernels before drm_print_memory_stats: only `drm-memory-vram` (KiB)."""
    text = "\n".join(
        line
        for line in fixture("amdgpu").splitlines()
        if not line.startswith(("drm-total-", "drm-resident-", "drm-shared-", "drm-active-"))
    )
    client = parse_fdinfo(text)
    assert client is not None and client.memory_bytes == 10 * GIB


def test_i915_fdinfo() -> None:
    client = parse_fdinfo(fixture("i915"))
    assert client is not None
    assert (client.driver, client.pdev, client.client_id) == ("i915", FLEX, 17)
    assert client.memory_bytes == 6144 * MIB  # local0 only: not system0, not stolen-local0
    assert client.engines_ns["compute"] == 2_000_000_000
    assert client.capacity == {"video": 2, "compute": 4}


def test_xe_fdinfo() -> None:
    client = parse_fdinfo(fixture("xe"))
    assert client is not None
    assert (client.driver, client.pdev, client.memory_bytes) == ("xe", B580, 3072 * MIB)
    assert client.engines_ns == {}
    assert client.cycles["rcs"] == (28257900, 7655183225)
    assert client.capacity["ccs"] == 4


@pytest.mark.parametrize(
    "text",
    [
        "pos:\t0\nflags:\t02\nmnt_id:\t15\nino:\t1057\neventfd-count:\t0\n",  # not DRM
        "drm-driver:\tamdgpu\ndrm-client-id:\t1\n",  # no PCI device (a platform GPU)
        "drm-driver:\tamdgpu\ndrm-pdev:\tnot-pci\ndrm-client-id:\t1\n",
        "drm-driver:\tamdgpu\ndrm-pdev:\t0000:19:00.0\ndrm-client-id:\t-1\n",
        "",
    ],
)
def test_not_a_drm_client(text: str) -> None:
    assert parse_fdinfo(text) is None


@given(st.text(max_size=600))
def test_hostile_fdinfo_never_raises(text: str) -> None:
    parse_fdinfo(text)
    parse_fdinfo("drm-driver:\txe\ndrm-pdev:\t0000:b3:00.0\ndrm-client-id:\t1\n" + text)


@given(
    st.integers(min_value=0, max_value=2**63),
    st.sampled_from(["", " KiB", " MiB", " GiB", " ns", " TiB", " bogus"]),
)
def test_memory_units(number: int, unit: str) -> None:
    text = f"drm-driver:\ti915\ndrm-pdev:\t{FLEX}\ndrm-client-id:\t3\ndrm-resident-local0:\t{number}{unit}\n"
    client = parse_fdinfo(text)
    assert client is not None
    scale = {"": 1, " KiB": 1024, " MiB": MIB, " GiB": GIB}.get(unit)
    assert client.memory_bytes == (None if scale is None else number * scale)


def test_busy_fractions_per_engine_class_and_capacity() -> None:
    clock = Clock()
    busy = Busy(clock)
    first = parse_fdinfo(fixture("i915"))
    assert first is not None
    assert busy.update([first]) == {}  # no interval yet
    clock.now = 10.0
    # 10 s later: render busy 5 s of 10 (one engine), compute 20 s over 4 engines (0.5)
    later = parse_fdinfo(
        fixture(
            "i915", **{"drm-engine-render": "5812345678 ns", "drm-engine-compute": "22000000000 ns"}
        )
    )
    assert later is not None
    assert busy.update([later]) == {(FLEX, 17): pytest.approx(0.5)}
    clock.now = 20.0
    # counters that go back (a new client with a reused id) give nothing, not a negative
    assert busy.update([first]) == {}


def test_xe_busy_is_cycles_over_total_cycles() -> None:
    clock = Clock()
    busy = Busy(clock)
    client = parse_fdinfo(fixture("xe"))
    assert client is not None
    busy.update([client])
    clock.now = 1.0
    later = parse_fdinfo(
        fixture(
            "xe",
            **{
                "drm-cycles-rcs": str(28257900 + 100),
                "drm-total-cycles-rcs": str(7655183225 + 400),
                "drm-cycles-ccs": str(800),
                "drm-total-cycles-ccs": str(7655183225 + 400),
            },
        )
    )
    assert later is not None
    # rcs: 100/400 = 0.25; ccs: 800/400 over 4 engines = 0.5
    assert busy.update([later]) == {(B580, 42): pytest.approx(0.5)}


# --- a node: the host /proc with DRM fds, KFD in sysfs -----------------------------------


def add_process(proc: Path, pid: int, fds: dict[int, tuple[str, str | None]]) -> None:
    """fd -> (link target, fdinfo text or None)."""
    (proc / str(pid) / "fd").mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "fdinfo").mkdir(exist_ok=True)
    for fd, (target, info) in fds.items():
        link = proc / str(pid) / "fd" / str(fd)
        link.unlink(missing_ok=True)
        os.symlink(target, link)
        (proc / str(pid) / "fdinfo" / str(fd)).write_text(info or "pos:\t0\nflags:\t02\n")


RENDER = "/dev/dri/renderD128"


def test_amd_processes_from_fdinfo_and_kfd(tmp_path: Path) -> None:
    part = make_tree(tmp_path, "mixed")
    proc = tmp_path / "proc"
    amd = fixture("amdgpu")
    # PID 500: one client behind two fds (dup), and other files
    add_process(proc, 500, {3: (RENDER, amd), 4: (RENDER, amd), 5: ("/dev/null", None)})
    # PID 600: a ROCm process: KFD says 8 GiB on the GPU and 1 GiB on partition 0; its DRM
    # file's VM holds the same buffers (drm-memory-vram), which must not be added
    rocm = fixture("amdgpu", **{"drm-client-id": "2000", "drm-resident-vram": "9216 MiB"})
    add_process(proc, 600, {7: (RENDER, rocm)})
    kfd = part.root / "devices/virtual/kfd/kfd/proc/600"
    kfd.mkdir(parents=True)
    (kfd / "pasid").write_text("32771\n")
    (kfd / "vram_40097").write_text(f"{8 * GIB}\n")  # node 1: the GPU's own render node
    (kfd / "vram_40194").write_text(f"{GIB}\n")  # node 2: amdgpu_xcp_0
    (kfd / "vram_99999").write_text("5\n")  # a gpu_id no node has
    clock = Clock()
    source = AmdgpuSource(context(part, clock, procfs=proc))
    result = source.collect()
    procs = {(p.pid, p.device_id): p for p in result.processes}
    assert procs == {
        (500, MI300_0): ProcessUsage(MI300_0, 500, 10 * GIB, None),
        (600, MI300_0): ProcessUsage(MI300_0, 600, 8 * GIB, None),
        (600, "amdgpu_xcp_0"): ProcessUsage("amdgpu_xcp_0", 600, float(GIB), None),
    }
    assert result.field_errors == 0
    # 10 s later PID 500's compute engine was busy 4 s more: 0.4
    clock.now = 10.0
    add_process(
        proc, 500, {3: (RENDER, fixture("amdgpu", **{"drm-engine-compute": "8000000000 ns"}))}
    )
    later = {(p.pid, p.device_id): p for p in source.collect().processes}
    assert later[(500, MI300_0)].utilization == pytest.approx(0.4)
    assert later[(500, MI300_0)].memory_bytes == 10 * GIB


def test_intel_processes_from_fdinfo(tmp_path: Path) -> None:
    part = make_tree(tmp_path, "mixed")
    proc = tmp_path / "proc"
    add_process(proc, 800, {3: ("/dev/dri/renderD129", fixture("i915"))})
    add_process(proc, 801, {3: ("/dev/dri/renderD130", fixture("xe"))})
    # a client handed to another process (fd passing): counted once, for the lower PID
    add_process(proc, 802, {9: ("/dev/dri/renderD130", fixture("xe"))})
    # an amdgpu client is not the Intel source's
    add_process(proc, 803, {3: (RENDER, fixture("amdgpu"))})
    result = IntelSource(context(part, Clock(), procfs=proc)).collect()
    assert sorted((p.pid, p.device_id, p.memory_bytes) for p in result.processes) == [
        (800, FLEX, 6144 * MIB),
        (801, B580, 3072 * MIB),
    ]


def test_processes_option_off(tmp_path: Path) -> None:
    part = make_tree(tmp_path, "mixed")
    proc = tmp_path / "proc"
    add_process(proc, 800, {3: ("/dev/dri/renderD129", fixture("i915"))})
    result = IntelSource(context(part, Clock(), procfs=proc, processes="false")).collect()
    assert result.processes == ()


def test_scan_counts_processes_it_may_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`/proc/<pid>/fd` of another UID's process answers EACCES to a process without
    CAP_SYS_PTRACE (staged here: the tests may run as real root, who reads anything)."""
    proc = tmp_path / "proc"
    add_process(proc, 700, {3: ("/dev/dri/renderD129", fixture("i915"))})
    add_process(proc, 701, {3: ("/dev/dri/renderD129", fixture("i915", **{"drm-client-id": "18"}))})
    listdir = os.listdir

    def denied(path: str | os.PathLike[str]) -> list[str]:
        if str(path).endswith("/700/fd"):
            raise PermissionError(13, "Permission denied")
        return listdir(path)

    monkeypatch.setattr("exporter.sources.sysfs.drmfdinfo.os.listdir", denied)
    found = scan(proc, ["i915"])
    assert found.unreadable == 1
    assert [(pid, c.client_id) for pid, c in found.clients] == [(701, 18)]


def test_process_scan_runs_every_process_interval_not_every_cycle(tmp_path: Path) -> None:
    from exporter.sources.sysfs.source import PROCESS_INTERVAL

    part = make_tree(tmp_path, "mixed")
    proc = tmp_path / "proc"
    add_process(proc, 800, {3: ("/dev/dri/renderD129", fixture("i915"))})
    clock = Clock()
    source = IntelSource(context(part, clock, procfs=proc))
    assert [p.pid for p in source.collect().processes] == [800]
    add_process(proc, 801, {3: ("/dev/dri/renderD130", fixture("xe"))})
    clock.now = PROCESS_INTERVAL / 2  # not scanned again: the last scan's processes stand
    assert [p.pid for p in source.collect().processes] == [800]
    clock.now = PROCESS_INTERVAL
    assert sorted(p.pid for p in source.collect().processes) == [800, 801]
