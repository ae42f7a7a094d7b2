"""A private mount namespace for one test node, held open by a `sleep` of ours.

Why: the kubelet deletes every socket in the fixed `/var/lib/kubelet/device-plugins/`
when it starts, and writes `/var/log/pods` and `/var/log/containers` (docs/real-node.md,
"Keeping to itself"). Inside `unshare --mount
--propagation slave` a folder of ours is bind-mounted over each of those paths, so two
kubelets on the machine never see each other's sockets or logs. Mounts made inside
(containerd's overlay rootfs, the binds) never reach the host, and they vanish with the
namespace once its last process is gone: stopping the processes is the mount clean-up.

Processes join with `nsenter --target HOLDER --mount` (`command()`); the process that
nsenter execs keeps nsenter's PID, so `Popen.pid` is the program's own PID.
"""

from __future__ import annotations

import shlex
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.realnode.binaries import Tools


class MountNamespace:
    """`binds`: mount point (host path) -> our folder bound over it inside."""

    def __init__(self, tools: Tools, binds: Mapping[Path, Path]) -> None:
        self.tools = tools
        self.binds = dict(binds)
        self.holder: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self.holder is None:
            raise RuntimeError("the namespace is not started")
        return self.holder.pid

    def start(self, timeout: float = 10.0) -> None:
        steps = []
        for target, source in self.binds.items():
            # The mount point must exist on the host (an empty folder is all it gets).
            target.mkdir(parents=True, exist_ok=True)
            source.mkdir(parents=True, exist_ok=True)
            steps.append(f"mount --bind {shlex.quote(str(source))} {shlex.quote(str(target))}")
        script = " && ".join([*steps, "exec sleep infinity"])
        self.holder = subprocess.Popen(
            [self.tools.unshare, "--mount", "--propagation", "slave", "sh", "-c", script],
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.holder.poll() is not None:
                raise RuntimeError(f"unshare exited with {self.holder.returncode}")
            if self._bound():
                return
            time.sleep(0.02)
        raise RuntimeError(f"the binds {self.binds} did not appear within {timeout} s")

    def _bound(self) -> bool:
        """Every bind shows in the holder's mountinfo (field 5: the mount point), and the
        holder is `sleep` already (sh exec'd it after the last mount)."""
        try:
            mountinfo = Path(f"/proc/{self.pid}/mountinfo").read_text()
            comm = Path(f"/proc/{self.pid}/comm").read_text().strip()
        except OSError:
            return False
        points = {line.split()[4] for line in mountinfo.splitlines() if len(line.split()) > 4}
        return comm == "sleep" and all(str(t) in points for t in self.binds)

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` run inside the namespace."""
        return [self.tools.nsenter, f"--target={self.pid}", "--mount", "--", *argv]

    def stop(self) -> None:
        if self.holder is not None and self.holder.poll() is None:
            self.holder.kill()
            self.holder.wait(timeout=10)
