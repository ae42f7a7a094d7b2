"""Processes of the tier, each started in its own session and stopped by its PID.

A daemon's output goes to `LOG_DIR/NAME.log`; a failure quotes its tail. Each child is
started through util-linux's `setpriv --pdeathsig KILL`, so the kernel kills it when the test
process dies and even a killed pytest leaves no API server behind. (Not a `preexec_fn`:
Python code between fork and exec in a process with threads, as the tests' gRPC device
plugin has, crashed a child with SIGSEGV here.) The normal path is `stop()`: SIGTERM, then
SIGKILL after a grace period, always to the PID this module started, never by name.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path


def _with_parent(argv: list[str]) -> list[str]:
    """`argv` that the kernel kills when this process ends (util-linux's setpriv)."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise RuntimeError("setpriv not found: install the Debian package util-linux")
    return [setpriv, "--pdeathsig", "KILL", "--", *argv]


class DaemonDied(RuntimeError):
    pass


class Daemon:
    def __init__(
        self, name: str, argv: Sequence[str], log_dir: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = env
        self.log = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was never started"
        return self.proc.pid

    def start(self) -> Daemon:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                _with_parent(self.argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        return self

    def tail(self, lines: int = 25) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"
        return "\n".join(text.splitlines()[-lines:])

    def check(self) -> None:
        """Raise with the log's tail if the process has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise DaemonDied(
                f"{self.name} exited with {self.proc.returncode}; its log ends:\n{self.tail()}"
            )

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds; reaps the process."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def wait_for(
    what: str,
    ready: Callable[[], bool],
    timeout: float,
    watched: Sequence[Daemon] = (),
    interval: float = 0.1,
) -> float:
    """Poll `ready` until true or `timeout`; fail at once if a watched daemon dies.
    Returns the seconds it took."""
    started = time.monotonic()
    deadline = started + timeout
    while True:
        for daemon in watched:
            daemon.check()
        if ready():
            return time.monotonic() - started
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {d.name}:\n{d.tail()}" for d in watched)
            raise TimeoutError(f"{what} not ready after {timeout:.0f}s\n{tails}")
        time.sleep(interval)


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z" and os.path.exists(f"/proc/{pid}")
