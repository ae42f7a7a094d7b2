"""The configuration of an exporter run in the test's own process: quick cycles, a port of
its own, no sources from the command line (the test hands them in)."""

from __future__ import annotations

from pathlib import Path

from exporter.cli.flags import parse_config
from exporter.settings.config import Config


def config_for(socket: Path, *extra: str) -> Config:
    """An exporter on a free loopback port reading `socket`, cycling every 200 ms."""
    return parse_config(
        ["--kubelet-socket", str(socket), "--web.listen-address", "127.0.0.1:0",
         "--collect-interval", "200ms", "--collect-timeout", "200ms", "--node-name", "n1", *extra],
        env={}, sources={}, min_collect_interval=0.1,
    )  # fmt: skip
