"""Images without a registry: docker-archive tars built here, imported with `ctr`.

docs/real-node.md, "Images without a registry": nothing can be pulled, so
the node gets a static `pause` (the sandbox image; a few lines of C, `gcc -static`) and a
busybox image from Debian's static busybox. A docker-archive is a tar holding one layer
tar, a config JSON whose `rootfs.diff_ids` names the layer tar's sha256, and a
`manifest.json` with `Config`, `RepoTags` and `Layers`. Everything is built
deterministically (fixed mtimes, sorted entries), so the same input gives the same image ID.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.realnode.binaries import Tools

PAUSE_IMAGE = "kde.test/pause:1"
BUSYBOX_IMAGE = "kde.test/busybox:1"

PAUSE_C = r"""
/* The sandbox's init: sleeps until SIGTERM/SIGINT, reaps orphans (it is PID 1 of the
   pod's sandbox). What the kubelet's pause does, without its version flag. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
    signal(SIGINT, stop);
    signal(SIGTERM, stop);
    signal(SIGCHLD, reap);
    for (;;) pause();
}
"""

BUSYBOX_APPLETS = (
    "sh", "sleep", "cat", "echo", "true", "false", "ls", "ps", "dd", "yes", "wc", "env",
    "head", "grep", "kill", "test", "[", "id", "date", "mkdir", "rm", "touch",
)  # fmt: skip
EMPTY_DIRS = ("bin", "dev", "etc", "proc", "sys", "tmp", "var")


@dataclass(frozen=True)
class Entry:
    """One file of a layer: a regular file (`data`), a folder or a symlink (`link`)."""

    path: str
    data: bytes | None = None
    link: str = ""
    mode: int = 0o755


def layer_tar(entries: Iterable[Entry]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for entry in sorted(entries, key=lambda e: e.path):
            info = tarfile.TarInfo(entry.path)
            info.mtime = 0
            info.mode = entry.mode
            if entry.link:
                info.type = tarfile.SYMTYPE
                info.linkname = entry.link
                tar.addfile(info)
            elif entry.data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(entry.data)
                tar.addfile(info, io.BytesIO(entry.data))
    return buffer.getvalue()


def docker_archive(tag: str, layer: bytes, command: Sequence[str]) -> bytes:
    """A one-layer docker-archive (`docker save` format) named `tag`."""
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Cmd": list(command), "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "tests/realnode/images.py"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": ["layer/layer.tar"]}]
    files = {
        "layer/layer.tar": layer,
        config_name: config_bytes,
        "manifest.json": json.dumps(manifest).encode(),
    }
    return layer_tar(
        [Entry("layer", mode=0o755)] + [Entry(n, d, mode=0o644) for n, d in files.items()]
    )


def busybox_archive(busybox: Path) -> bytes:
    """Debian's static busybox, its applets as symlinks, and the folders a container needs."""
    entries = [Entry(d) for d in EMPTY_DIRS]
    entries.append(Entry("bin/busybox", busybox.read_bytes()))
    entries += [Entry(f"bin/{applet}", link="busybox") for applet in BUSYBOX_APPLETS]
    return docker_archive(BUSYBOX_IMAGE, layer_tar(entries), ["/bin/sh"])


def pause_archive(tools: Tools, workdir: Path) -> bytes:
    """The sandbox image: PAUSE_C compiled with `gcc -static`."""
    source = workdir / "pause.c"
    binary = workdir / "pause"
    source.write_text(PAUSE_C)
    subprocess.run(
        [tools.gcc, "-static", "-Os", "-s", "-o", str(binary), str(source)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    entries = [Entry(d) for d in ("dev", "etc", "proc", "sys")]
    entries.append(Entry("pause", binary.read_bytes()))
    return docker_archive(PAUSE_IMAGE, layer_tar(entries), ["/pause"])


def build_images(tools: Tools, workdir: Path) -> list[Path]:
    """Both archives, written under `workdir` (for `Containerd.import_image`)."""
    workdir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, data in (
        ("pause.tar", pause_archive(tools, workdir)),
        ("busybox.tar", busybox_archive(tools.busybox)),
    ):
        path = workdir / name
        path.write_bytes(data)
        paths.append(path)
    return paths
