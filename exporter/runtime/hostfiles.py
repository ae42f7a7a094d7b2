"""One bounded read of a host file (procfs, sysfs) that can never block the reader.

What procfs and sysfs make is a regular file (`S_IFREG`: `fs/proc/base.c`'s `pid_entry`s,
kernfs attributes) whose one read returns at once. Anything else planted where such a file
should be, or bind-mounted over it, must not hang a cycle:

- `O_NONBLOCK`: `open()` of a FIFO for reading waits for a writer without it (`fifo(7)`);
- only a regular file is read (a FIFO or device node is refused after `fstat`, before any
  read: a FIFO with a writer that never writes would block the read, a device node could
  say anything);
- a file longer than the caller's limit is not what the kernel writes there: nothing is
  returned rather than a truncated text parsed as if it were whole;
- `nofollow` (`O_NOFOLLOW`) for sysfs leaf attributes, which are never links in a real
  sysfs (exporter.sources.sysfs.reader says which sysfs entries are).

A read that sleeps inside a regular file (a hung FUSE or NFS mount, a driver that takes its
time) is beyond what a flag can fix: callers run under a deadline (the sources' workers,
the attribution's in `exporter.attribution.resolver`).

`read_config` is the same read for a file the exporter re-reads while it runs (the web
config, the RDMA pool config, the certificates the web config names): whole, up to a size
cap, and refused, with a reason a person can act on, when it is not a regular file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
CONFIG_BYTES = 1 << 20
"""A configuration file the exporter re-reads is a few kB; one over 1 MiB is not one."""

_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a directory",
    stat.S_IFSOCK: "a socket",
}


class NotAFile(OSError):
    """A path that should hold a configuration file and does not: the message says why
    ("it is a FIFO, not a regular file"), the caller names the path."""


def read_config(path: str | Path, limit: int = CONFIG_BYTES) -> bytes:
    """A configuration file's bytes, whole; NotAFile when it is not a regular file (a FIFO's
    open would wait for a writer, /dev/zero never ends) or holds more than `limit` bytes;
    OSError when it cannot be opened. Links are followed (a Secret's `..data` swap)."""
    fd = os.open(path, FLAGS)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
            raise NotAFile(f"it is {kind}, not a regular file")
        data = bytearray()
        while chunk := os.read(fd, min(65536, limit + 1 - len(data))):
            data += chunk
            if len(data) > limit:
                raise NotAFile(f"it is longer than {limit >> 10} KiB")
    finally:
        os.close(fd)
    return bytes(data)


def read_bytes(path: str | Path, limit: int, *, nofollow: bool = False) -> bytes | None:
    """At most `limit` bytes of a regular file, in one read; None when it cannot be read,
    is not a regular file, or is longer than `limit`."""
    try:
        fd = os.open(path, FLAGS | (os.O_NOFOLLOW if nofollow else 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) <= limit else None


def read_text(path: str | Path, limit: int, *, nofollow: bool = False) -> str | None:
    """`read_bytes` decoded (undecodable bytes replaced: callers parse ASCII out of it)."""
    data = read_bytes(path, limit, nofollow=nofollow)
    return None if data is None else data.decode("utf-8", "replace")
