"""Why the HTTP server could not listen, as one line that names the flag to change."""

from __future__ import annotations

import errno
import socket


class ListenError(OSError):
    """The HTTP server could not bind `--web.listen-address`; the text is the whole story.
    An OSError, as the bind's own error was: whatever reports a failed start (the exporter,
    `simulate`) says this line instead."""


def listen_problem(address: tuple[str, int], exc: OSError) -> str:
    """`[Errno 98] ...` -> `--web.listen-address 127.0.0.1:9405: the port is in use ...`."""
    host, port = address
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    where = f"--web.listen-address {shown}"
    if isinstance(exc, socket.gaierror):
        return f"{where}: cannot resolve the host {host!r} ({exc.strerror}); use an IP address"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"{where}: port {port} is in use by another process (another exporter?); "
            "pick another port, or stop the other process"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{where}: {host!r} is not an address of this machine"
    if exc.errno == errno.EACCES:
        return f"{where}: permission denied (a port below 1024 needs privileges)"
    return f"{where}: {exc.strerror or exc}"
