"""`Http1Client`'s `handoff`: the process at the Unix socket (the sandbox's shim) passes a
connected socket to the server instead of serving the connection, on asyncio's loop and on
uvloop's. A thread plays the shim; what it passes is the test's choice."""

from __future__ import annotations

import os
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from osmosis.rollout.http1 import ConnectFailed, Http1Client
from tests.unit.eval.sites.test_bridge_forwarder import closed_everywhere
from tests.unit.event_loops import on_each_loop
from tests.unit.rollout.test_http1 import OK, answering


@contextmanager
def shim(give: Callable[[socket.socket], None]) -> Iterator[tuple[str, list[int]]]:
    """A Unix socket whose every connection `give` answers: its path, and a list that counts
    the connections."""
    connections: list[int] = []
    with tempfile.TemporaryDirectory(dir="/tmp") as directory:
        path = str(Path(directory) / "shim.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen()

        def serve() -> None:
            while True:
                try:
                    via, _ = listener.accept()
                except OSError:
                    return
                connections.append(1)
                with via:
                    give(via)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            yield path, connections
        finally:
            listener.shutdown(socket.SHUT_RDWR)
            listener.close()
            thread.join(5)


def passing(make: Callable[[], int]) -> Callable[[socket.socket], None]:
    """Pass the descriptor `make` returns (then close ours), as the shim passes a connection."""

    def give(via: socket.socket) -> None:
        fd = make()
        try:
            socket.send_fds(via, [b"\0"], [fd])
        finally:
            os.close(fd)

    return give


@on_each_loop
async def test_requests_go_over_the_connection_handed_over_and_reuse_it() -> None:
    async with answering(OK, OK) as server:
        connect = passing(lambda: socket.create_connection(("127.0.0.1", server.port)).detach())
        with shim(connect) as (path, handed):
            client = Http1Client("http://rollout", unix_socket=path, handoff=True)
            for _ in range(2):
                assert (await client.request("GET", "/health", timeout=2)).body == b"ok"
            await client.aclose()
    assert len(handed) == 1 and server.accepted == 1
    assert server.requests[0][0].startswith(b"GET /health HTTP/1.1\r\nHost: rollout\r\n")


@on_each_loop
async def test_nothing_handed_over_is_a_failed_connect() -> None:
    """The shim could not reach the server (not up yet): it closes with nothing sent."""
    with shim(lambda via: None) as (path, _):
        client = Http1Client("http://rollout", unix_socket=path, handoff=True)
        with pytest.raises(ConnectFailed, match=f"cannot connect to {path}: no connection"):
            await client.request("GET", "/health", timeout=2)
        await client.aclose()


@on_each_loop
async def test_a_passed_descriptor_not_a_connected_stream_socket_is_closed_and_fails() -> None:
    read_end, write_end = os.pipe()
    with shim(passing(lambda: write_end)) as (path, _):  # ours is closed once passed
        client = Http1Client("http://rollout", unix_socket=path, handoff=True)
        with pytest.raises(ConnectFailed, match="no connection was handed over"):
            await client.request("GET", "/health", timeout=2)
        await client.aclose()
    assert closed_everywhere(read_end)
    os.close(read_end)


@on_each_loop
async def test_a_hand_over_that_does_not_come_in_connect_timeout_is_a_failed_connect() -> None:
    held = threading.Event()
    with shim(lambda via: held.wait(5)) as (path, _):
        client = Http1Client("http://rollout", unix_socket=path, handoff=True, connect_timeout=0.2)
        with pytest.raises(ConnectFailed, match=f"connecting to {path} timed out"):
            await client.request("GET", "/health", timeout=2)
        await client.aclose()
        held.set()
