"""Test-only: make chosen host reads in an exporter process sleep for ever.

Put this directory's `stuck_reads_site` on PYTHONPATH (it holds a `sitecustomize.py` that
imports this module) and list paths in KDE_TEST_STUCK_READS (os.pathsep-separated): every
`os.read` of an fd opened on one of them then blocks, as a read of a hung FUSE or NFS mount,
or of a driver attribute that never answers, does. Nothing else changes.
"""

from __future__ import annotations

import os
import threading

ENV = "KDE_TEST_STUCK_READS"


def install() -> None:
    stuck = {p for p in os.environ.get(ENV, "").split(os.pathsep) if p}
    if not stuck:
        return
    real_read = os.read
    never = threading.Event()

    def read(fd: int, n: int) -> bytes:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if target in stuck:
            never.wait()
        return real_read(fd, n)

    os.read = read
