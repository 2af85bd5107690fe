"""The sandbox's way to the model bridge (`BridgeForwarder`): a Unix socket to which the shim
hands connections (SCM_RIGHTS), each joined to the bridge's TCP port, on asyncio's loop and on
uvloop's (the one the engine runs on). Real sockets: a TCP server on 127.0.0.1 stands in for
the bridge, and one end of a socket pair for a connection the rollout made."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import select
import socket
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from osmosis.eval.sites.sandbox.network import BridgeForwarder
from osmosis.rollout.http1 import stream_socket

LOOPS: dict[str, Callable[[Coroutine[Any, Any, None]], None]] = {
    "asyncio": asyncio.run,
    "uvloop": uvloop.run,
}


def hand_over(path: str | os.PathLike[str], *fds: int) -> None:
    """What the shim does with a connection: one byte to the socket at `path`, `fds` beside
    it (SCM_RIGHTS); ours are the caller's to close."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as via:
        via.connect(os.fspath(path))
        socket.send_fds(via, [b"\0"], list(fds))
        via.settimeout(10)
        assert via.recv(1) == b""  # closed once read: one hand-over per connection


async def open_handed_over(
    path: str | os.PathLike[str],
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection handed to the socket at `path`, as the shim hands the rollout's: the
    other end of it, to talk over."""
    ours, theirs = socket.socketpair()
    with theirs:
        await asyncio.to_thread(hand_over, path, theirs.fileno())
    return await asyncio.open_connection(sock=ours)


def closed_everywhere(read_end: int) -> bool:
    """Whether every copy of a pipe's write end is closed: its read end reaches its end."""
    ready, _, _ = select.select([read_end], [], [], 10)
    return bool(ready) and os.read(read_end, 1) == b""


async def _answer_after_eof(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Reads the whole request (to the caller's half-close), then answers its digest."""
    body = await reader.read()
    writer.write(f"{len(body)} {hashlib.sha256(body).hexdigest()}".encode())
    await writer.drain()
    writer.close()


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


async def _bridge(handler: Any) -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.mark.parametrize("loop", LOOPS)
def test_a_request_half_closed_by_the_sandbox_still_gets_its_whole_answer(tmp_path, loop):
    body = bytes(range(256)) * 40_000  # 10 MB: more than any socket buffer holds

    async def main() -> None:
        server, port = await _bridge(_answer_after_eof)
        forwarder = await BridgeForwarder.start(tmp_path / "handoff.sock", "127.0.0.1", port)
        try:
            reader, writer = await open_handed_over(tmp_path / "handoff.sock")
            writer.write(body)
            writer.write_eof()
            answer = await asyncio.wait_for(reader.read(), 30)
            assert answer == f"{len(body)} {hashlib.sha256(body).hexdigest()}".encode()
            writer.close()
        finally:
            await forwarder.stop()
            server.close()

    LOOPS[loop](main())


@pytest.mark.parametrize("loop", LOOPS)
def test_a_large_exchange_both_ways_arrives_intact_and_in_order(tmp_path, loop):
    chunks = [bytes([n]) * 1_000_000 for n in range(24)]  # 24 MB each way, through back-pressure

    async def main() -> None:
        server, port = await _bridge(_echo)
        forwarder = await BridgeForwarder.start(tmp_path / "handoff.sock", "127.0.0.1", port)
        try:
            reader, writer = await open_handed_over(tmp_path / "handoff.sock")

            async def send() -> None:
                for chunk in chunks:
                    writer.write(chunk)
                    await writer.drain()
                writer.write_eof()

            sending = asyncio.ensure_future(send())
            echoed = await asyncio.wait_for(reader.read(), 60)
            await sending
            assert echoed == b"".join(chunks)
            writer.close()
        finally:
            await forwarder.stop()
            server.close()

    LOOPS[loop](main())


@pytest.mark.parametrize("loop", LOOPS)
def test_with_the_bridge_gone_a_connection_is_closed_not_left_hanging(tmp_path, loop):
    async def main() -> None:
        server, port = await _bridge(_echo)
        server.close()
        await server.wait_closed()  # nothing listens on `port` now
        forwarder = await BridgeForwarder.start(tmp_path / "handoff.sock", "127.0.0.1", port)
        try:
            reader, writer = await open_handed_over(tmp_path / "handoff.sock")
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\n\r\n")
            # Closed with the request unread: an end of file, or a reset (or a broken pipe,
            # closed before the request was written).
            with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                assert await asyncio.wait_for(reader.read(), 10) == b""
            writer.close()
        finally:
            await forwarder.stop()

    LOOPS[loop](main())


@pytest.mark.parametrize("loop", LOOPS)
def test_stop_ends_open_connections_and_removes_the_socket(tmp_path, loop):
    path = tmp_path / "handoff.sock"

    async def main() -> None:
        server, port = await _bridge(_echo)
        forwarder = await BridgeForwarder.start(path, "127.0.0.1", port)
        reader, writer = await open_handed_over(path)
        writer.write(b"ping")
        assert await asyncio.wait_for(reader.readexactly(4), 10) == b"ping"
        await forwarder.stop()
        assert await asyncio.wait_for(reader.read(), 10) == b""  # ended, not hanging
        assert not os.path.exists(path)  # noqa: ASYNC240 - one stat, nothing else runs
        writer.close()
        server.close()

    LOOPS[loop](main())


@pytest.mark.parametrize("loop", LOOPS)
def test_only_a_connected_stream_socket_is_taken_and_anything_else_is_closed(tmp_path, loop):
    """The rollout can reach the hand-over socket too, and send what it holds: a pipe, a
    listening socket, an unconnected one, a datagram socket, a message with no descriptor or
    two. Each is closed (only the first of two is looked at), and the bridge keeps serving."""
    path = tmp_path / "handoff.sock"

    async def main() -> None:
        server, port = await _bridge(_echo)
        forwarder = await BridgeForwarder.start(path, "127.0.0.1", port)
        try:
            read_end, write_end = os.pipe()
            await asyncio.to_thread(hand_over, path, write_end)
            os.close(write_end)
            assert await asyncio.to_thread(closed_everywhere, read_end)
            os.close(read_end)

            with socket.socket() as listening:
                listening.bind(("127.0.0.1", 0))
                listening.listen()
                await asyncio.to_thread(hand_over, path, listening.fileno())
                address = listening.getsockname()
            with pytest.raises(ConnectionRefusedError):  # no copy of it listens any more
                socket.create_connection(address, timeout=10).close()

            for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
                with socket.socket(socket.AF_INET, kind) as unconnected:
                    await asyncio.to_thread(hand_over, path, unconnected.fileno())
            await asyncio.to_thread(hand_over, path)  # a byte and no descriptor

            # A connection and a pipe in one message: the connection is served, the pipe
            # closed.
            read_end, write_end = os.pipe()
            ours, theirs = socket.socketpair()
            with theirs:
                await asyncio.to_thread(hand_over, path, theirs.fileno(), write_end)
            os.close(write_end)
            assert await asyncio.to_thread(closed_everywhere, read_end)
            os.close(read_end)
            reader, writer = await asyncio.open_connection(sock=ours)
            writer.write(b"still here")
            writer.write_eof()  # the echo closes its end: nothing is left open at the stop
            assert await asyncio.wait_for(reader.read(), 10) == b"still here"
            writer.close()
        finally:
            await forwarder.stop()
            server.close()

    LOOPS[loop](main())


def test_a_descriptor_that_is_no_connected_stream_socket_is_no_stream_socket():
    """`stream_socket`, which the engine's rollout client checks a hand-over with too."""
    pair = socket.socketpair()
    taken = stream_socket([pair[0].detach()])
    assert taken is not None and taken.type == socket.SOCK_STREAM
    taken.close()
    pair[1].close()
    read_end, write_end = os.pipe()
    assert stream_socket([write_end]) is None
    assert closed_everywhere(read_end)
    os.close(read_end)
    assert stream_socket([]) is None
