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
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC


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
