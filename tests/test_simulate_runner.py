"""`kde-simulate` as a newcomer runs it: a taken port, Ctrl-C, SIGTERM, a bad
scenario, no HTTP server. One line on failure; the work directory never stays behind."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.peer

BAD_SCENARIO = Path(__file__).parent / "data" / "bad-sysfs-scenario.yaml"


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A short temporary directory: the simulated kubelet's socket lives under TMPDIR, and
    pytest's own directories can exceed the 107 characters a unix socket path may have."""
    path = Path(tempfile.mkdtemp(prefix="kde-t-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def env_for(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KDE_", "LD_LIBRARY"))}
    return {**env, "TMPDIR": str(tmp_path)}


def leftovers(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.glob("kde-sim-*"))


def simulate(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "simulator", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_for(tmp_path),
    )  # fmt: skip


def wait_until_up(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "Press Ctrl-C to stop." in line:
            return "".join(seen)
    raise AssertionError(f"never came up: {''.join(seen)} {proc.communicate()[1]}")


def test_a_taken_port_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = simulate(tmp_path, "mixed", "--web.listen-address", f"127.0.0.1:{port}")
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    # Start-up logs may come first; the failure itself is one line, no traceback.
    (line,) = [x for x in err.splitlines() if "ERROR" in x or not x.startswith("20")]
    assert f"cannot start: --web.listen-address 127.0.0.1:{port}: port {port} is in use" in line, (
        err
    )
    assert "Traceback" not in err and "never awaited" not in err and "closed" not in err
    assert out == "" and leftovers(tmp_path) == []


@pytest.mark.parametrize(("scenario", "sig"), [("demo", signal.SIGTERM), ("mixed", signal.SIGINT)])
def test_stopping_removes_the_work_directory(
    tmp_path: Path, scenario: str, sig: signal.Signals
) -> None:
    """demo starts again with the simulated NVML library's path (execve): the new process
    owns the directory the first one made."""
    proc = simulate(tmp_path, scenario, "--web.listen-address", "127.0.0.1:0")
    try:
        banner = wait_until_up(proc)
        assert len(leftovers(tmp_path)) == 1
    finally:
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Landing page: http://127.0.0.1:" in banner
    assert leftovers(tmp_path) == [], err


def test_a_socket_path_too_long_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    proc = simulate(deep, "mixed", "--web.listen-address", "127.0.0.1:0")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    (line,) = err.strip().splitlines()
    assert "longer than 107 characters: set TMPDIR or KDE_SIMULATE_WORKDIR" in line
    assert leftovers(deep) == []


def test_a_bad_scenario_leaves_nothing(tmp_path: Path) -> None:
    proc = simulate(tmp_path, str(BAD_SCENARIO))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("kde-simulate: error: ")
    assert leftovers(tmp_path) == []


KDE_SIMULATE = Path(sys.executable).parent / "kde-simulate"
"""The command the development install (simulator/pyproject.toml) puts beside python."""


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["no-such-scenario"], "no-such-scenario"),
        (["demo", "--collect-interval", "abc"], "--collect-interval"),
        (["demo", "--no-such-flag"], "--no-such-flag"),
    ],
)
def test_the_installed_command_says_a_bad_input_in_one_line(
    tmp_path: Path, args: list[str], says: str
) -> None:
    done = subprocess.run(
        [str(KDE_SIMULATE), *args],
        capture_output=True, text=True, timeout=60, env=env_for(tmp_path), check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("kde-simulate: error: ") and says in line
    assert done.stdout == "" and leftovers(tmp_path) == []


def test_the_installed_command_prints_its_usage() -> None:
    done = subprocess.run(
        [str(KDE_SIMULATE), "--help"], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.startswith("usage: kde-simulate SCENARIO [--node-only | EXPORTER FLAGS...]")
    assert "bundled: demo, dense, dgx, dra, mixed, numa" in done.stdout


def test_no_http_server_says_so_in_the_banner(tmp_path: Path) -> None:
    # No server needs somewhere to publish: an OTLP endpoint (none answers; not read here).
    proc = simulate(tmp_path, "mixed", "--web.listen-address", "none",
                    "--otlp.endpoint", "http://127.0.0.1:9")  # fmt: skip
    try:
        banner = wait_until_up(proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert "No HTTP server (--web.listen-address none)" in banner
    assert "metrics" not in banner and "Landing page" not in banner


def test_the_demo_slice_short_job_frees_goes_idle_when_it_ends() -> None:
    """The freed MIG slice must not show "free · 90%" for ever: busy while short-job holds
    it, idle once the pod (and its process) ended."""
    from simulator.scenario import load_scenario
    from simulator.signals import parse_signal

    demo = load_scenario("demo")
    (job,) = [p for p in demo.pods if p.pod.name == "short-job"]
    (slice_id,) = job.pod.containers[0].devices[0].device_ids
    (mig,) = [
        m
        for gpu in demo.sections["nvidia"]["gpus"]
        for m in gpu.get("mig", [])
        if m["uuid"] == slice_id
    ]
    busy = parse_signal(mig["utilization"], "utilization")
    end = job.end
    assert end is not None
    assert [p["end"] for p in mig["processes"]] == [end]
    assert busy.value(0) == busy.value(end - 0.1) == 0.9
    assert busy.value(end + 0.1) == busy.value(3600) == 0.0


def test_the_demo_prints_the_doctor_command_that_reads_its_node(tmp_path: Path) -> None:
    """Issue 42, the first hour, item 3: `make demo`'s banner names the doctor command, with
    the node's paths and the NVML stand-in's environment; pasted into another shell while the
    demo runs, it finds no problem (without them it reported four)."""
    proc = simulate(tmp_path, "demo", "--web.listen-address", "127.0.0.1:0")
    try:
        banner = wait_until_up(proc)
        (line,) = [ln for ln in banner.splitlines() if ln.lstrip().startswith("Doctor:")]
        command = line.split("Doctor:", 1)[1].strip()
        doctor = subprocess.run(["sh", "-c", command], capture_output=True, text=True,
                                timeout=120, env=env_for(tmp_path), check=False)  # fmt: skip
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert " doctor --kubelet-socket " in command and "--web." not in command
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "PROBLEM" not in doctor.stdout and "OK       source nvml" in doctor.stdout
