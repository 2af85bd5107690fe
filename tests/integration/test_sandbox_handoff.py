"""A sandboxed rollout's connections reach the engine as passed descriptors (issue 30): the shim
hands the engine its connections to the server and the rollout's connections to the bridge,
and holds none of them. What the rollout hands the bridge's socket itself is checked.

Real bwrap, a real rollout server (uvicorn), a real `AsgiServer` as the bridge in the test's
event loop.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from osmosis.eval.model.bridge_http import AsgiServer
from osmosis.eval.sites.sandbox.launcher import descendant_running
from osmosis.eval.sites.sandbox.layout import SHIM_COMPILED_PATH, SHIM_PATH
from osmosis.eval.sites.sandbox.site import SandboxEndpoint, SandboxSite
from osmosis.rollout.http1 import Http1Client
from tests.integration.test_sandbox import site_for, write_rollout
from tests.integration.test_sandbox_fast_paths import _listen

# A server that calls the bridge (`/call`, at the port the site's bridge URL names inside), or
# hands the bridge's socket what no shim would (`/refused`): a pipe, a listening socket. Each
# must come out closed: the pipe's read end reaches its end, the port refuses connections.
ROLLOUT = r"""
import asyncio, json, os, select, socket, uvicorn

async def call_bridge():
    reader, writer = await asyncio.open_connection("127.0.0.1", 45999)
    writer.write(b"GET /v1/hold HTTP/1.1\r\nhost: bridge\r\nconnection: close\r\n\r\n")
    answer = await reader.read()
    writer.close()
    return json.loads(answer.partition(b"\r\n\r\n")[2])

def hand_over(fd):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as via:
        via.connect("/run/osmosis/bridge/handoff.sock")
        socket.send_fds(via, [b"\0"], [fd])
        via.settimeout(10)
        return via.recv(1) == b""

def refusals():
    read, write = os.pipe()
    closed = hand_over(write)
    os.close(write)
    pipe = closed and bool(select.select([read], [], [], 10)[0]) and os.read(read, 1) == b""
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    address = listening.getsockname()
    closed = hand_over(listening.fileno())
    listening.close()
    try:
        socket.create_connection(address, timeout=10).close()
        listener = False
    except ConnectionRefusedError:
        listener = closed
    return {"pipe": pipe, "listener": listener}

async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            kind = message["type"].rsplit(".", 1)[-1]
            await send({"type": f"lifespan.{kind}.complete"})
            if kind == "shutdown":
                return
    if scope["path"] == "/call":
        body = await call_bridge()
    elif scope["path"] == "/refused":
        body = await asyncio.to_thread(refusals)
    else:
        body = {"status": "ok", "concurrency": {"max_concurrent": 8}}
    data = json.dumps(body).encode()
    headers = [(b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": data})

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]),
                log_level="warning")
"""

CALLS = 4


class HoldingBridge:
    """The bridge: answers each call with the client address it was given, once `release` is
    set; `held` is set when `CALLS` calls wait at once."""

    def __init__(self) -> None:
        self.waiting = 0
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.waiting += 1
        if self.waiting >= CALLS:
            self.held.set()
        await self.release.wait()
        body = json.dumps({"client": scope["client"]}).encode()
        headers = [(b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


async def started(tmp_path: Path, bridge: HoldingBridge) -> tuple[SandboxSite, AsgiServer]:
    server = AsgiServer(bridge)  # type: ignore[arg-type]
    port = await _listen(server)
    site = site_for(write_rollout(tmp_path, "handoff", ROLLOUT), tmp_path, [])
    site.bridge_address = ("127.0.0.1", port)  # the rollout still calls port 45999 inside
    try:
        await site.start(1)
    except BaseException:
        await server.stop()
        raise
    return site, server


def sockets_of(pid: int) -> list[str]:
    """The sockets a process holds (`socket:[inode]`)."""
    links = [link.readlink() for link in Path(f"/proc/{pid}/fd").iterdir()]
    return sorted(str(link) for link in links if str(link).startswith("socket:"))


async def test_the_shim_holds_no_connection_while_the_engine_and_the_bridge_are_called(tmp_path):
    """`CALLS` requests in flight from the engine, each waiting on a call to the bridge: the
    shim holds its two listeners and nothing else, and the bridge sees each call come from the
    rollout's own TCP socket (the sandbox's loopback), not from a relay."""
    bridge = HoldingBridge()
    site, server = await started(tmp_path, bridge)
    (endpoint,) = site.endpoints
    assert isinstance(endpoint, SandboxEndpoint)
    client = Http1Client("http://rollout", unix_socket=str(endpoint.socket_path), handoff=True)
    try:
        shim = descendant_running(endpoint.process.pid, (SHIM_PATH, SHIM_COMPILED_PATH))
        assert shim is not None
        before = sockets_of(shim)
        assert len(before) == 2, before  # the engine's Unix listener and the bridge port's
        calls = [
            asyncio.ensure_future(client.request("GET", "/call", timeout=30)) for _ in range(CALLS)
        ]
        await asyncio.wait_for(bridge.held.wait(), 30)
        assert sockets_of(shim) == before
        bridge.release.set()
        for reply in await asyncio.gather(*calls):
            assert reply.status == 200
            host, port = json.loads(reply.body)["client"]
            assert host == "127.0.0.1" and port != 45999
        assert sockets_of(shim) == before
    finally:
        await client.aclose()
        await site.stop()
        await server.stop()


async def test_what_the_rollout_hands_the_bridges_socket_itself_is_closed_and_calls_go_on(
    tmp_path,
):
    bridge = HoldingBridge()
    bridge.release.set()
    site, server = await started(tmp_path, bridge)
    (endpoint,) = site.endpoints
    client = Http1Client("http://rollout", unix_socket=str(endpoint.socket_path), handoff=True)
    try:
        refused = await client.request("GET", "/refused", timeout=60)
        assert json.loads(refused.body) == {"pipe": True, "listener": True}
        call = await client.request("GET", "/call", timeout=30)
        assert call.status == 200 and json.loads(call.body)["client"][0] == "127.0.0.1"
    finally:
        await client.aclose()
        await site.stop()
        await server.stop()
