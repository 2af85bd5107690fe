"""Where the model bridge listens and where rollouts reach it, known before the bridge starts.

    address = BridgeAddress.listen("127.0.0.1", advertise_url=None)
    address.base_url    # 'http://127.0.0.1:41234/v1': what rollouts are given
    await bridge.start(address=address)

Binding first lets a host start the rollout servers (which are told the bridge's URL) while
the bridge itself is still being set up: its provider transport, its price, a local model.
Connections made meanwhile wait in the socket's backlog; a rollout server calls the bridge
only once it is dispatched an attempt, after the bridge has started.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from osmosis.loopback import is_loopback_url

__all__ = ["LISTEN_BACKLOG", "BridgeAddress", "advertised_root", "shown_host"]

logger = logging.getLogger("osmosis.eval.model.bridge")

LISTEN_BACKLOG = 2048
"""uvicorn's: how many connections the kernel queues before the server accepts them."""

_WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


@dataclass
class BridgeAddress:
    """A bound listening socket, and the two URLs it makes."""

    sock: socket.socket
    bound_url: str
    """Where the bridge really listens: `http://HOST:PORT` (no `/v1`)."""
    base_url: str
    """The OpenAI base URL rollouts use: `http://127.0.0.1:PORT/v1`, or the advertised root
    followed by `/v1`."""

    @classmethod
    def listen(
        cls, host: str = "127.0.0.1", port: int = 0, *, advertise_url: str | None = None
    ) -> BridgeAddress:
        """Bind `host:port` (0: a free port). OSError when it cannot; ValueError names what is
        wrong with `advertise_url`. A host beyond loopback (`0.0.0.0`, a LAN address) is
        allowed, with a warning: the run's token guards every call, but the traffic is plain
        HTTP."""
        advertised = advertised_root(advertise_url) if advertise_url else None
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(LISTEN_BACKLOG)  # a connection made before the bridge starts waits
        except OSError:
            sock.close()
            raise
        bound_host, bound_port = sock.getsockname()[:2]
        bound_url = f"http://{shown_host(bound_host)}:{bound_port}"
        if advertised is not None:
            scheme, advertised_host, advertised_port, path = advertised
            shown_port = advertised_port if advertised_port is not None else bound_port
            root = f"{scheme}://{shown_host(advertised_host)}:{shown_port}{path}"
        else:
            # A wildcard address is where to listen, not where to connect: local rollouts
            # reach a wildcard bind through loopback.
            local = _WILDCARDS.get(bound_host, bound_host)
            root = f"http://{shown_host(local)}:{bound_port}"
        address = cls(sock=sock, bound_url=bound_url, base_url=f"{root}/v1")
        if not is_loopback_url(bound_url):
            logger.warning(
                "model bridge listening on %s, beyond loopback: rollouts reach it at %s with "
                "the run's bearer token; the traffic is plain HTTP, so keep it on a trusted "
                "network",
                bound_url,
                address.base_url,
            )
        return address

    def close(self) -> None:
        """Stop listening (a bridge that never started)."""
        self.sock.close()


def shown_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def advertised_root(url: str) -> tuple[str, str, int | None, str]:
    """(scheme, host, port or None, path without `/v1`) of an advertised URL; ValueError names
    what is wrong."""
    parts = urlsplit(url.strip())
    problems = []
    if parts.scheme not in ("http", "https"):
        problems.append("it must start with http:// or https://")
    if not parts.hostname:
        problems.append("it names no host")
    if parts.username or parts.password or parts.query or parts.fragment:
        problems.append("it must hold no user, password, query or fragment")
    try:
        port = parts.port
    except ValueError:
        problems.append("its port is not a number from 0 to 65535")
        port = None
    if problems:
        raise ValueError(
            f"invalid bridge advertise URL {url!r}: {'; '.join(problems)} "
            "(e.g. http://10.0.0.5:8321)"
        )
    path = parts.path.rstrip("/").removesuffix("/v1")
    return parts.scheme, parts.hostname or "", port, path
