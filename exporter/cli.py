"""Command line: flags (each also from `KDE_<NAME>` in the environment) -> frozen Config.

    kube-device-exporter [FLAGS]                   run the exporter
    kube-device-exporter simulate SCENARIO [FLAGS] run a simulated node and the exporter on it
    kube-device-exporter podresources [--pod NS/NAME] [FLAGS]
                                                   print what the kubelet reports (debugging)

A bad value exits 2 with one line naming the flag or variable.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from exporter import __version__
from exporter.config import DEFAULT_SOCKET, Config, OtlpConfig
from exporter.join import DEFAULT_RESOURCE_PATTERNS
from exporter.sources import SourceInfo, registry

PROG = "kube-device-exporter"
ENV_PREFIX = "KDE_"


class UsageError(Exception):
    """Raised by parsers instead of printing; main() turns it into one line and exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


# --- value types (their ValueError text is what the user reads) ---------------------------


def duration(text: str) -> float:
    """`10`, `10s`, `500ms`, `1m` -> seconds (> 0)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", text)
    if not m:
        raise ValueError(f"expected a duration like 10s, 500ms or 1m, got {text!r}")
    value = float(m[1]) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m[2]]
    if value <= 0:
        raise ValueError(f"must be greater than zero, got {text!r}")
    return value


def listen_address(text: str) -> tuple[str, int] | None:
    """`HOST:PORT`, `:PORT`, `[::]:PORT`; `none` disables the HTTP server."""
    if text.strip().lower() == "none":
        return None
    m = re.fullmatch(r"(?:\[(?P<v6>[0-9a-fA-F:.]+)\]|(?P<host>[^:\[\]]*)):(?P<port>\d{1,5})", text)
    if not m or not 0 <= int(m["port"]) < 65536:
        raise ValueError(f"expected HOST:PORT (e.g. :9405, 0.0.0.0:9405, [::]:9405), got {text!r}")
    return (m["v6"] or m["host"] or "", int(m["port"]))


def choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text.lower() not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}, got {text!r}")
        return text.lower()

    return parse


def boolean(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def size_bytes(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*(KiB|MiB|GiB|B)?\s*", text)
    if not m:
        raise ValueError(f"expected a size like 64MiB, got {text!r}")
    return int(m[1]) * {"KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "B": 1, None: 1}[m[2]]


def _typed(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """Wrap a parser so argparse reports our ValueError text."""

    def wrapped(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    wrapped.__name__ = parse.__name__
    return wrapped


# --- the flag table -----------------------------------------------------------------------


def env_name(flag: str) -> str:
    """`--web.listen-address` -> `KDE_WEB_LISTEN_ADDRESS`."""
    return ENV_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", flag.lstrip("-")).upper()


_FLAGS: list[tuple[str, str, str, Callable[[str], Any], str, str]] = [
    # (group, flag, dest, type, default text, help)
    (
        "kubelet",
        "--kubelet-socket",
        "kubelet_socket",
        Path,
        str(DEFAULT_SOCKET),
        "PodResources socket (mount its directory, not the file, so kubelet restarts are seen)",
    ),
    (
        "kubelet",
        "--kubernetes.resource-pattern",
        "resource_patterns",
        str,
        "",
        "extended-resource name pattern to attribute (glob; repeatable; replaces the defaults: "
        + ", ".join(DEFAULT_RESOURCE_PATTERNS)
        + ")",
    ),
    (
        "kubelet",
        "--kubernetes.timeout",
        "podresources_timeout",
        duration,
        "5s",
        "deadline of each PodResources call",
    ),
    (
        "kubelet",
        "--kubernetes.max-message-size",
        "podresources_max_message_bytes",
        size_bytes,
        "256MiB",
        "largest PodResources answer accepted (gRPC's default 4MiB breaks busy nodes)",
    ),
    (
        "kubelet",
        "--kubernetes.stale-after",
        "podresources_stale_after",
        duration,
        "5m",
        "keep the last good PodResources answer this long while the kubelet fails",
    ),
    (
        "web",
        "--web.listen-address",
        "listen_address",
        listen_address,
        ":9405",
        "HOST:PORT for /metrics, /healthz, /readyz and the landing page; 'none' for no server",
    ),
    (
        "collection",
        "--collect-interval",
        "collect_interval",
        duration,
        "10s",
        "how often to read devices and the kubelet (scrapes only read the last result)",
    ),
    (
        "collection",
        "--collect-timeout",
        "collect_timeout",
        duration,
        "5s",
        "a source slower than this is reported failed for the cycle",
    ),
    (
        "collection",
        "--node-name",
        "node_name",
        str,
        "$NODE_NAME",
        "node label value (set NODE_NAME from the downward API; the hostname of a pod is its name)",
    ),
    ("collection", "--path.sysfs", "sysfs", Path, "/sys", "sysfs mount point"),
    ("collection", "--path.procfs", "procfs", Path, "/proc", "procfs mount point"),
    (
        "collection",
        "--path.container-logs",
        "container_logs",
        Path,
        "/var/log/containers",
        "the kubelet's container-log symlinks: their names map container IDs to pods "
        "(process attribution; only the names are read)",
    ),
    (
        "collection",
        "--attribution.process-series",
        "process_series",
        boolean,
        "false",
        "also export one series per process (hw_gpu_process_*, bare host PIDs: one series per "
        "process, high cardinality)",
    ),
    (
        "otlp",
        "--otlp.endpoint",
        "otlp_endpoint",
        str,
        "$OTEL_EXPORTER_OTLP_ENDPOINT",
        "push metrics to this OTLP collector, a base URL (OTLP/HTTP appends /v1/metrics; "
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is used as given); empty: no push",
    ),
    (
        "otlp",
        "--otlp.protocol",
        "otlp_protocol",
        choice("grpc", "http/protobuf"),
        "$OTEL_EXPORTER_OTLP_PROTOCOL or grpc",
        "OTLP transport",
    ),
    (
        "logging",
        "--log.level",
        "log_level",
        choice("debug", "info", "warning", "error"),
        "info",
        "log level",
    ),
    ("logging", "--log.format", "log_format", choice("text", "json"), "text", "log format"),
]

_GROUP_TITLES = {
    "kubelet": "kubelet (PodResources)",
    "web": "web",
    "collection": "collection",
    "collectors": "collectors (sources)",
    "otlp": "OTLP push (also the standard OTEL_* variables)",
    "logging": "logging",
}


def build_parser(sources: dict[str, SourceInfo] | None = None) -> _Parser:
    sources = registry() if sources is None else sources
    parser = _Parser(
        prog=PROG,
        description="Which pod uses which GPU, accelerator or NIC, and how hard. Every flag can "
        "also be set as KDE_<FLAG> in the environment (--web.listen-address -> "
        "KDE_WEB_LISTEN_ADDRESS); flags win.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    groups = {k: parser.add_argument_group(v) for k, v in _GROUP_TITLES.items()}
    for group, flag, dest, parse, default, help_ in _FLAGS:
        kwargs: dict[str, Any] = {"dest": dest, "type": _typed(parse), "metavar": dest.upper()}
        # Absent unless given: a flag whose value parses to None (`--web.listen-address none`)
        # must still win over the environment and the default.
        kwargs["default"] = argparse.SUPPRESS
        if dest == "resource_patterns":
            kwargs["action"] = "append"
        groups[group].add_argument(
            flag, help=f"{help_} (default {default}; env {env_name(flag)})", **kwargs
        )
    for info in sources.values():
        flag = f"--collector.{info.name}"
        groups["collectors"].add_argument(
            flag,
            dest=f"collector_{info.name}",
            action=argparse.BooleanOptionalAction,
            help=f"{info.help} (default {'on' if info.default_enabled else 'off'}; "
            f"env {env_name(flag)})",
        )
        # BooleanOptionalAction spells the negative --no-collector.X: what node_exporter users type.
        for option in info.options:
            oflag = f"--collector.{info.name}.{option.name}"
            groups["collectors"].add_argument(
                oflag,
                dest=f"option_{info.name}_{option.name}",
                metavar="VALUE",
                help=f"{option.help} (default {option.default or 'unset'}; env {env_name(oflag)})",
            )
    return parser


def parse_config(
    argv: Sequence[str],
    env: dict[str, str] | None = None,
    sources: dict[str, SourceInfo] | None = None,
) -> Config:
    """Flags, then `KDE_*` variables, then defaults -> Config. Raises UsageError."""
    env = dict(os.environ) if env is None else env
    sources = registry() if sources is None else sources
    args = build_parser(sources).parse_args(list(argv))

    given = vars(args)
    flag_dests = {dest for _, _, dest, _, _, _ in _FLAGS}

    def pick(flag: str, dest: str, parse: Callable[[str], Any], default: Any) -> Any:
        if dest in flag_dests and dest in given:
            return given[dest]
        if given.get(dest) is not None:
            return given[dest]
        name = env_name(flag)
        if name in env:
            try:
                return parse(env[name])
            except ValueError as exc:
                raise UsageError(f"environment variable {name}: {exc}") from exc
        return default

    table = {dest: (flag, parse) for _, flag, dest, parse, _, _ in _FLAGS}

    def get(dest: str, default: Any) -> Any:
        flag, parse = table[dest]
        if dest == "resource_patterns":
            parse = lambda text: [p.strip() for p in text.split(",") if p.strip()]  # noqa: E731
        return pick(flag, dest, parse, default)

    collectors = set()
    options: dict[str, dict[str, str]] = {}
    for info in sources.values():
        flag = f"--collector.{info.name}"
        if pick(flag, f"collector_{info.name}", boolean, info.default_enabled):
            collectors.add(info.name)
        options[info.name] = {
            o.name: pick(f"{flag}.{o.name}", f"option_{info.name}_{o.name}", str, o.default)
            for o in info.options
        }

    protocol = get("otlp_protocol", None) or choice("grpc", "http/protobuf")(
        env.get(
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        )
    )
    endpoint = get("otlp_endpoint", None)
    signal_endpoint = False
    if endpoint is None and env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
        endpoint, signal_endpoint = env["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"], True
    if endpoint is None:
        endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
    if endpoint and protocol == "http/protobuf" and not re.match(r"https?://", endpoint):
        raise UsageError(
            f"--otlp.endpoint: OTLP/HTTP needs an http:// or https:// URL, got {endpoint!r}"
        )
    interval = get("collect_interval", 10.0)
    timeout = get("collect_timeout", min(5.0, interval))
    if timeout > interval:
        raise UsageError(
            f"--collect-timeout ({timeout:g}s) must not exceed --collect-interval ({interval:g}s)"
        )
    patterns = tuple(get("resource_patterns", list(DEFAULT_RESOURCE_PATTERNS)))
    if not patterns:
        raise UsageError("--kubernetes.resource-pattern: at least one pattern is needed")
    return Config(
        kubelet_socket=get("kubelet_socket", DEFAULT_SOCKET),
        listen_address=get("listen_address", ("", 9405)),
        collect_interval=interval,
        collect_timeout=timeout,
        node_name=get("node_name", "") or env.get("NODE_NAME", "") or socket.gethostname(),
        sysfs=get("sysfs", Path("/sys")),
        procfs=get("procfs", Path("/proc")),
        container_logs=get("container_logs", Path("/var/log/containers")),
        process_series=get("process_series", False),
        log_level=get("log_level", "info"),
        log_format=get("log_format", "text"),
        collectors=frozenset(collectors),
        source_options=options,
        resource_patterns=patterns,
        podresources_timeout=get("podresources_timeout", 5.0),
        podresources_max_message_bytes=get("podresources_max_message_bytes", 256 * 1024**2),
        podresources_stale_after=get("podresources_stale_after", 300.0),
        otlp=OtlpConfig(endpoint=endpoint, protocol=protocol, signal_endpoint=signal_endpoint),
    )


def usage_error(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["simulate"]:
            from exporter.simulate.runner import run_simulation

            return run_simulation(argv[1:])
        if argv[:1] == ["podresources"]:
            from exporter.podresources.inspect import run_inspect

            return run_inspect(argv[1:])
        config = parse_config(argv)
    except UsageError as exc:
        return usage_error(str(exc))
    from exporter.app import run

    return run(config)
