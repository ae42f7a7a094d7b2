"""A loopback port free now, for a peer started next (an exporter, a receiver, a Prometheus).

Here rather than in tests/support so that the bench can take it too: the bench's measured
processes import bench/procs.py, and tests/support's package pulls in the poller and gRPC,
which would count in their memory. Another process can take the port between this call and
the bind; on loopback, in a test run, it does not happen in practice.
"""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
