"""Issue 31, items 1-8: every crash path a new user or an operator hits in the first hour.

Each ends in its exit code and one line naming what to change, never a traceback. The
commands run as a user runs them (`python -m exporter`, a subprocess); the paths that
happen inside a running exporter (a source option, the pod watcher, OTLP's start line)
are driven in-process and read from the log.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from exporter.checks import OK, PROBLEM, check_procfs
from exporter.cli.flags import parse_config
from exporter.cli.parser import UsageError
from exporter.kubeapi.client import NotConfigured, load_config
from exporter.kubeapi.listwatch import supervise
from exporter.podresources.client import PodResourcesClient, PodResourcesError
from exporter.settings.config import Config, OtlpConfig
from exporter.settings.values import duration
from exporter.sources.rdma import PoolConfig
from tests.support.kubeapi import fast
from tests.support.waiting import until

QUIET = ["--no-collector.netdev", "--no-collector.nvml", "--no-collector.amdgpu",
         "--no-collector.intel", "--no-collector.rdma"]  # fmt: skip
"""No hardware lines in the output: what is left is what the test is about."""


def run_exporter(
    args: Sequence[str], env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("KDE_", "OTEL_"))}
    return subprocess.run(
        [sys.executable, "-m", "exporter", *args],
        env={**clean, **(env or {})}, check=False, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def run_simulator(args: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The simulated node's command (`kde-simulate`, simulator/), as `make demo` runs it."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("KDE_", "OTEL_"))}
    return subprocess.run(
        [sys.executable, "-m", "simulator", *args],
        env=clean, check=False, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def one_error_line(proc: subprocess.CompletedProcess[str], code: int) -> str:
    """The exit code is `code`, stderr has no traceback and exactly one error line."""
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output, output
    assert proc.returncode == code, output
    errors = [x for x in proc.stderr.splitlines() if ": error: " in x or " ERROR " in x]
    assert len(errors) == 1, output
    return errors[0]


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


# --- 1. bad OTEL_* values: exit 2 before anything starts --------------------------------------


@pytest.mark.peer
@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("OTEL_METRIC_EXPORT_INTERVAL", "-1", "positive number of milliseconds"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd", "expected one of gzip, none"),
        ("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION", "zstd", "expected one of gzip, none"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "soon", "positive number of milliseconds"),
    ],
)
def test_a_bad_otel_value_is_one_line_and_exit_2(variable: str, value: str, says: str) -> None:
    proc = run_exporter(
        ["--web.listen-address", "127.0.0.1:0", *QUIET],
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", variable: value},
    )
    line = one_error_line(proc, 2)
    assert line.startswith(f"kube-device-exporter: error: environment variable {variable}: ")
    assert says in line and repr(value) in line
    assert proc.stderr.count("\n") == 1


def test_http_compression_allows_deflate_grpc_does_not() -> None:
    base = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
        "OTEL_EXPORTER_OTLP_COMPRESSION": "deflate",
    }
    config = parse_config(
        [], env={**base, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, sources={}
    )
    assert config.otlp.protocol == "http/protobuf"
    with pytest.raises(UsageError, match=r"OTEL_EXPORTER_OTLP_COMPRESSION: .* for OTLP grpc"):
        parse_config([], env=base, sources={})


def test_otel_values_do_not_matter_without_an_endpoint() -> None:
    """Set cluster-wide for other programs: only OTLP push reads them."""
    config = parse_config([], env={"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, sources={})
    assert config.otlp.endpoint == ""


# --- 2. a malformed kubeconfig ---------------------------------------------------------------


@pytest.mark.peer
def test_a_malformed_kubeconfig_is_one_line_and_exit_2(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nclusters: [\n")
    proc = run_exporter(
        ["--kubernetes.api", "--node-name", "n1", "--kubernetes.kubeconfig", str(kubeconfig),
         "--web.listen-address", "127.0.0.1:0", *QUIET],
    )  # fmt: skip
    line = one_error_line(proc, 2)
    assert f"--kubernetes.kubeconfig: no Kubernetes API configuration from {kubeconfig}" in line


@pytest.mark.parametrize("text", ["clusters: [\n", "apiVersion: v1\nclusters: 5\n", "- a\n- b\n"])
def test_every_malformed_kubeconfig_is_not_configured(tmp_path: Path, text: str) -> None:
    """The watcher retries NotConfigured; anything else used to end it at its first request."""
    (tmp_path / "kc").write_text(text)
    with pytest.raises(NotConfigured) as err:
        load_config(tmp_path / "kc")
    assert "\n" not in str(err.value)


async def test_a_watcher_that_dies_is_started_again_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No watcher stops while the process runs: a run that ends (an error its loop let
    through, or none) is started again on the back-off schedule, logged once per state with
    its traceback."""
    runs: list[float] = []
    stop = asyncio.Event()

    async def dies_twice(stop: asyncio.Event) -> None:
        runs.append(asyncio.get_running_loop().time())
        if len(runs) <= 2:
            raise RuntimeError("surprise\nsecond line")
        await stop.wait()

    with caplog.at_level(logging.WARNING, logger="exporter.kubeapi"):
        task = asyncio.create_task(supervise("the test watch", dies_twice, stop, fast()))
        await until(lambda: len(runs) == 3, what="the third run")
        stop.set()
        await task
    [record] = [r for r in caplog.records if "ended" in r.getMessage()]
    assert record.getMessage().startswith(
        "the test watch ended (RuntimeError: surprise); started again in "
    )
    assert record.exc_info is not None and record.exc_info[1] is not None


@pytest.mark.slow
async def test_a_watcher_that_dies_is_run_again_and_shutdown_stays_clean(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error the pod watcher's loop lets through (a bug) ends that run, not the watcher:
    it runs again after the back-off's first step (1 s), and `stop()` (SIGTERM) returns
    without re-raising it (a traceback and exit 1 before issue 14; a watcher dead until a
    restart before issue 41)."""
    from exporter.app import Exporter
    from exporter.kubeapi.watcher import PodWatcher

    runs = 0

    async def broken(self: PodWatcher, stop: asyncio.Event) -> None:
        nonlocal runs
        runs += 1
        raise RuntimeError("unexpected answer")

    monkeypatch.setattr(PodWatcher, "_watch_forever", broken)
    config = Config(
        kubelet_socket=tmp_path / "none.sock",
        listen_address=None,
        node_name="n1",
        kubernetes_api=True,
        kubeconfig=tmp_path / "kubeconfig",  # never read: the watch fails first
    )
    exporter = Exporter(config, sources={})
    with caplog.at_level(logging.WARNING, logger="exporter"):
        await exporter.start()
        await until(lambda: runs >= 2, timeout=5.0, what="the watcher run again")
        await exporter.stop()
    assert exporter._kubeapi_task is not None and exporter._kubeapi_task.done()
    ended = [r.getMessage() for r in caplog.records if " ended (" in r.getMessage()]
    assert ended == [
        f"the Kubernetes API pod watch ended (RuntimeError: unexpected answer); started again "
        f"in {ended[0].rsplit(' ', 1)[1]}"
    ]


# --- 3. a missing OTLP CA file ---------------------------------------------------------------


@pytest.mark.peer
def test_a_missing_otlp_certificate_is_one_line_and_exit_2(tmp_path: Path) -> None:
    missing = tmp_path / "ca.pem"
    proc = run_exporter(
        ["--web.listen-address", "127.0.0.1:0", *QUIET],
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": "https://127.0.0.1:4317",
             "OTEL_EXPORTER_OTLP_CERTIFICATE": str(missing)},
    )  # fmt: skip
    line = one_error_line(proc, 2)
    assert line.endswith(
        f"environment variable OTEL_EXPORTER_OTLP_CERTIFICATE: no such file '{missing}'"
    )


def test_the_metrics_certificate_variable_wins(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not checked here: the SDK reads it\n")
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c:4317",
           "OTEL_EXPORTER_OTLP_CERTIFICATE": str(tmp_path / "gone.pem"),
           "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE": str(ca)}  # fmt: skip
    assert parse_config([], env=env, sources={}).otlp.endpoint == "https://c:4317"


# --- 4. the listen address -------------------------------------------------------------------


@pytest.mark.peer
def test_a_port_in_use_names_the_flag(busy_port: int) -> None:
    proc = run_exporter(["--web.listen-address", f"127.0.0.1:{busy_port}", *QUIET])
    line = one_error_line(proc, 1)
    assert line.endswith(
        f"ERROR exporter: cannot start: --web.listen-address 127.0.0.1:{busy_port}: port "
        f"{busy_port} is in use by another process (another exporter?); pick another port, "
        "or stop the other process"
    )


@pytest.mark.peer
def test_an_unresolvable_host_names_the_flag() -> None:
    proc = run_exporter(["--web.listen-address", "no-such-host.invalid:9405", *QUIET])
    line = one_error_line(proc, 1)
    assert (
        "cannot start: --web.listen-address no-such-host.invalid:9405: cannot resolve the host"
        in line
    )


@pytest.mark.peer
def test_the_demo_on_a_port_in_use_names_the_flag(busy_port: int) -> None:
    """`make demo` runs `kde-simulate demo`: the same one line, then the Makefile's hint."""
    proc = run_simulator(["demo", "--web.listen-address", f"127.0.0.1:{busy_port}"])
    line = one_error_line(proc, 1)
    assert line.endswith(
        f"cannot start: --web.listen-address 127.0.0.1:{busy_port}: port {busy_port} is in use "
        "by another process (another exporter?); pick another port, or stop the other process"
    )


def test_make_demo_suggests_another_port() -> None:
    makefile = (Path(__file__).parent.parent / "Makefile").read_text()
    demo = makefile.split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    assert "make demo DEMO_ADDR=" in demo and "DEMO_ADDR ?= 127.0.0.1:9405" in makefile


# --- 5. one duration grammar: Prometheus's ----------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("10s", 10.0), ("1h30m", 5400.0), ("500ms", 0.5), ("1m1s", 61.0), ("2d", 172800.0),
     ("1w", 604800.0), ("1y", 31536000.0), ("1h0m5s", 3605.0), ("90s", 90.0)],
)  # fmt: skip
def test_prometheus_durations(text: str, seconds: float) -> None:
    assert duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("10", "add a unit, e.g. 10s"),
        ("-5s", "must be greater than zero"),
        ("0", "must be greater than zero"),
        ("0s", "must be greater than zero"),
        ("1.5s", "whole numbers only"),
        ("30m1h", "largest unit first"),
        ("1s1s", "largest unit first"),
        ("10 s", "expected a duration"),
        ("1H", "expected a duration"),
        ("", "expected a duration"),
    ],
)
def test_what_prometheus_refuses_is_refused(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        duration(text)


@pytest.mark.peer
@pytest.mark.parametrize(
    ("value", "says"),
    [("-5s", "must be greater than zero, got '-5s'"), ("10", "add a unit, e.g. 10s")],
)
def test_a_bad_interval_flag_is_one_line_and_exit_2(value: str, says: str) -> None:
    proc = run_exporter(["--collect-interval", value])
    line = one_error_line(proc, 2)
    assert line.startswith("kube-device-exporter: error: argument --collect-interval: ")
    assert says in line


def test_the_same_grammar_in_variables_and_source_options() -> None:
    config = parse_config([], env={"KDE_COLLECT_INTERVAL": "1h30m"}, sources={})
    assert config.collect_interval == 5400.0
    with pytest.raises(UsageError, match=r"KDE_KUBERNETES_STALE_AFTER: .*add a unit"):
        parse_config([], env={"KDE_KUBERNETES_STALE_AFTER": "300"}, sources={})
    with pytest.raises(UsageError, match=r"--collector.nvml.restart-after: .*largest unit first"):
        parse_config(["--collector.nvml.restart-after", "30s2m"], env={})


# --- 6. what used to be silent ----------------------------------------------------------------


def test_a_misspelt_variable_is_named_with_the_likely_one() -> None:
    config = parse_config([], env={"KDE_COLECT_INTERVAL": "5s", "KDE_E2E_KUBELET": "/k"})
    assert config.notices == (
        "environment variable KDE_COLECT_INTERVAL is not a flag's and is ignored "
        "(did you mean KDE_COLLECT_INTERVAL?)",
    )
    assert config.collect_interval == 10.0


@pytest.mark.peer
def test_doctor_names_a_misspelt_variable(tmp_path: Path) -> None:
    proc = run_exporter(
        ["doctor", "--kubelet-socket", str(tmp_path / "none.sock"), *QUIET],
        env={"KDE_COLLECTOR_NVML_RESTART_AFTR": "5m"},
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr
    assert (
        "PROBLEM  environment       environment variable KDE_COLLECTOR_NVML_RESTART_AFTR is not "
        "a flag's and is ignored (did you mean KDE_COLLECTOR_NVML_RESTART_AFTER?)"
    ) in proc.stdout


@pytest.mark.peer
def test_the_exporter_logs_a_misspelt_variable_at_start() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter", "--web.listen-address", "127.0.0.1:0", *QUIET],
        env={**os.environ, "KDE_WEB_LISTEN_ADRESS": ":1"},
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    try:
        first = proc.stderr.readline()
        assert first.rstrip().endswith(
            "WARNING exporter: environment variable KDE_WEB_LISTEN_ADRESS is not a flag's and "
            "is ignored (did you mean KDE_WEB_LISTEN_ADDRESS?)"
        )
        while "serving on" not in (line := proc.stderr.readline()):  # SIGTERM is handled now
            assert line, "the exporter ended before serving"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("configList:\n  - resourceName: [\n", "line 3 column 1: expected the node content"),
        ("configList:\n  - {resourcePrefix: x}\n", "configList[0]: no resourceName"),
        ("configList:\n  - {resourceName: a}\n  - 7\n", "configList[1]: not a mapping"),
        ("pools: []\n", "no configList (a list of pools) at the top"),
    ],
)
def test_a_broken_pool_config_is_one_line_naming_file_and_field(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str, says: str
) -> None:
    path = tmp_path / "config.json"
    path.write_text(text)
    with caplog.at_level(logging.WARNING, logger="exporter.sources.rdma"):
        assert not PoolConfig(str(path)).refresh()
    [record] = caplog.records
    message = record.getMessage()
    assert "\n" not in message
    assert message.startswith(f"RDMA pool config {path} unusable: {says}"), message


# --- 7. a socket that is not a socket; doctor's procfs -----------------------------------------


async def test_a_regular_file_is_not_a_socket(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.sock"
    path.write_text("")
    client = PodResourcesClient(path)
    try:
        with pytest.raises(PodResourcesError) as err:
            await client.poll()
    finally:
        await client.close()
    assert str(err.value) == f"NO_SOCKET: kubelet socket {path} is not a socket (a regular file)"


@pytest.mark.peer
def test_doctor_says_not_a_socket(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.sock"
    path.mkdir()  # what a hostPath mount of a socket not yet there leaves behind
    proc = run_exporter(["doctor", "--kubelet-socket", str(path), *QUIET])
    assert proc.returncode == 1 and "Traceback" not in proc.stderr + proc.stdout
    [line] = [x for x in proc.stdout.splitlines() if x.startswith("PROBLEM  kubelet")]
    assert line.endswith(f"kubelet socket {path} is not a socket (a directory)")
    assert "stale socket" not in proc.stdout
    assert f"likely cause: {path} is there but is not a socket" in proc.stdout


def test_doctor_does_not_call_an_unreadable_pid_1_ok(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()  # no comm: unreadable, as under hidepid
    (tmp_path / "42").mkdir()
    finding = check_procfs(tmp_path)
    assert finding.status == PROBLEM
    assert "PID 1 is unreadable (No such file or directory)" in finding.found
    (tmp_path / "1" / "comm").write_text("systemd\n")
    assert check_procfs(tmp_path).status == OK


# --- 8. the start lines -----------------------------------------------------------------------


def test_the_otlp_start_line_says_the_interval_and_the_timeout_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from exporter.sinks.otlp import OtlpSink

    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "2500")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "soon")  # in-process: no parse_config
    sink = OtlpSink(Config(node_name="n", otlp=OtlpConfig("http://127.0.0.1:9", "grpc")))
    with caplog.at_level(logging.INFO, logger="exporter.otlp"):
        sink.start()
    try:
        lines = [r.getMessage() for r in caplog.records if r.name == "exporter.otlp"]
        assert (
            lines.count(
                "OTEL_EXPORTER_OTLP_TIMEOUT='soon' is not a positive number of milliseconds; ignored"
            )
            == 1
        )
        assert (
            "pushing OTLP (grpc) to http://127.0.0.1:9 every 2.5s (OTEL_METRIC_EXPORT_INTERVAL), "
            "export timeout 10s"
        ) in lines
    finally:
        sink.shutdown()


# --- 13. `help` --------------------------------------------------------------------------------


@pytest.mark.peer
@pytest.mark.parametrize(
    ("args", "usage"),
    [
        (["help"], "usage: kube-device-exporter [-h]"),
        (["help", "doctor"], "usage: kube-device-exporter doctor [-h]"),
        (["help", "podresources"], "usage: kube-device-exporter podresources [-h]"),
    ],
)
def test_help_is_a_command(args: list[str], usage: str) -> None:
    proc = run_exporter(args)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.startswith(usage)
    if args == ["help"]:
        assert "kube-device-exporter help [COMMAND]" in proc.stdout
