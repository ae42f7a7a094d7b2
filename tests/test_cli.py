"""Flags, environment variables, and one-line errors with exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from exporter.cli.flags import parse_config
from exporter.cli.parser import UsageError, build_parser, env_name
from exporter.settings.values import boolean, duration, listen_address
from exporter.sources import SourceContext, SourceInfo, SourceOption


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exporter", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def fake_sources() -> dict[str, SourceInfo]:
    def factory(ctx: SourceContext) -> object:
        raise AssertionError("not built in CLI tests")

    return {
        "alpha": SourceInfo("alpha", "alpha devices", True, factory),  # type: ignore[arg-type]
        "beta": SourceInfo(
            "beta",
            "beta devices",
            False,
            factory,  # type: ignore[arg-type]
            (SourceOption("pool-config", "pool file"),),
        ),
    }


@pytest.mark.peer
@pytest.mark.parametrize(
    "args",
    [
        ["--collect-interval", "abc"],
        ["--web.listen-address", "nope"],
        ["--log.level", "loud"],
        ["--no-such-flag"],
        ["--collect-interval", "1s", "--collect-timeout", "5s"],
        # The simulated node is no command of the product's: `kde-simulate` (simulator/).
        ["simulate", "demo"],
    ],
)
def test_bad_input_exits_2_with_one_line(args: list[str]) -> None:
    done = run_cli(*args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("kube-device-exporter: error: ")
    assert done.stdout == ""


@pytest.mark.peer
def test_bad_environment_value_names_the_variable() -> None:
    done = run_cli(env={"KDE_COLLECT_INTERVAL": "soon", "PATH": "/usr/bin"})
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "kube-device-exporter: error: environment variable KDE_COLLECT_INTERVAL: "
        "expected a duration like 10s, 1m30s or 500ms (Prometheus's format: units y, w, d, h, "
        "m, s, ms), largest unit first, got 'soon'"
    )


@pytest.mark.peer
def test_help_lists_every_flag_with_its_variable() -> None:
    done = run_cli("--help")
    assert done.returncode == 0
    for flag in (
        "--kubelet-socket",
        "--web.listen-address",
        "--collect-interval",
        "--node-name",
        "--path.sysfs",
        "--path.procfs",
        "--log.level",
        "--log.format",
        "--kubernetes.resource-pattern",
        "--otlp.endpoint",
    ):
        assert flag in done.stdout
        assert env_name(flag) in done.stdout


def test_collector_flags_come_from_the_registry() -> None:
    config = parse_config([], env={}, sources=fake_sources())
    assert config.collectors == {"alpha"}
    config = parse_config(
        ["--no-collector.alpha", "--collector.beta"], env={}, sources=fake_sources()
    )
    assert config.collectors == {"beta"}
    config = parse_config(
        [],
        env={"KDE_COLLECTOR_BETA": "true", "KDE_COLLECTOR_BETA_POOL_CONFIG": "/etc/p.json"},
        sources=fake_sources(),
    )
    assert config.collectors == {"alpha", "beta"}
    assert config.source_options["beta"] == {"pool-config": "/etc/p.json"}


def test_flags_win_over_environment() -> None:
    env = {"KDE_WEB_LISTEN_ADDRESS": ":1111", "KDE_KUBELET_SOCKET": "/env.sock", "NODE_NAME": "n7"}
    config = parse_config(["--web.listen-address", "127.0.0.1:2222"], env=env, sources={})
    assert config.listen_address == ("127.0.0.1", 2222)
    assert config.kubelet_socket == Path("/env.sock")
    assert config.node_name == "n7"


def test_defaults() -> None:
    config = parse_config([], env={"NODE_NAME": "gpu-node-3"}, sources={})
    assert config.kubelet_socket == Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    assert config.listen_address == ("", 9405)
    assert config.collect_interval == 10.0
    assert config.node_name == "gpu-node-3"
    assert "nvidia.com/*" in config.resource_patterns
    # above gRPC's 4 MiB default and the 4.75 MB List of dcgm-exporter #509, below what the
    # kit's memory limit holds (tests/test_series_budget.py)
    assert 4_753_177 < config.podresources_max_message_bytes <= 8 * 1024 * 1024
    assert config.otlp.endpoint == ""


def test_resource_patterns_replace_the_defaults() -> None:
    config = parse_config(
        ["--kubernetes.resource-pattern", "example.com/*", "--kubernetes.resource-pattern", "x/y"],
        env={},
        sources={},
    )
    assert config.resource_patterns == ("example.com/*", "x/y")
    config = parse_config([], env={"KDE_KUBERNETES_RESOURCE_PATTERN": "a/*, b/c"}, sources={})
    assert config.resource_patterns == ("a/*", "b/c")


def test_otlp_from_standard_variables() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
    }
    config = parse_config([], env=env, sources={})
    assert (config.otlp.endpoint, config.otlp.protocol) == ("http://c:4317", "http/protobuf")


@pytest.mark.parametrize(
    ("text", "seconds"), [("10s", 10.0), ("500ms", 0.5), ("2m", 120.0), ("1h30m", 5400.0)]
)
def test_durations(text: str, seconds: float) -> None:
    assert duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "address"),
    [
        (":9405", ("", 9405)),
        ("0.0.0.0:1", ("0.0.0.0", 1)),
        ("[::]:9405", ("::", 9405)),
        ("none", None),
    ],
)
def test_listen_addresses(text: str, address: tuple[str, int] | None) -> None:
    assert listen_address(text) == address


def test_usage_error_is_raised_not_printed() -> None:
    with pytest.raises(UsageError, match="--collect-interval"):
        parse_config(["--collect-interval", "-1"], env={}, sources={})


# --- the first hour: bad input a newcomer or an operator types ------------------------------


@pytest.mark.peer
@pytest.mark.parametrize(
    ("args", "env", "names"),
    [
        (["--collector.nvml.processes", "maybe"], {}, "--collector.nvml.processes"),
        (["--collector.nvml.rediscover-interval", "banana"], {}, "rediscover-interval"),
        (["--collector.netdev.vf-netlink", "nah"], {}, "--collector.netdev.vf-netlink"),
        ([], {"KDE_COLLECTOR_NVML_XID_EVENTS": "perhaps"}, "KDE_COLLECTOR_NVML_XID_EVENTS"),
        (["--kubernetes.resource-pattern", ""], {}, "--kubernetes.resource-pattern"),
        (["--kubernetes.resource-pattern", " , "], {}, "--kubernetes.resource-pattern"),
        (["--otlp.protocol", "http/json"], {}, "--otlp.protocol"),
        (
            [],
            {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"},
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ),
        (["doctor", "--collect-interval", "soon"], {}, "--collect-interval"),
    ],
)
def test_bad_input_is_one_line_naming_the_flag(
    args: list[str], env: dict[str, str], names: str
) -> None:
    done = run_cli(*args, env={"PATH": "/usr/bin", **env})
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("kube-device-exporter: error: ") and names in line, line
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_otel_protocol_we_do_not_speak_is_ignored_when_push_is_off() -> None:
    config = parse_config([], env={"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, sources={})
    assert (config.otlp.endpoint, config.otlp.protocol) == ("", "grpc")
    with pytest.raises(UsageError, match="OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"):
        parse_config(
            ["--otlp.endpoint", "http://c:4318"],
            env={"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/json"},
            sources={},
        )
    # An explicit flag wins over the cluster-wide variable.
    config = parse_config(
        ["--otlp.endpoint", "http://c:4318", "--otlp.protocol", "http/protobuf"],
        env={"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
        sources={},
    )
    assert config.otlp.protocol == "http/protobuf"


def test_the_flag_takes_the_variables_comma_form() -> None:
    config = parse_config(
        [
            "--kubernetes.resource-pattern",
            "nvidia.com/*,amd.com/*",
            "--kubernetes.resource-pattern",
            "x/y",
        ],
        env={},
        sources={},
    )
    assert config.resource_patterns == ("nvidia.com/*", "amd.com/*", "x/y")


def test_source_options_are_typed_and_parsed_with_the_other_flags() -> None:
    def factory(ctx: SourceContext) -> object:
        raise AssertionError("not built in CLI tests")

    sources = {
        "gamma": SourceInfo(
            "gamma",
            "gamma devices",
            True,
            factory,  # type: ignore[arg-type]
            (
                SourceOption("every", "how often", "60s", duration),
                SourceOption("events", "count events", "true", boolean),
            ),
        )
    }
    config = parse_config(["--collector.gamma.every", "5m"], env={}, sources=sources)
    assert config.source_options["gamma"] == {"every": "5m", "events": "true"}
    with pytest.raises(UsageError, match=r"argument --collector.gamma.every: expected a duration"):
        parse_config(["--collector.gamma.every", "banana"], env={}, sources=sources)
    with pytest.raises(
        UsageError,
        match="KDE_COLLECTOR_GAMMA_EVENTS: expected true, false, yes, no, on, off, 1 or 0",
    ):
        parse_config([], env={"KDE_COLLECTOR_GAMMA_EVENTS": "nah"}, sources=sources)
    help_text = build_parser(sources).format_help()
    assert "--collector.gamma.every DURATION" in help_text
    assert "--collector.gamma.events BOOL" in help_text


@pytest.mark.peer
def test_help_names_the_commands_and_no_internal_names() -> None:
    done = run_cli("--help")
    assert done.returncode == 0
    for command in ("podresources", "doctor"):
        assert f"kube-device-exporter {command}" in done.stdout
    assert "simulate" not in done.stdout and "netlink-replay" not in done.stdout
    assert "(default ;" not in done.stdout and "(default unset" not in done.stdout
    for internal in ("PODRESOURCES_", "RESOURCE_PATTERNS", " LISTEN_ADDRESS", "VALUE"):
        assert internal not in done.stdout
    assert "--kubernetes.max-message-size SIZE" in done.stdout
    assert "--collector.nvml.processes BOOL" in done.stdout


@pytest.mark.peer
def test_a_missing_sysfs_is_said_at_start_naming_the_flag(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter", "--path.sysfs", str(tmp_path / "nonexistent"),
         "--web.listen-address", "127.0.0.1:0", "--no-collector.nvml",
         "--kubelet-socket", str(tmp_path / "k.sock")],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
    finally:
        proc.terminate()
        _, rest = proc.communicate(timeout=30)
    assert "WARNING" in line and f"--path.sysfs {tmp_path / 'nonexistent'}" in line, line
    assert "amdgpu, intel, netdev, rdma will see no devices" in line, rest


@pytest.mark.peer
def test_start_up_log_says_all_addresses_when_bound_to_all(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter", "--web.listen-address", ":0", "--no-collector.nvml",
         "--no-collector.amdgpu", "--no-collector.intel", "--no-collector.rdma",
         "--no-collector.netdev", "--kubelet-socket", str(tmp_path / "k.sock")],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        line = next(x for x in proc.stderr if "serving on" in x)
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert "serving on all addresses, port " in line, line
    assert "(here: http://127.0.0.1:" in line


def test_every_source_option_has_a_type_that_takes_its_default() -> None:
    """A new option left as free text would reach its source unchecked (the bug where
    `--collector.nvml.processes maybe` started with NVML off for good)."""
    from exporter.settings import values
    from exporter.sources import registry

    for info in registry().values():
        for option in info.options:
            where = f"--collector.{info.name}.{option.name}"
            if option.default:
                assert option.parse is not values.text, f"{where} has no value type"
            option.parse(option.default)  # the default must be valid for its own type
