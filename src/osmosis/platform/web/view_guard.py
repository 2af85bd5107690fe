"""`osmosis eval view` answers only requests addressed to it by a loopback name.

A page on the web can point a name of its own at 127.0.0.1 (DNS rebinding) and then read a
viewer that has no login; the Host header still carries that name, so refusing every Host but
the loopback ones closes the hole, as Jupyter does.
"""

from __future__ import annotations

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "[::1]", "::1"})


def host_name(header: str) -> str:
    """`host:port` -> `host` (`[::1]:8766` -> `[::1]`)."""
    if header.startswith("["):
        return header.split("]", 1)[0] + "]"
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class HostGuard:
    def __init__(self, app: ASGIApp, *, allowed: frozenset[str]) -> None:
        self.app = app
        self.allowed = {name.lower() for name in allowed}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            host = host_name(headers.get(b"host", b"").decode("latin-1")).lower()
            if host not in self.allowed:
                response = PlainTextResponse(
                    f"this viewer answers only to {', '.join(sorted(self.allowed))}",
                    status_code=403,
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
