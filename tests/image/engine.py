"""A Docker engine for the image test: Debian's docker.io (`/usr/bin/docker`, `dockerd`).

Debian's client is preferred to any other `docker` on PATH: it builds with BuildKit by
itself (`DOCKER_BUILDKIT=1`), which the Dockerfile's secret mount needs, where a newer
client wants the separate buildx plugin. When no daemon answers and we are root, one is
started (and stopped by its PID at the end); images stay in its data root, so the base
built once is there next time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

DEBIAN_CLI = Path("/usr/bin/docker")
START_TIMEOUT = 60.0


@dataclass
class Engine:
    cli: str
    daemon: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    env: dict[str, str] = field(default_factory=lambda: {**os.environ, "DOCKER_BUILDKIT": "1"})

    def run(
        self, *args: str, timeout: float = 120, check: bool = True, input_: bytes | None = None
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [self.cli, *args], capture_output=True, text=True, timeout=timeout, env=self.env,
            check=False, input=None if input_ is None else input_.decode(),
        )  # fmt: skip
        if check and done.returncode != 0:
            raise AssertionError(f"docker {' '.join(args[:3])}: {done.stderr.strip()[-2000:]}")
        return done

    def answers(self) -> bool:
        return self.run("info", "--format", "{{.ServerVersion}}", timeout=20, check=False) \
            .returncode == 0  # fmt: skip

    def stop(self) -> None:
        """Stop the daemon this harness started, by its PID; never one it found running."""
        if self.daemon is None:
            return
        self.daemon.terminate()
        try:
            self.daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.daemon.kill()
            self.daemon.wait(timeout=10)
        self.daemon = None


def engine_or_reason(workdir: Path) -> Engine | str:
    """A working engine, or the one line that says why the image test cannot run here."""
    cli = str(DEBIAN_CLI) if DEBIAN_CLI.exists() else shutil.which("docker")
    if cli is None:
        return "no docker CLI: install Debian's docker.io (make install does, as root)"
    engine = Engine(cli)
    if engine.answers():
        return engine
    dockerd = shutil.which("dockerd")
    if os.geteuid() != 0 or dockerd is None:
        return "no Docker daemon answers and none can be started here (needs root and dockerd)"
    engine.log = workdir / "dockerd.log"
    with engine.log.open("wb") as log:
        engine.daemon = subprocess.Popen(
            [dockerd], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if engine.daemon.poll() is not None:
            tail = " ".join(engine.log.read_text().split()[-40:])
            return f"dockerd exited {engine.daemon.returncode}: {tail}"
        if engine.answers():
            return engine
        time.sleep(0.5)
    engine.stop()
    return f"dockerd did not answer within {START_TIMEOUT:.0f} s"
