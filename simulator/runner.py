"""`kde-simulate SCENARIO [EXPORTER FLAGS...]`: a simulated node and the exporter against it,
in one process. Exporter flags pass through and win over the simulation's defaults.

The command comes from the development install (simulator/pyproject.toml), never from the
product's wheel; `python -m simulator` is the same command."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from exporter.app import Exporter
from exporter.cli.flags import parse_config
from exporter.cli.parser import UsageError
from exporter.runtime import log as logsetup
from exporter.runtime.process import exit_now_if_stuck, install_signal_handlers
from exporter.settings.config import Config
from simulator.node import SimulatedNode
from simulator.scenario import Scenario, ScenarioError, bundled_names, load_scenario

WORKDIR_ENV = "KDE_SIMULATE_WORKDIR"
OWNED_ENV = "KDE_SIMULATE_OWNS_WORKDIR"
"""Set (to the workdir) when this process made the work directory and must remove it."""
log = logging.getLogger("simulator")
PROG = "kde-simulate"


def main(argv: Sequence[str] | None = None) -> int:
    """The `kde-simulate` command: a bad scenario or flag exits 2 with one line."""
    try:
        return run_simulation(list(sys.argv[1:] if argv is None else argv))
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


def run_simulation(argv: Sequence[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(
            f"usage: {PROG} SCENARIO [--node-only | EXPORTER FLAGS...]\n\n"
            "SCENARIO is a bundled scenario name or a YAML file "
            f"(bundled: {', '.join(bundled_names())}; format: docs/simulation.md).\n"
            "--node-only runs only the simulated node and prints the environment and flags\n"
            "with which a separate exporter process reads it (last line: the same as JSON)."
        )
        return 0 if argv else 2
    try:
        scenario = load_scenario(argv[0])
    except ScenarioError as exc:
        raise UsageError(str(exc)) from exc
    given = os.environ.get(WORKDIR_ENV)
    workdir = Path(given or tempfile.mkdtemp(prefix="kde-sim-"))
    owned = not given or os.environ.get(OWNED_ENV) == str(workdir)
    try:
        code = _simulate(scenario, workdir, argv, owned=owned)
    finally:
        # Reached on a bad flag, a taken port, Ctrl-C and SIGTERM alike (both only set the
        # stop event); not after execve, which replaces this process with one that owns it.
        if owned:
            shutil.rmtree(workdir, ignore_errors=True)
    return exit_now_if_stuck(code)


UNIX_PATH_MAX = 107
"""Longest unix socket path (sun_path is 108 bytes with its NUL)."""


def _simulate(scenario: Scenario, workdir: Path, argv: Sequence[str], *, owned: bool) -> int:
    try:
        node = SimulatedNode(scenario, workdir)
    except ScenarioError as exc:
        raise UsageError(str(exc)) from exc
    if len(str(node.socket_path)) > UNIX_PATH_MAX:
        raise UsageError(
            f"the simulated kubelet's socket {node.socket_path} is longer than {UNIX_PATH_MAX} "
            f"characters: set TMPDIR or {WORKDIR_ENV} to a shorter directory"
        )
    if list(argv[1:]) == ["--node-only"]:
        logsetup.setup("info", "text")
        asyncio.run(_run_node_only(node))
        return 0
    needed = node.env()
    if any(os.environ.get(k) != v for k, v in needed.items()):
        # The NVML binding dlopens libnvidia-ml.so.1 by name: the library path must be
        # in the environment before the process starts, so start again with it.
        env = {**os.environ, **needed, WORKDIR_ENV: str(workdir)}
        if owned:
            env[OWNED_ENV] = str(workdir)
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, "-m", "simulator", *argv], env)
    # The kubelet here is the simulated one: no shared rate limit to respect.
    config = parse_config([*node.exporter_args(), *argv[1:]], min_collect_interval=0.01)
    logsetup.setup(config.log_level, config.log_format)
    try:
        asyncio.run(_run(node, config, argv[1:]))
    except OSError as exc:
        # The port is taken, most often: one line, as the plain exporter says it.
        log.error("cannot start: %s", exc)
        return 1
    return 0


async def _run(node: SimulatedNode, config: Config, flags: Sequence[str]) -> None:
    stop = asyncio.Event()
    install_signal_handlers(stop)
    await node.start()
    try:
        exporter = Exporter(config, sources=node.sources(config))
        try:
            await exporter.start()
        except OSError:
            await exporter.stop()
            raise
        ticker = asyncio.create_task(node.tick_forever(stop))
        try:
            await exporter.wait_ready()
            print(_banner(node, exporter, flags), flush=True)
            await stop.wait()
        finally:
            stop.set()
            await ticker
            await exporter.stop()
    finally:
        await node.stop()


def _banner(node: SimulatedNode, exporter: Exporter, flags: Sequence[str] = ()) -> str:
    if exporter.port:
        where = f"  Landing page: {exporter.url}\n  Metrics:      {exporter.url}metrics\n"
    else:
        where = "  No HTTP server (--web.listen-address none): OTLP push only.\n"
    return (
        f"\nSimulated node {node.scenario.node!r} ({node.scenario.name}) is up.\n"
        f"{where}"
        f"  Kubelet:      {node.socket_path}\n"
        f"  Doctor:       {doctor_command(node, flags)}\n"
        "Press Ctrl-C to stop.\n"
    )


def doctor_command(node: SimulatedNode, flags: Sequence[str] = ()) -> str:
    """`kube-device-exporter doctor` as it reads this node, to paste into another terminal
    while the node runs: the node's environment (the NVML stand-in) and paths, and the
    flags the exporter was given but the web ones (the doctor serves nothing)."""
    kept: list[str] = []
    skip = False
    for flag in flags:
        if skip:
            skip = False
        elif flag.startswith("--web."):
            skip = "=" not in flag
        else:
            kept.append(flag)
    script = Path(sys.executable).parent / "kube-device-exporter"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "exporter"]
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in node.env().items())
    args = shlex.join([*command, "doctor", *node.exporter_args(), *kept])
    return f"{env} {args}" if env else args


async def _run_node_only(node: SimulatedNode) -> None:
    """The node alone (kubelet socket, NVML state, sysfs tree), for an exporter elsewhere."""
    stop = asyncio.Event()
    install_signal_handlers(stop)
    await node.start()
    ticker = asyncio.create_task(node.tick_forever(stop))
    env, args = node.env(), node.exporter_args()
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    print(
        f"Simulated node {node.scenario.node!r} ({node.scenario.name}) is up; run the exporter"
        f" with:\n  {exports} kube-device-exporter {shlex.join(args)}\n"
        + json.dumps({"env": env, "args": args}),
        flush=True,
    )
    try:
        await stop.wait()
    finally:
        stop.set()
        await ticker
        await node.stop()
