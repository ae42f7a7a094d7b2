"""The NVML behaviour table (exporter/sources/nvml/behaviour.py): each row's nvml.h passage
is in the real header, the stand-in behaves as the row and its note
(simulator/nvml_stand_in.py) say, and so does the source.

A test here that fails after a change to the stand-in means the stand-in stopped behaving
like the header says a driver does; never relax it to make the source pass.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path

import pynvml
import pytest

from exporter.ids import mig_placement_key
from exporter.model import SourceResult
from exporter.sources import RestartRequired
from exporter.sources.nvml import NvmlUnavailable
from exporter.sources.nvml.behaviour import BY_KEY, TABLE
from simulator.nvml_stand_in import STAND_IN, render
from tests.nvml_support import NvidiaNode, fakenvml, nvidia_node

__all__ = ["fakenvml", "nvidia_node"]

GPU = "GPU-00000000-0000-4000-8000-00000000000{}"
MIG = "MIG-00000000-0000-5000-8000-00000000010{}"


def nvml_header() -> str:
    import nvidia

    for root in nvidia.__path__:
        for path in Path(root).glob("*/include/nvml.h"):
            return path.read_text()
    pytest.fail("nvml.h not found: the nvidia-nvml-dev package (test extra) is missing")


def _flat(text: str) -> str:
    text = re.sub(r"^\s*\*\s?", " ", text, flags=re.M)  # comment prefixes
    return re.sub(r"\s+", " ", text).strip()


@pytest.mark.parametrize("row", TABLE, ids=[b.key for b in TABLE])
def test_every_row_quotes_the_real_header(row: object) -> None:
    from exporter.sources.nvml.behaviour import Behaviour

    assert isinstance(row, Behaviour)
    assert _flat(row.header) in _flat(nvml_header()), f"{row.key}: not in nvml.h"
    assert row.rule and STAND_IN.get(row.key), f"{row.key}: no stand-in note"


def test_every_stand_in_note_is_for_a_row() -> None:
    assert set(STAND_IN) == set(BY_KEY)


def ids(result: SourceResult) -> list[str]:
    return [r.device.id for r in result.readings]


def state(result: SourceResult, device_id: str) -> str:
    (reading,) = [r for r in result.readings if r.device.id == device_id]
    (found,) = [
        dict(s.attributes)["hw.state"]
        for s in reading.samples
        if s.metric == "hw.status" and s.value == 1
    ]
    return found


TWO = f"""
nvidia:
  pid_namespace: host
  gpus:
    - uuid: {GPU.format(0)}
      processes: [{{pid: 10, memory: 1GiB, utilization: 0.4}}, {{pid: 11, memory: 2GiB,
                   utilization: 0.0}}]
    - uuid: {GPU.format(1)}
"""


def test_count_is_fixed_at_init(nvidia_node: Callable[[str], NvidiaNode]) -> None:
    assert "enumerated-at-init" in BY_KEY
    node = nvidia_node(TWO)
    pynvml.nvmlInit()
    try:
        assert pynvml.nvmlDeviceGetCount() == 2
        three = TWO + f"    - uuid: {GPU.format(2)}\n"
        node.part.spec = nvidia_node(three).part.spec  # a GPU appears in the state file
        node.at(1.0)
        assert pynvml.nvmlDeviceGetCount() == 2  # not until NVML initializes again
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetHandleByIndex(2)
    finally:
        pynvml.nvmlShutdown()
    pynvml.nvmlInit()
    try:
        assert pynvml.nvmlDeviceGetCount() == 3
    finally:
        pynvml.nvmlShutdown()


def test_a_gpu_without_access_is_counted_skipped_and_named_once(
    nvidia_node: Callable[[str], NvidiaNode], caplog: pytest.LogCaptureFixture
) -> None:
    assert "count-is-all-devices" in BY_KEY
    node = nvidia_node(TWO + "  faults: [{kind: no_access, gpus: [1]}]\n")
    pynvml.nvmlInit()
    try:
        assert pynvml.nvmlDeviceGetCount() == 2
        with pytest.raises(pynvml.NVMLError_NoPermission):
            pynvml.nvmlDeviceGetHandleByIndex(1)
    finally:
        pynvml.nvmlShutdown()
    caplog.set_level(logging.INFO)
    source = node.source(**{"rediscover-interval": "1s"})
    for t in (1.0, 3.0, 5.0):
        result = node.collect_at(source, t)
        assert ids(result) == [GPU.format(0)]
        assert result.field_errors == 0
    assert sum("GPU 1 is not accessible" in r.message for r in caplog.records) == 1


UPGRADE = f"""
nvidia:
  driver_version: "570.86.15"
  gpus: [{{uuid: {GPU.format(0)}}}]
  faults:
    - {{kind: driver_upgraded, start: 10, end: 20, version: "580.95.05"}}
"""


def test_a_driver_upgrade_is_a_version_mismatch_for_the_old_library(
    nvidia_node: Callable[[str], NvidiaNode],
) -> None:
    assert "rm-version-mismatch" in BY_KEY
    node = nvidia_node(UPGRADE)
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        node.at(25.0)  # the new driver is loaded; this process mapped the old library
        with pytest.raises(pynvml.NVMLError_LibRmVersionMismatch):
            pynvml.nvmlDeviceGetUUID(handle)
    finally:
        pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_LibRmVersionMismatch):
        pynvml.nvmlInit()


def test_after_a_driver_upgrade_the_source_asks_for_a_restart(
    nvidia_node: Callable[[str], NvidiaNode],
) -> None:
    node = nvidia_node(UPGRADE)
    source = node.source(**{"restart-after": "60s"})
    assert ids(node.collect_at(source, 5.0)) == [GPU.format(0)]
    with pytest.raises(NvmlUnavailable, match="lost the driver"):
        node.collect_at(source, 12.0)  # unloaded: a failure, not "absent", since it worked
    for t in (15.0, 30.0, 71.0):
        with pytest.raises(NvmlUnavailable, match="init failed"):
            node.collect_at(source, t)
    with pytest.raises(RestartRequired, match="only a new container loads the new one"):
        node.collect_at(source, 72.5)  # 60 s after the first failure at 12
    # A new process (the restarted container) maps the new library and works.
    node.lib.fakenvml_new_process()
    fresh = node.source()
    assert ids(node.collect_at(fresh, 80.0)) == [GPU.format(0)]


MIG_GPU = f"""
nvidia:
  privileged: false
  pid_namespace: host
  gpus:
    - uuid: {GPU.format(0)}
      mig:
        - {{uuid: {MIG.format(1)}, profile: 3g.40gb, gi: 1,
           processes: [{{pid: 21, memory: 3GiB, utilization: 0.5}}]}}
        - {{uuid: {MIG.format(2)}, profile: 3g.40gb, gi: 2}}
  xid:
    - {{at: 5, device: {MIG.format(1)}, xid: 43}}
    - {{at: 6, device: 0, xid: 79}}
"""


def test_unprivileged_mig_gpu_denies_aggregate_processes_and_instance_events(
    nvidia_node: Callable[[str], NvidiaNode],
) -> None:
    assert {"mig-aggregate-processes", "events-mig-unprivileged"} <= BY_KEY.keys()
    node = nvidia_node(MIG_GPU)
    pynvml.nvmlInit()
    try:
        gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_NoPermission):
            pynvml.nvmlDeviceGetComputeRunningProcesses(gpu)
        mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
        assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(mig)] == [21]
        events = pynvml.nvmlEventSetCreate()
        pynvml.nvmlDeviceRegisterEvents(gpu, pynvml.nvmlEventTypeXidCriticalError, events)
        node.at(7.0)
        first = pynvml.nvmlEventSetWait_v2(events, 1000)
        assert first.eventData == 79  # the slice's XID 43 is not reported without privileges
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlEventSetWait_v2(events, 50)
        pynvml.nvmlEventSetFree(events)
        with pytest.raises(pynvml.NVMLError_NotSupported):  # process-utilization-mig
            pynvml.nvmlDeviceGetProcessUtilization(gpu, 0)
    finally:
        pynvml.nvmlShutdown()


def test_unprivileged_source_reads_what_it_may_and_counts_no_errors(
    nvidia_node: Callable[[str], NvidiaNode],
) -> None:
    node = nvidia_node(MIG_GPU)
    source = node.source()
    for t in (1.0, 2.0):
        result = node.collect_at(source, t)
        assert result.field_errors == 0
        assert sorted(ids(result)) == sorted([GPU.format(0), MIG.format(1), MIG.format(2)])
    assert [(p.device_id, p.pid) for p in result.processes] == [(MIG.format(1), 21)]
    assert result.processes[0].utilization is None  # never under MIG


def test_queued_events_are_handed_over_at_once_with_a_zero_timeout(
    nvidia_node: Callable[[str], NvidiaNode],
) -> None:
    assert "events-ready-at-once" in BY_KEY
    node = nvidia_node(f"""
nvidia:
  gpus:
    - uuid: {GPU.format(0)}
  xid:
    - {{at: 5, device: 0, xid: 13}}
    - {{at: 6, device: 0, xid: 31}}
""")
    pynvml.nvmlInit()
    try:
        events = pynvml.nvmlEventSetCreate()
        gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
        pynvml.nvmlDeviceRegisterEvents(gpu, pynvml.nvmlEventTypeXidCriticalError, events)
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlEventSetWait_v2(events, 0)  # none yet: at once, not after a wait
        node.at(10.0)
        taken = [pynvml.nvmlEventSetWait_v2(events, 0).eventData for _ in range(2)]
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlEventSetWait_v2(events, 0)
        pynvml.nvmlEventSetFree(events)
    finally:
        pynvml.nvmlShutdown()
    assert taken == [13, 31]  # both, in order, each once


def test_process_utilization_is_the_mean_of_the_samples_and_idle_is_zero(
    nvidia_node: Callable[[str], NvidiaNode],
) -> None:
    assert "process-utilization-samples" in BY_KEY
    node = nvidia_node(TWO)
    source = node.source(**{"slow-interval": "1ms"})
    node.collect_at(source, 1.0)
    result = node.collect_at(source, 5.0)  # driver periods ended since the last cycle
    assert {p.pid: p.utilization for p in result.processes} == {10: pytest.approx(0.4), 11: 0.0}
    result = node.collect_at(source, 5.2)  # no period ended since: NOT_FOUND, nothing said
    assert {p.pid: p.utilization for p in result.processes} == {10: None, 11: None}
    assert result.field_errors == 0


def test_a_mig_mode_change_is_seen_in_the_next_cycle(
    nvidia_node: Callable[[str], NvidiaNode],
) -> None:
    plain = f"""
nvidia:
  gpus: [{{uuid: {GPU.format(0)}}}]
"""
    node = nvidia_node(plain)
    source = node.source(**{"rediscover-interval": "1h", "slow-interval": "1s"})
    assert ids(node.collect_at(source, 1.0)) == [GPU.format(0)]
    node.part.spec = nvidia_node(MIG_GPU).part.spec  # MIG enabled, two slices made
    result = node.collect_at(source, 2.0)
    assert sorted(ids(result)) == sorted([GPU.format(0), MIG.format(1), MIG.format(2)])


WAITING = f"""
nvidia:
  gpus: [{{uuid: {GPU.format(0)}, mig_mode: true}}]
"""
"""MIG mode on, no slice yet: a GPU whose partitions a DRA driver makes at prepare."""
MADE = f"""
nvidia:
  gpus:
    - uuid: {GPU.format(0)}
      mig:
        - {{uuid: {MIG.format(3)}, profile: 1g.10gb, gi: 11, placement: {{start: 2}}}}
"""


def test_a_slice_made_at_prepare_is_seen_and_placed(
    nvidia_node: Callable[[str], NvidiaNode],
) -> None:
    """gpu-instance-by-id-privileged and enumerated-at-init: a slice made with the MIG mode
    unchanged (dra-driver-nvidia-gpu nvlib.go createMigDevice) is found at the next slow
    check, with its GPU instance's profile and placement, the key NVIDIA's partition names."""
    assert {"gpu-instance-by-id-privileged", "enumerated-at-init"} <= BY_KEY.keys()
    node = nvidia_node(WAITING)
    source = node.source(**{"rediscover-interval": "1h", "slow-interval": "1s"})
    assert ids(node.collect_at(source, 1.0)) == [GPU.format(0)]
    node.part.spec = nvidia_node(MADE).part.spec
    assert ids(node.collect_at(source, 1.5)) == [GPU.format(0)]  # before the slow check
    result = node.collect_at(source, 2.5)
    assert ids(result) == [GPU.format(0), MIG.format(3)]
    (mig,) = [r.device for r in result.readings if r.device.parent]
    assert mig_placement_key(GPU.format(0), 19, 2) in mig.aliases
    assert result.field_errors == 0


def test_unprivileged_the_placement_is_denied_once_and_no_error(
    nvidia_node: Callable[[str], NvidiaNode], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    node = nvidia_node(MIG_GPU)
    source = node.source(**{"rediscover-interval": "1s"})
    for t in (1.0, 2.5, 4.0):
        result = node.collect_at(source, t)
        assert result.field_errors == 0
    migs = [r.device for r in result.readings if r.device.parent]
    assert len(migs) == 2 and not any("/mig-placement/" in a for m in migs for a in m.aliases)
    denied = [m for m in caplog.messages if "denies nvmlDeviceGetGpuInstanceById" in m]
    assert len(denied) == 1


def test_a_lost_gpu_stays_failed_across_a_driver_reload_until_retention(
    nvidia_node: Callable[[str], NvidiaNode],
) -> None:
    assert "gpu-is-lost" in BY_KEY
    node = nvidia_node(
        TWO
        + """  faults:
    - {kind: lost, gpus: [1], start: 10}
    - {kind: driver_unloaded, start: 20, end: 25}
"""
    )
    source = node.source(**{"lost-retention": "100s"})
    assert state(node.collect_at(source, 5.0), GPU.format(1)) == "ok"
    for t in (11.0, 12.0):
        result = node.collect_at(source, t)
        assert state(result, GPU.format(1)) == "failed"
        assert state(result, GPU.format(0)) == "ok"
    with pytest.raises(NvmlUnavailable):
        node.collect_at(source, 21.0)
    for t in (30.0, 100.0):  # after the reload the GPU's handle cannot be had at all
        result = node.collect_at(source, t)
        assert state(result, GPU.format(1)) == "failed"
    assert GPU.format(1) not in ids(node.collect_at(source, 115.0))  # retention over


NVML_MD = Path(__file__).resolve().parent.parent / "docs" / "nvml.md"


def test_docs_nvml_md_is_generated_from_the_table() -> None:
    text = NVML_MD.read_text()
    assert text == render(text), "run `make docs`"
    assert "## `gpu-is-lost`" in text and STAND_IN["gpu-is-lost"] in text


def test_own_pid_namespace_lists_nothing_but_samples_keep_host_pids(
    nvidia_node: Callable[[str], NvidiaNode],
) -> None:
    """Measured on an H100 (docs/nvml.md, bench/pidns_probe.sh): a pod without hostPID gets
    no process from the lists, and utilization samples with host PIDs."""
    assert "nvidia.pid_namespace: own" in NVML_MD.read_text().split("## Measured")[1]
    node = nvidia_node(TWO.replace("pid_namespace: host", "pid_namespace: own"))
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlDeviceGetComputeRunningProcesses(handle) == []
        assert pynvml.nvmlDeviceGetGraphicsRunningProcesses(handle) == []
        node.at(5.0)
        samples = pynvml.nvmlDeviceGetProcessUtilization(handle, 0)
        assert [(s.pid, s.smUtil) for s in samples] == [(10, 40)]
    finally:
        pynvml.nvmlShutdown()
    source = node.source(**{"slow-interval": "1ms"})
    result = node.collect_at(source, 5.0)
    # the sampled process, with its host PID, utilization and no memory (not 0); the
    # idle one is not seen at all
    (process,) = result.processes
    assert (process.pid, process.memory_bytes) == (10, None)
    assert process.utilization == pytest.approx(0.4)
    assert result.field_errors == 0
