"""A TCP port bound for a server before anything else starts, and whether one is taken.

    sock = bind_listener("127.0.0.1", 8000)   # PortInUse if another socket has the port
    port_taken("127.0.0.1", 8000)             # True while another socket has it

Below the platform and the engine both: the platform server binds its port first (so a taken
port fails the start before the database is touched), and the engine asks, when a rollout
server exits at start, whether another process took the port it was given. Bound the way
uvicorn binds (SO_REUSEADDR, IPv6 when the host has a colon) but not listening: until the
server serves it, a client is refused at once rather than left waiting in the backlog.
"""

from __future__ import annotations

import errno
import socket


class ListenError(OSError):
    """The port cannot be bound on this host (an address not of this machine, say)."""

    def __init__(self, host: str, port: int, reason: str) -> None:
        self.host = host
        self.port = port
        super().__init__(f"cannot listen on {host} port {port}: {reason}")


class PortInUse(ListenError):
    """Another socket on this machine has the port."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(host, port, "already in use")
        self.args = (f"port {port} on {host} is already in use",)


def bind_listener(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port): `PortInUse` if taken, `ListenError` if it cannot
    be bound for another reason."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        if error.errno == errno.EADDRINUSE:
            raise PortInUse(host, port) from None
        raise ListenError(host, port, error.strerror or str(error)) from None
    return sock


def port_taken(host: str, port: int) -> bool:
    """Whether binding (host, port) now would fail with "address already in use"."""
    try:
        bind_listener(host, port).close()
    except PortInUse:
        return True
    except ListenError:
        return False  # another reason: the server's own bind says which
    return False


__all__ = ["ListenError", "PortInUse", "bind_listener", "port_taken"]
