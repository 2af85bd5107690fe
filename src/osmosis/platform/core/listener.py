"""The HTTP server's socket, bound before anything else starts, so a taken port says so.

    sock = bind_listener("127.0.0.1", 8000)   # PortInUse if another socket has the port

Bound the way uvicorn binds (SO_REUSEADDR, IPv6 when the host has a colon) but not listening:
until uvicorn serves it, a client is refused at once rather than left waiting in the backlog.
"""

from __future__ import annotations

import errno
import socket


class PortInUse(OSError):
    """Another socket on this machine has the port."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        super().__init__(errno.EADDRINUSE, f"port {port} on {host} is already in use")

    def __str__(self) -> str:
        return str(self.args[1])


def bind_listener(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port); `PortInUse` if taken, other `OSError`s as raised."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        if error.errno == errno.EADDRINUSE:
            raise PortInUse(host, port) from None
        raise
    return sock


def port_taken(host: str, port: int) -> bool:
    """Whether binding (host, port) now would fail with "address already in use"."""
    try:
        bind_listener(host, port).close()
    except PortInUse:
        return True
    except OSError:
        return False  # another reason (a host not on this machine): the server will say it
    return False
