"""`kube-device-exporter simulate SCENARIO [EXPORTER FLAGS...]`: a simulated node and the
exporter against it, in one process. Exporter flags pass through and win over the
simulation's defaults."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shlex
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from exporter import log as logsetup
from exporter.app import Exporter, install_signal_handlers
from exporter.cli import UsageError, parse_config
from exporter.simulate.node import SimulatedNode
from exporter.simulate.scenario import ScenarioError, bundled_names, load_scenario

WORKDIR_ENV = "KDE_SIMULATE_WORKDIR"
log = logging.getLogger("exporter.simulate")


def run_simulation(argv: Sequence[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(
            "usage: kube-device-exporter simulate SCENARIO [--node-only | EXPORTER FLAGS...]\n\n"
            "SCENARIO is a bundled scenario name or a YAML file "
            f"(bundled: {', '.join(bundled_names())}; format: docs/simulation.md).\n"
            "--node-only runs only the simulated node and prints the environment and flags\n"
            "with which a separate exporter process reads it (last line: the same as JSON)."
        )
        return 0 if argv else 2
    workdir = Path(os.environ.get(WORKDIR_ENV) or tempfile.mkdtemp(prefix="kde-sim-"))
    try:
        node = SimulatedNode(load_scenario(argv[0]), workdir)
    except ScenarioError as exc:
        raise UsageError(str(exc)) from exc
    if list(argv[1:]) == ["--node-only"]:
        logsetup.setup("info", "text")
        asyncio.run(_run_node_only(node))
        return 0
    needed = node.env()
    if any(os.environ.get(k) != v for k, v in needed.items()):
        # The NVML binding dlopens libnvidia-ml.so.1 by name: the library path must be
        # in the environment before the process starts, so start again with it.
        env = {**os.environ, **needed, WORKDIR_ENV: str(workdir)}
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, "-m", "exporter", "simulate", *argv], env)
    config = parse_config([*node.exporter_args(), *argv[1:]])
    logsetup.setup(config.log_level, config.log_format)
    asyncio.run(_run(node, config))
    return 0


async def _run(node: SimulatedNode, config: object) -> None:
    from exporter.config import Config

    assert isinstance(config, Config)
    stop = asyncio.Event()
    install_signal_handlers(stop)
    await node.start()
    exporter = Exporter(config)
    await exporter.start()
    ticker = asyncio.create_task(node.tick_forever(stop))
    try:
        await exporter.wait_ready()
        where = exporter.url if exporter.port else "(no HTTP server: --web.listen-address none)"
        print(
            f"\nSimulated node {node.scenario.node!r} ({node.scenario.name}) is up.\n"
            f"  Landing page: {where}\n"
            f"  Metrics:      {where}metrics\n"
            f"  Kubelet:      {node.socket_path}\n"
            "Press Ctrl-C to stop.\n",
            flush=True,
        )
        await stop.wait()
    finally:
        stop.set()
        await ticker
        await exporter.stop()
        await node.stop()


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
