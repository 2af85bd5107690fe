"""The sandbox's way to the model bridge (`BridgeForwarder`): a Unix socket whose every
connection is joined to the bridge's TCP port, on asyncio's loop and on uvloop's (the one the
engine runs on). Real sockets: a TCP server on 127.0.0.1 stands in for the bridge."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from osmosis.eval.sites.sandbox.network import BridgeForwarder

LOOPS: dict[str, Callable[[Coroutine[Any, Any, None]], None]] = {
    "asyncio": asyncio.run,
    "uvloop": uvloop.run,
}


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
        forwarder = await BridgeForwarder.start(tmp_path / "bridge.sock", "127.0.0.1", port)
        try:
            reader, writer = await asyncio.open_unix_connection(str(tmp_path / "bridge.sock"))
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
        forwarder = await BridgeForwarder.start(tmp_path / "bridge.sock", "127.0.0.1", port)
        try:
            reader, writer = await asyncio.open_unix_connection(str(tmp_path / "bridge.sock"))

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
        forwarder = await BridgeForwarder.start(tmp_path / "bridge.sock", "127.0.0.1", port)
        try:
            reader, writer = await asyncio.open_unix_connection(str(tmp_path / "bridge.sock"))
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\n\r\n")
            # Closed with the request unread: an end of file, or a reset.
            with contextlib.suppress(ConnectionResetError):
                assert await asyncio.wait_for(reader.read(), 10) == b""
            writer.close()
        finally:
            await forwarder.stop()

    LOOPS[loop](main())


@pytest.mark.parametrize("loop", LOOPS)
def test_stop_ends_open_connections_and_removes_the_socket(tmp_path, loop):
    path = tmp_path / "bridge.sock"

    async def main() -> None:
        server, port = await _bridge(_echo)
        forwarder = await BridgeForwarder.start(path, "127.0.0.1", port)
        reader, writer = await asyncio.open_unix_connection(str(path))
        writer.write(b"ping")
        assert await asyncio.wait_for(reader.readexactly(4), 10) == b"ping"
        await forwarder.stop()
        assert await asyncio.wait_for(reader.read(), 10) == b""  # ended, not hanging
        assert not os.path.exists(path)  # noqa: ASYNC240 - one stat, nothing else runs
        writer.close()
        server.close()

    LOOPS[loop](main())
