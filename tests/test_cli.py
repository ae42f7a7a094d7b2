"""Flags, environment variables, and one-line errors with exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from exporter.cli import UsageError, duration, env_name, listen_address, parse_config
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


@pytest.mark.parametrize(
    "args",
    [
        ["--collect-interval", "abc"],
        ["--web.listen-address", "nope"],
        ["--log.level", "loud"],
        ["--no-such-flag"],
        ["--collect-interval", "1s", "--collect-timeout", "5s"],
        ["simulate", "no-such-scenario"],
    ],
)
def test_bad_input_exits_2_with_one_line(args: list[str]) -> None:
    done = run_cli(*args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("kube-device-exporter: error: ")
    assert done.stdout == ""


def test_bad_environment_value_names_the_variable() -> None:
    done = run_cli(env={"KDE_COLLECT_INTERVAL": "soon", "PATH": "/usr/bin"})
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "kube-device-exporter: error: environment variable KDE_COLLECT_INTERVAL: "
        "expected a duration like 10s, 500ms or 1m, got 'soon'"
    )


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
    assert config.podresources_max_message_bytes >= 64 * 1024 * 1024
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
    ("text", "seconds"), [("10", 10.0), ("10s", 10.0), ("500ms", 0.5), ("2m", 120.0)]
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
