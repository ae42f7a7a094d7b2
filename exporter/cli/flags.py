"""Flags and variables -> frozen Config: what every command shares.

Each flag is also `KDE_<NAME>` in the environment (a flag wins), and a bad value raises
UsageError with one line naming the flag or variable, which the commands turn into exit 2.
The flags themselves are the settings table (`exporter/settings/table.py`, each row with
its typed default), from which `parser.py` builds the parser and `monitoring/flagdoc.py` the
README's table; `main.py` dispatches the commands.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from exporter.cli.envnames import unknown_variables
from exporter.cli.parser import (
    ENV_PREFIX,
    PROG,
    UsageError,
    build_parser,
    env_name,
    parse_args,
    validated,
)
from exporter.settings.config import Config, OtlpConfig
from exporter.settings.otelenv import otel_problem
from exporter.settings.table import BY_DEST, CORE, FLAGS, GROUPS, OTLP_PROTOCOLS
from exporter.settings.values import boolean, choice, regex
from exporter.sources import SourceInfo, registry

MIN_COLLECT_INTERVAL = 1.0
"""Each cycle makes one PodResources List; the kubelet allows 100 calls/s (burst 10) for all
its clients together, so one exporter keeps to 1% of that (the simulator, whose kubelet is ours,
goes lower)."""


def _check_otel(env: dict[str, str], protocol: str, *, push: bool) -> None:
    """Only OTLP push reads the OTEL_* variables; cluster-wide ones matter only then."""
    problem = otel_problem(env, protocol) if push else None
    if problem:
        raise UsageError(problem)


_ROW: Any = object()
"""`get` with no default: the row's typed default."""


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

    given = vars(parse_args(build_parser(sources, prog, description), argv))
    flag_dests = {row.dest for row in FLAGS}

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

    def get(dest: str, default: Any = _ROW) -> Any:
        """The flag's value, else its variable's, else `default` (the row's typed default
        unless given)."""
        row = BY_DEST[dest]
        parse = row.parse
        if dest == "resource_patterns":
            parse = split_patterns
        if dest == "pod_label_patterns":
            parse = lambda text: [regex(text)] if text else []  # noqa: E731
        return pick(row.flag, dest, parse, row.value if default is _ROW else default)

    collectors = set()
    options: dict[str, dict[str, str]] = {}
    for info in sources.values():
        flag = f"--collector.{info.name}"
        if pick(flag, f"collector_{info.name}", boolean, info.default_enabled):
            collectors.add(info.name)
        options[info.name] = {
            o.name: pick(
                f"{flag}.{o.name}", f"option_{info.name}_{o.name}", validated(o.parse), o.default
            )
            for o in info.options
        }

    otlp = _otlp(get("otlp_endpoint", None), get("otlp_protocol", None), env)
    listen_address = get("listen_address")
    if listen_address is None and not otlp.endpoint:
        named = "--web.listen-address " if "listen_address" in given else "KDE_WEB_LISTEN_ADDRESS="
        raise UsageError(
            f"{named}none: with no HTTP server and no --otlp.endpoint (or "
            "OTEL_EXPORTER_OTLP_ENDPOINT) nothing would be published; give an address "
            "(default :9405) or an OTLP endpoint"
        )
    interval = get("collect_interval")
    if interval < min_collect_interval:
        raise UsageError(
            f"--collect-interval: {interval:g}s is below the minimum {min_collect_interval:g}s "
            "(each cycle calls the kubelet's PodResources List, rate-limited to 100/s for all "
            "its clients together)"
        )
    timeout = get("collect_timeout", min(BY_DEST["collect_timeout"].value, interval))
    if timeout > interval:
        raise UsageError(
            f"--collect-timeout ({timeout:g}s) must not exceed --collect-interval ({interval:g}s)"
        )
    given_patterns = list(get("resource_patterns"))
    # The flag accepts the variable's comma form too; each occurrence may hold several.
    patterns = tuple(p for item in given_patterns for p in split_patterns(item))
    if not patterns:
        raise UsageError(
            "--kubernetes.resource-pattern: at least one pattern is needed, like nvidia.com/* "
            f"(got {','.join(given_patterns)!r})"
        )
    kubernetes_api = get("kubernetes_api")
    schema = get("metrics_schema")
    node_name = get("node_name") or env.get("NODE_NAME", "")
    kubernetes_events = get("kubernetes_events")
    _need_node(node_name, kubernetes_api=kubernetes_api, kubernetes_events=kubernetes_events)
    return Config(
        kubelet_socket=get("kubelet_socket"),
        listen_address=listen_address,
        collect_interval=interval,
        collect_timeout=timeout,
        node_name=node_name or socket.gethostname(),
        sysfs=get("sysfs"),
        procfs=get("procfs"),
        container_logs=get("container_logs"),
        process_series=get("process_series"),
        metrics_schema=schema,
        metric_groups=_metric_groups(pick, schema),
        metrics_max_series=get("metrics_max_series"),
        log_level=get("log_level"),
        log_format=get("log_format"),
        collectors=frozenset(collectors),
        source_options=options,
        resource_patterns=patterns,
        podresources_timeout=get("podresources_timeout"),
        podresources_max_message_bytes=get("podresources_max_message_bytes"),
        podresources_poll_interval=get("podresources_poll_interval"),
        podresources_stale_after=get("podresources_stale_after"),
        otlp=otlp,
        web_config_file=_web_config(get("web_config_file")),
        web_max_connections=get("web_max_connections"),
        kubernetes_api=kubernetes_api,
        kubernetes_dra=_dra(get("kubernetes_dra"), kubernetes_api),
        kubernetes_events=kubernetes_events,
        kubeconfig=_kubeconfig(get("kubeconfig"), kubernetes_api or kubernetes_events),
        pods_api_socket=get("pods_api_socket"),
        pod_label_patterns=tuple(get("pod_label_patterns")),
        notices=tuple(unknown_variables(env, ENV_PREFIX, _known_variables(sources))),
    )


def _otlp(endpoint: str | None, protocol: str | None, env: dict[str, str]) -> OtlpConfig:
    """The flags' endpoint and protocol, else the standard OTEL_* variables'."""
    signal_endpoint = False
    if endpoint is None and env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
        endpoint, signal_endpoint = env["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"], True
    if endpoint is None:
        endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
    protocol = protocol or _otel_protocol(env, push=bool(endpoint))
    if endpoint and protocol == "http/protobuf" and not re.match(r"https?://", endpoint):
        raise UsageError(
            f"--otlp.endpoint: OTLP/HTTP needs an http:// or https:// URL, got {endpoint!r}"
        )
    _check_otel(env, protocol, push=bool(endpoint))
    return OtlpConfig(endpoint=endpoint, protocol=protocol, signal_endpoint=signal_endpoint)


def _dra(dra: bool, api: bool) -> bool:
    if dra and not api:
        raise UsageError("--kubernetes.dra reads the API server: it needs --kubernetes.api")
    return dra


def _known_variables(sources: dict[str, SourceInfo]) -> list[str]:
    """Every `KDE_*` name a flag reads: the table's and the source registry's."""
    names = [env_name(row.flag) for row in FLAGS]
    for info in sources.values():
        names.append(env_name(f"--collector.{info.name}"))
        names += [env_name(f"--collector.{info.name}.{o.name}") for o in info.options]
    return names


def _metric_groups(
    pick: Callable[[str, str, Callable[[str], Any], Any], Any], schema: tuple[str, ...]
) -> frozenset[str]:
    """`core` and every group whose `--metrics.group.NAME` (or variable, or default) is on.
    With the dcgm schema a group that dcgm-exporter's default counters are made from is on
    by default (exporter/sinks/dcgm.py): the flag alone serves that default set."""
    dcgm: frozenset[str] = frozenset()
    if "dcgm" in schema:
        from exporter.sinks.dcgm import default_groups

        dcgm = default_groups()
    return frozenset({CORE}) | {
        g.name
        for g in GROUPS
        if pick(
            f"--metrics.group.{g.name}",
            f"metrics_group_{g.name}",
            boolean,
            g.default or g.name in dcgm,
        )
    }


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
        return choice(*OTLP_PROTOCOLS)(env.get(name, BY_DEST["otlp_protocol"].value))
    except ValueError as exc:
        if push:
            raise UsageError(
                f"environment variable {name}: {exc} (OTLP push speaks grpc and "
                "http/protobuf; set --otlp.protocol)"
            ) from exc
        return str(BY_DEST["otlp_protocol"].value)


def _web_config(path: Path | None) -> Path | None:
    """Checked now, so a bad file stops the start with one line (exit 2), not a traceback."""
    if path is None or str(path).lower() in ("", "none"):
        return None
    from exporter.web.config import WebConfigError, load_web_config

    try:
        load_web_config(path)
    except WebConfigError as exc:
        raise UsageError(f"--web.config.file {path}: {exc}") from exc
    return path


def _kubeconfig(path: Path | None, used: bool) -> Path | None:
    """Read now when --kubernetes.api will use it: a malformed file is one line and exit 2,
    not a watcher that stops at its first request."""
    if path is not None and used:
        from exporter.kubeapi.client import NotConfigured, load_config

        try:
            load_config(path)
        except NotConfigured as exc:
            raise UsageError(f"--kubernetes.kubeconfig: {exc}") from exc
    return path
