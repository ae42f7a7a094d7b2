"""Flags and variables -> frozen Config: the parser every command shares.

Each flag is also `KDE_<NAME>` in the environment (a flag wins); a bad value raises
UsageError with one line naming the flag or variable, which the commands turn into exit 2.
`cli.py` dispatches the commands; `flagdoc.py` writes the README's table from `_FLAGS`.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from exporter import __version__
from exporter.config import DEFAULT_SOCKET, Config, OtlpConfig
from exporter.join import DEFAULT_RESOURCE_PATTERNS
from exporter.metrics import SCHEMAS
from exporter.sources import SourceInfo, registry
from exporter.values import (
    METAVARS,
    boolean,
    choice,
    choices,
    duration,
    positive_int,
    regex,
    size_bytes,
)

PROG = "kube-device-exporter"
ENV_PREFIX = "KDE_"
OTLP_PROTOCOLS = ("grpc", "http/protobuf")

MIN_COLLECT_INTERVAL = 1.0
"""Each cycle makes one PodResources List; the kubelet allows 100 calls/s (burst 10) for all
its clients together, so one exporter keeps to 1% of that (`simulate`, whose kubelet is ours,
goes lower)."""


class UsageError(Exception):
    """Raised by parsers instead of printing; main() turns it into one line and exit 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


# --- value types (their ValueError text is what the user reads) ---------------------------


def listen_address(text: str) -> tuple[str, int] | None:
    """`HOST:PORT`, `:PORT`, `[::]:PORT`; `none` disables the HTTP server."""
    if text.strip().lower() == "none":
        return None
    m = re.fullmatch(r"(?:\[(?P<v6>[0-9a-fA-F:.]+)\]|(?P<host>[^:\[\]]*)):(?P<port>\d{1,5})", text)
    if not m or not 0 <= int(m["port"]) < 65536:
        raise ValueError(f"expected HOST:PORT (e.g. :9405, 0.0.0.0:9405, [::]:9405), got {text!r}")
    return (m["v6"] or m["host"] or "", int(m["port"]))


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
        "kubeapi",
        "--kubernetes.api",
        "kubernetes_api",
        boolean,
        "off",
        "watch this node's pods on the API server for pod UIDs, workloads and allowed labels "
        "(k8s_pod_workload_info); needs the kubernetes-api RBAC (deploy/components/kubernetes-api)",
    ),
    (
        "kubeapi",
        "--kubernetes.kubeconfig",
        "kubeconfig",
        Path,
        "in-cluster: the pod's ServiceAccount",
        "kubeconfig for --kubernetes.api (development outside a cluster)",
    ),
    (
        "kubeapi",
        "--kubernetes.pod-labels",
        "pod_label_patterns",
        regex,
        "none",
        "pod label keys to export as k8s_pod_label_<key>: a regex matching the whole key "
        "(repeatable; the environment variable holds one regex)",
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
        "web",
        "--web.config.file",
        "web_config_file",
        Path,
        "none",
        "exporter-toolkit web config: TLS (tls_server_config), basic auth (basic_auth_users), "
        "headers; re-read when it changes (docs/security.md)",
    ),
    (
        "web",
        "--web.max-connections",
        "web_max_connections",
        positive_int,
        "512",
        "open HTTP connections at most; at the cap the longest-idle one is closed",
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
        "collection",
        "--metrics.schema",
        "metrics_schema",
        choices(*SCHEMAS),
        "native",
        "metric names and labels on /metrics: native (OpenTelemetry-derived), dcgm "
        "(dcgm-exporter's DCGM_FI_* names, units and labels), or native,dcgm while migrating "
        "(docs/migrating-from-dcgm-exporter.md); OTLP always sends native",
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
        choice(*OTLP_PROTOCOLS),
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
    "kubeapi": "Kubernetes API (optional)",
    "web": "web",
    "collection": "collection",
    "collectors": "collectors (sources)",
    "otlp": "OTLP push (also the standard OTEL_* variables)",
    "logging": "logging",
}


_METAVARS = {
    "kubelet_socket": "PATH",
    "resource_patterns": "GLOB[,GLOB...]",
    "listen_address": "HOST:PORT",
    "node_name": "NAME",
    "sysfs": "PATH",
    "procfs": "PATH",
    "container_logs": "PATH",
    "web_config_file": "FILE",
    "kubeconfig": "FILE",
    "pod_label_patterns": "REGEX",
    "otlp_endpoint": "URL",
    "otlp_protocol": "grpc|http/protobuf",
    "log_level": "debug|info|warning|error",
    "log_format": "text|json",
    "metrics_schema": "native|dcgm|native,dcgm",
}
"""What --help shows in place of a value; otherwise the value type's METAVARS entry."""

COMMANDS = (
    ("simulate SCENARIO [FLAGS]", "run a simulated node and the exporter on it (the demo)"),
    ("podresources [--pod NS/NAME]", "print what the kubelet reports: device IDs, resources"),
    ("doctor [FLAGS]", "why are my metrics missing? checks the kubelet, each source, /proc"),
)


DOCTOR = (
    "Why are my metrics missing? Asks the kubelet once, runs each enabled source once, looks "
    "at the host /sys and /proc, and compares what the node advertises with what the sources "
    "see: one line per check, the likely cause and the fix for each problem; exit 1 when "
    "there is one. Run it in the exporter's pod with the exporter's flags."
)


def _metavar(dest: str, parse: Callable[[str], Any]) -> str:
    return _METAVARS.get(dest) or METAVARS.get(getattr(parse, "__name__", ""), "VALUE")


def _default_note(default: str, flag: str) -> str:
    return f"(default {default}; env {env_name(flag)})" if default else f"(env {env_name(flag)})"


def build_parser(
    sources: dict[str, SourceInfo] | None = None, prog: str = PROG, description: str = ""
) -> Parser:
    sources = registry() if sources is None else sources
    commands = "\n".join(f"  {PROG} {usage}\n      {what}" for usage, what in COMMANDS)
    parser = Parser(
        prog=prog,
        description=textwrap.fill(
            (description or "Which pod uses which GPU, accelerator or NIC, and how hard.")
            + " Every flag can also be set as KDE_<FLAG> in the environment"
            " (--web.listen-address -> KDE_WEB_LISTEN_ADDRESS); flags win. A bad value exits 2"
            " naming the flag.",
            width=79,
        ),
        epilog=f"other commands:\n{commands}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    groups = {k: parser.add_argument_group(v) for k, v in _GROUP_TITLES.items()}
    for group, flag, dest, parse, default, help_ in _FLAGS:
        kwargs: dict[str, Any] = {
            "dest": dest,
            "type": _typed(parse),
            "metavar": _metavar(dest, parse),
        }
        # Absent unless given: a flag whose value parses to None (`--web.listen-address none`)
        # must still win over the environment and the default.
        kwargs["default"] = argparse.SUPPRESS
        if dest in ("resource_patterns", "pod_label_patterns"):
            kwargs["action"] = "append"
        if parse is boolean:  # `--kubernetes.api` alone means on
            kwargs["nargs"] = "?"
            kwargs["const"] = True
        groups[group].add_argument(flag, help=f"{help_} {_default_note(default, flag)}", **kwargs)
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
                type=_typed(_validated(option.parse)),
                metavar=_metavar("", option.parse),
                help=f"{option.help} {_default_note(option.default, oflag)}",
            )
    return parser


def _validated(parse: Callable[[str], object]) -> Callable[[str], str]:
    """A source option's check: the source gets the text, but only text its type accepts."""

    def check(text: str) -> str:
        parse(text)
        return text

    check.__name__ = getattr(parse, "__name__", "check")
    return check


def split_patterns(text: str) -> list[str]:
    """`nvidia.com/*,amd.com/*` -> both; blanks dropped (the variable's comma form)."""
    return [p.strip() for p in text.split(",") if p.strip()]


def parse_config(
    argv: Sequence[str],
    env: dict[str, str] | None = None,
    sources: dict[str, SourceInfo] | None = None,
    prog: str = PROG,
    description: str = "",
    *,
    min_collect_interval: float = MIN_COLLECT_INTERVAL,
) -> Config:
    """Flags, then `KDE_*` variables, then defaults -> Config. Raises UsageError."""
    env = dict(os.environ) if env is None else env
    sources = registry() if sources is None else sources
    args = build_parser(sources, prog, description).parse_args(list(argv))

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
            parse = split_patterns
        if dest == "pod_label_patterns":
            parse = lambda text: [regex(text)] if text else []  # noqa: E731
        return pick(flag, dest, parse, default)

    collectors = set()
    options: dict[str, dict[str, str]] = {}
    for info in sources.values():
        flag = f"--collector.{info.name}"
        if pick(flag, f"collector_{info.name}", boolean, info.default_enabled):
            collectors.add(info.name)
        options[info.name] = {
            o.name: pick(
                f"{flag}.{o.name}", f"option_{info.name}_{o.name}", _validated(o.parse), o.default
            )
            for o in info.options
        }

    endpoint = get("otlp_endpoint", None)
    signal_endpoint = False
    if endpoint is None and env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
        endpoint, signal_endpoint = env["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"], True
    if endpoint is None:
        endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
    protocol = get("otlp_protocol", None) or _otel_protocol(env, push=bool(endpoint))
    if endpoint and protocol == "http/protobuf" and not re.match(r"https?://", endpoint):
        raise UsageError(
            f"--otlp.endpoint: OTLP/HTTP needs an http:// or https:// URL, got {endpoint!r}"
        )
    interval = get("collect_interval", 10.0)
    if interval < min_collect_interval:
        raise UsageError(
            f"--collect-interval: {interval:g}s is below the minimum {min_collect_interval:g}s "
            "(each cycle calls the kubelet's PodResources List, rate-limited to 100/s for all "
            "its clients together)"
        )
    timeout = get("collect_timeout", min(5.0, interval))
    if timeout > interval:
        raise UsageError(
            f"--collect-timeout ({timeout:g}s) must not exceed --collect-interval ({interval:g}s)"
        )
    given_patterns = get("resource_patterns", list(DEFAULT_RESOURCE_PATTERNS))
    # The flag accepts the variable's comma form too; each occurrence may hold several.
    patterns = tuple(p for item in given_patterns for p in split_patterns(item))
    if not patterns:
        raise UsageError(
            "--kubernetes.resource-pattern: at least one pattern is needed, like nvidia.com/* "
            f"(got {','.join(given_patterns)!r})"
        )
    kubernetes_api = get("kubernetes_api", False)
    node_name = get("node_name", "") or env.get("NODE_NAME", "")
    if kubernetes_api and not node_name:
        raise UsageError(
            "--kubernetes.api needs --node-name or NODE_NAME (the downward API's spec.nodeName): "
            "the hostname of a pod is the pod's name"
        )
    return Config(
        kubelet_socket=get("kubelet_socket", DEFAULT_SOCKET),
        listen_address=get("listen_address", ("", 9405)),
        collect_interval=interval,
        collect_timeout=timeout,
        node_name=node_name or socket.gethostname(),
        sysfs=get("sysfs", Path("/sys")),
        procfs=get("procfs", Path("/proc")),
        container_logs=get("container_logs", Path("/var/log/containers")),
        process_series=get("process_series", False),
        metrics_schema=get("metrics_schema", ("native",)),
        log_level=get("log_level", "info"),
        log_format=get("log_format", "text"),
        collectors=frozenset(collectors),
        source_options=options,
        resource_patterns=patterns,
        podresources_timeout=get("podresources_timeout", 5.0),
        podresources_max_message_bytes=get("podresources_max_message_bytes", 256 * 1024**2),
        podresources_stale_after=get("podresources_stale_after", 300.0),
        otlp=OtlpConfig(endpoint=endpoint, protocol=protocol, signal_endpoint=signal_endpoint),
        web_config_file=_web_config(get("web_config_file", None)),
        web_max_connections=get("web_max_connections", 512),
        kubernetes_api=kubernetes_api,
        kubeconfig=get("kubeconfig", None),
        pod_label_patterns=tuple(get("pod_label_patterns", [])),
    )


def _otel_protocol(env: dict[str, str], *, push: bool) -> str:
    """The standard OTEL_* protocol variable. It is often set cluster-wide, to values we do
    not speak (http/json): that only matters when this exporter pushes."""
    name = "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"
    if name not in env:
        name = "OTEL_EXPORTER_OTLP_PROTOCOL"
    try:
        return choice(*OTLP_PROTOCOLS)(env.get(name, "grpc"))
    except ValueError as exc:
        if push:
            raise UsageError(
                f"environment variable {name}: {exc} (OTLP push speaks grpc and "
                "http/protobuf; set --otlp.protocol)"
            ) from exc
        return "grpc"


def _web_config(path: Path | None) -> Path | None:
    """Checked now, so a bad file stops the start with one line (exit 2), not a traceback."""
    if path is None or str(path).lower() in ("", "none"):
        return None
    from exporter.webconfig import WebConfigError, load_web_config

    try:
        load_web_config(path)
    except WebConfigError as exc:
        raise UsageError(f"--web.config.file {path}: {exc}") from exc
    return path


def usage_error(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2
