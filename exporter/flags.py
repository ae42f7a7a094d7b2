"""Flags and variables -> frozen Config: the parser every command shares.

Each flag is also `KDE_<NAME>` in the environment (a flag wins); a bad value raises
UsageError with one line naming the flag or variable, which the commands turn into exit 2.
The flags themselves are a table (`flagtable.py`), from which `flagdoc.py` also writes the
README's table; `cli.py` dispatches the commands.
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
from exporter.flagtable import COMMANDS, FLAG_METAVARS, FLAGS, GROUP_TITLES, OTLP_PROTOCOLS
from exporter.join import DEFAULT_RESOURCE_PATTERNS
from exporter.sources import SourceInfo, registry
from exporter.values import METAVARS, boolean, choice, regex

PROG = "kube-device-exporter"
ENV_PREFIX = "KDE_"

MIN_COLLECT_INTERVAL = 1.0
"""Each cycle makes one PodResources List; the kubelet allows 100 calls/s (burst 10) for all
its clients together, so one exporter keeps to 1% of that (`simulate`, whose kubelet is ours,
goes lower)."""


class UsageError(Exception):
    """Raised by parsers instead of printing; main() turns it into one line and exit 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _typed(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """Wrap a parser so argparse reports our ValueError text."""

    def wrapped(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    wrapped.__name__ = parse.__name__
    return wrapped


def env_name(flag: str) -> str:
    """`--web.listen-address` -> `KDE_WEB_LISTEN_ADDRESS`."""
    return ENV_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", flag.lstrip("-")).upper()


def _metavar(dest: str, parse: Callable[[str], Any]) -> str:
    return FLAG_METAVARS.get(dest) or METAVARS.get(getattr(parse, "__name__", ""), "VALUE")


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
    groups = {k: parser.add_argument_group(v) for k, v in GROUP_TITLES.items()}
    for group, flag, dest, parse, default, help_ in FLAGS:
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
    flag_dests = {dest for _, _, dest, _, _, _ in FLAGS}

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

    table = {dest: (flag, parse) for _, flag, dest, parse, _, _ in FLAGS}

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
    kubernetes_events = get("kubernetes_events", False)
    _need_node(node_name, kubernetes_api=kubernetes_api, kubernetes_events=kubernetes_events)
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
        kubernetes_events=kubernetes_events,
        kubeconfig=get("kubeconfig", None),
        pod_label_patterns=tuple(get("pod_label_patterns", [])),
    )


def _need_node(node_name: str, **flags: bool) -> None:
    """Flags that name this node to the API server need its name (a pod's hostname is the
    pod's name)."""
    for dest, on in flags.items():
        if on and not node_name:
            flag = "--" + dest.replace("_", ".")
            raise UsageError(
                f"{flag} needs --node-name or NODE_NAME (the downward API's spec.nodeName): "
                "the hostname of a pod is the pod's name"
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
