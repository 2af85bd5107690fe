"""The model bridge's HTTP/1.1 server (osmosis.eval.model.bridge_http), hosting tiny ASGI apps on
loopback and spoken to over raw sockets, so each test chooses the bytes a client sends.

The clients it serves are rollouts, which may be hostile: some tests send what no honest
client would (huge or endless heads, bodies over the limit, requests piled up unread).

Every async test runs on asyncio's loop and on uvloop's (what the engine's hosts run).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import select
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import pytest

from osmosis.eval.model.bridge_http import AsgiServer, Refusal
from tests.unit.event_loops import on_each_loop


# -- the client side: raw bytes ---------------------------------------------------------------
@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    head: bytes  # as sent
    chunks: list[bytes] = field(default_factory=list)  # as framed, when chunked


class Peer:
    """One raw client connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def answer(self, *, bodiless: bool = False) -> Answer:
        """One answer, read by its framing (`bodiless` for a HEAD request's)."""
        head = await self.reader.readuntil(b"\r\n\r\n")
        status_line, *lines = head[:-4].decode("latin-1").split("\r\n")
        headers: dict[str, str] = {}
        for line in lines:
            name, _, value = line.partition(":")
            key, value = name.lower(), value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        status = int(status_line.split()[1])
        if bodiless or status in (204, 304):
            return Answer(status, headers, b"", head)
        if "content-length" in headers:
            body = await self.reader.readexactly(int(headers["content-length"]))
            return Answer(status, headers, body, head)
        if headers.get("transfer-encoding") == "chunked":
            chunks = []
            while True:
                size_line = await self.reader.readuntil(b"\r\n")
                size = int(size_line, 16)
                data = await self.reader.readexactly(size + 2)
                assert data.endswith(b"\r\n")
                chunks.append(data[:-2])
                if size == 0:
                    return Answer(status, headers, b"".join(chunks), head, chunks)
        return Answer(status, headers, await self.reader.read(), head)  # until closed

    async def rest(self, within: float = 1.0) -> bytes:
        """What is left until the server closes (in `within` seconds, else TimeoutError); a
        reset counts as closing."""
        data = b""
        async with asyncio.timeout(within):
            while True:
                try:
                    piece = await self.reader.read(65536)
                except ConnectionResetError:
                    return data
                if not piece:
                    return data
                data += piece

    async def quiet(self, within: float = 0.05) -> bool:
        """Whether nothing comes (no bytes, no close) for `within` seconds."""
        try:
            async with asyncio.timeout(within):
                await self.reader.read(1)
        except TimeoutError:
            return True
        return False

    def close(self) -> None:
        self.writer.transport.abort()


@dataclass
class Served:
    server: AsgiServer
    port: int
    peers: list[Peer] = field(default_factory=list)

    async def connect(self, sndbuf: int | None = None) -> Peer:
        sock = socket.socket()
        if sndbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", self.port))
        except OSError:
            sock.close()
            raise
        peer = Peer(*await asyncio.open_connection(sock=sock))
        self.peers.append(peer)
        return peer


App = Callable[[Any, Any, Any], Coroutine[Any, Any, None]]


@contextlib.asynccontextmanager
async def serving(app: App, rcvbuf: int | None = None, **options: Any) -> AsyncIterator[Served]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    if rcvbuf is not None:  # the connections it accepts inherit it
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    port = sock.getsockname()[1]
    server = AsgiServer(app, **{"keep_alive_sec": 5.0, "graceful_sec": 0.5, **options})
    await server.start(sock)
    served = Served(server, port)
    try:
        yield served
    finally:
        for peer in served.peers:
            peer.close()
        await server.stop()


def request(method: str, path: str, body: bytes = b"", *headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: bridge", *headers]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def answer_with(send: Any, status: int, body: bytes, *headers: tuple[bytes, bytes]) -> None:
    length = (b"content-length", b"%d" % len(body))
    await send({"type": "http.response.start", "status": status, "headers": [*headers, length]})
    await send({"type": "http.response.body", "body": body})


class Echo:
    """An app answering what it got (scope and body) as JSON; keeps each scope."""

    def __init__(self) -> None:
        self.scopes: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.scopes.append(scope)
        message = await receive()
        body = json.dumps({"path": scope["path"], "body": message["body"].decode()}).encode()
        await answer_with(send, 200, body, (b"content-type", b"application/json"))


def echoed(answer: Answer) -> dict[str, Any]:
    assert answer.status == 200, answer
    result: dict[str, Any] = json.loads(answer.body)
    return result


# -- answers ------------------------------------------------------------------------------------
@on_each_loop
async def test_an_answer_is_the_apps_status_headers_and_body_in_one_framed_message() -> None:
    echo = Echo()
    async with serving(echo) as served:
        peer = await served.connect()
        await peer.send(request("POST", "/v1/a%20b?x=1&y=2", b'{"q":1}', "X-Run: Ab"))
        answer = await peer.answer()

        body = b'{"path": "/v1/a b", "body": "{\\"q\\":1}"}'
        assert answer.head == (
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % len(body)
        )
        assert answer.body == body
        [scope] = echo.scopes
        assert scope["type"] == "http" and scope["http_version"] == "1.1"
        assert scope["method"] == "POST" and scope["scheme"] == "http"
        assert (scope["path"], scope["raw_path"]) == ("/v1/a b", b"/v1/a%20b")
        assert scope["query_string"] == b"x=1&y=2"
        assert (b"x-run", b"Ab") in scope["headers"] and (b"host", b"bridge") in scope["headers"]
        assert scope["server"] == ("127.0.0.1", served.port)
        assert scope["client"] == peer.writer.get_extra_info("sockname")


@on_each_loop
async def test_sequential_requests_share_one_connection_kept_alive() -> None:
    async with serving(Echo()) as served:
        peer = await served.connect()
        for n in range(3):
            await peer.send(request("POST", f"/{n}", b"x"))
            assert echoed(await peer.answer())["path"] == f"/{n}"
            assert len(served.server.connections) == 1
        assert await peer.quiet()


@on_each_loop
async def test_a_burst_of_connections_is_queued_while_the_loop_is_busy_not_dropped() -> None:
    # Hundreds of rollouts call the bridge at once when a run starts. Connections the kernel
    # has no room to queue are dropped, and each such client waits a second to try again.
    burst = 600
    async with serving(Echo()) as served:
        clients = [socket.socket() for _ in range(burst)]
        try:
            for client in clients:  # the loop is blocked meanwhile: nothing is accepted
                client.setblocking(False)
                client.connect_ex(("127.0.0.1", served.port))
            _, connected, _ = select.select([], clients, [], 0.5)
            assert len(connected) == burst
            peer = Peer(*await asyncio.open_connection(sock=clients.pop()))
            served.peers.append(peer)
            await peer.send(request("POST", "/last", b"x"))
            assert echoed(await peer.answer())["path"] == "/last"
        finally:
            for client in clients:
                client.close()


@on_each_loop
async def test_an_idle_connection_is_closed_after_keep_alive_sec() -> None:
    async with serving(Echo(), keep_alive_sec=0.2) as served:
        peer = await served.connect()
        await peer.send(request("GET", "/"))
        await peer.answer()
        assert await peer.quiet(0.05)  # not at once
        assert await peer.rest() == b""


@pytest.mark.parametrize(
    "sent",
    [b"", b"POST / HTTP/1.1\r\nHost: br", b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc"],
    ids=["nothing", "half-a-head", "half-a-body"],
)
@on_each_loop
async def test_a_connection_left_without_a_whole_request_is_closed_after_keep_alive_sec(
    sent: bytes,
) -> None:
    async with serving(Echo(), keep_alive_sec=0.2) as served:
        peer = await served.connect()
        await peer.send(sent)
        assert await peer.quiet(0.05)  # not at once
        assert await peer.rest() == b""


@pytest.mark.parametrize("who", ["client", "app"])
@on_each_loop
async def test_connection_close_from_either_side_closes_after_the_answer(who: str) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await answer_with(send, 200, b"bye", *([(b"Connection", b"close")] if who == "app" else []))

    async with serving(app) as served:
        peer = await served.connect()
        asked = ["Connection: close"] if who == "client" else []
        await peer.send(request("GET", "/", b"", *asked))
        answer = await peer.answer()
        assert answer.body == b"bye" and "close" in answer.headers["connection"]
        assert await peer.rest() == b""


# -- request bodies -----------------------------------------------------------------------------
@on_each_loop
async def test_a_chunked_request_body_sent_in_pieces_is_handed_over_whole() -> None:
    async with serving(Echo()) as served:
        peer = await served.connect()
        pieces = [
            b"POST /c HTTP/1.1\r\nHost: b\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nab",
            b"cd\r\n3;ext=1\r\nefg\r\n",
            b"0\r\nX-Trailer: t\r\n\r\n",
        ]
        for piece in pieces:
            await peer.send(piece)
            await asyncio.sleep(0.01)
        assert echoed(await peer.answer())["body"] == "abcdefg"


@pytest.mark.parametrize(
    "oversized",
    [
        request("POST", "/", b"x" * 11),
        b"POST / HTTP/1.1\r\nHost: b\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"6\r\nxxxxxx\r\n5\r\nxxxxx\r\n0\r\n\r\n",
    ],
    ids=["content-length", "chunked"],
)
@on_each_loop
async def test_a_body_over_max_body_is_answered_413_and_the_connection_closed(
    oversized: bytes,
) -> None:
    echo = Echo()
    async with serving(echo, max_body=10) as served:
        peer = await served.connect()
        await peer.send(request("POST", "/fits", b"x" * 10))
        assert echoed(await peer.answer())["body"] == "x" * 10
        await peer.send(oversized)
        answer = await peer.answer()
        assert (answer.status, answer.headers["connection"]) == (413, "close")
        assert answer.body == b"the request body is too large: the limit is 10 bytes"
        assert await peer.rest() == b""
    assert len(echo.scopes) == 1


# -- the screen ----------------------------------------------------------------------------------
class Screened:
    """A screen refusing paths under /no/ with 403, and keeping what it was shown."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def __call__(self, method: str, path: str, headers: list[tuple[bytes, bytes]]) -> Any:
        self.seen.append((method, path))
        if path.startswith("/no/"):
            return Refusal(403, b"not yours", ((b"content-type", b"text/plain"),))
        return None


@on_each_loop
async def test_a_screened_request_is_answered_in_order_its_body_dropped_and_the_app_not_run() -> (
    None
):
    echo, screen = Echo(), Screened()
    async with serving(echo, screen=screen, max_body=10, max_drain=1000) as served:
        peer = await served.connect()
        # A body the app would see is dropped unread, in pieces, and the connection goes on.
        await peer.send(request("POST", "/no/a", b"x" * 900) + request("POST", "/yes", b"ok"))
        refused, served_answer = await peer.answer(), await peer.answer()
        assert (refused.status, refused.body) == (403, b"not yours")
        assert refused.headers["content-length"] == "9" and "connection" not in refused.headers
        assert echoed(served_answer) == {"path": "/yes", "body": "ok"}
        # A refused body is cut off at max_drain: nobody streams into it for ever.
        await peer.send(request("POST", "/no/b", b"x" * 1001))
        assert (await peer.answer()).status == 413
    assert [scope["path"] for scope in echo.scopes] == ["/yes"]
    assert screen.seen == [("POST", "/no/a"), ("POST", "/yes"), ("POST", "/no/b")]


@on_each_loop
async def test_an_oversized_body_with_a_request_pipelined_behind_it_is_answered_413() -> None:
    # Both in one read: the one behind must not be answered in the oversized one's place.
    echo = Echo()
    async with serving(echo, max_body=10) as served:
        peer = await served.connect()
        await peer.send(request("POST", "/big", b"x" * 20) + request("GET", "/next"))
        assert (await peer.answer()).status == 413
        assert await peer.rest() == b""
    assert echo.scopes == []


@on_each_loop
async def test_expect_100_continue_gets_the_interim_answer_before_the_body_is_sent() -> None:
    async with serving(Echo()) as served:
        peer = await served.connect()
        await peer.send(
            b"POST /e HTTP/1.1\r\nHost: b\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n"
        )
        async with asyncio.timeout(1):
            assert await peer.reader.readexactly(25) == b"HTTP/1.1 100 Continue\r\n\r\n"
        await peer.send(b"data")
        assert echoed(await peer.answer())["body"] == "data"


# -- pipelining ----------------------------------------------------------------------------------
@on_each_loop
async def test_pipelined_requests_are_answered_in_order_one_at_a_time() -> None:
    running = []
    most = 0

    async def app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal most
        running.append(scope["path"])
        most = max(most, len(running))
        await receive()
        await asyncio.sleep(0.05 if scope["path"] == "/slow" else 0)
        running.remove(scope["path"])
        await answer_with(send, 200, scope["path"].encode())

    async with serving(app) as served:
        peer = await served.connect()
        await peer.send(request("GET", "/slow") + request("POST", "/fast", b"x"))
        assert [(await peer.answer()).body for _ in range(2)] == [b"/slow", b"/fast"]
        assert most == 1


@on_each_loop
async def test_a_client_pipelining_faster_than_the_answers_stops_being_read() -> None:
    release = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        if scope["path"] == "/0":
            await release.wait()
        await answer_with(send, 200, scope["path"].encode())

    async with serving(app, rcvbuf=4096, graceful_sec=0.1) as served:
        peer = await served.connect(sndbuf=4096)
        batch = b"".join(request("GET", f"/{n}") for n in range(100))  # ~3 KiB
        sent = 0
        with pytest.raises(TimeoutError):
            while sent < 4 * 1024 * 1024:  # read on, the server would take all of it
                peer.writer.write(batch)
                sent += len(batch)
                async with asyncio.timeout(0.2):
                    await peer.writer.drain()
        assert sent < 1024 * 1024
        release.set()
        assert [(await peer.answer()).body for _ in range(3)] == [b"/0", b"/1", b"/2"]


# -- streamed answers ----------------------------------------------------------------------------
@on_each_loop
async def test_a_streamed_answer_goes_out_chunked_as_the_app_sends_it() -> None:
    more = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"one", "more_body": True})
        await more.wait()
        more.clear()
        await send({"type": "http.response.body", "body": b"two", "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async with serving(app) as served:
        peer = await served.connect()
        for _ in range(2):  # and the connection is kept for the next one
            await peer.send(request("GET", "/stream"))
            async with asyncio.timeout(1):
                head = await peer.reader.readuntil(b"\r\n\r\n")
                assert head == b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                assert await peer.reader.readexactly(8) == b"3\r\none\r\n"  # before the rest
            more.set()
            assert await peer.reader.readexactly(13) == b"3\r\ntwo\r\n0\r\n\r\n"
        assert await peer.quiet()


@on_each_loop
async def test_an_http_1_0_client_gets_an_answer_ended_by_closing_not_chunked() -> None:
    versions = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        versions.append(scope["http_version"])
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"old", "more_body": True})
        await send({"type": "http.response.body", "body": b" school"})

    async with serving(app) as served:
        peer = await served.connect()
        await peer.send(b"GET / HTTP/1.0\r\n\r\n")
        answer = await peer.answer()
        assert "transfer-encoding" not in answer.headers
        assert (answer.headers["connection"], answer.body) == ("close", b"old school")
    assert versions == ["1.0"]


@on_each_loop
async def test_head_204_and_304_answers_carry_no_body_not_even_a_last_chunk() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        status = {"/204": 204, "/304": 304}.get(scope["path"], 200)
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"" if status != 200 else b"body"})

    async with serving(app) as served:
        peer = await served.connect()
        await peer.send(request("HEAD", "/") + request("GET", "/204") + request("GET", "/304"))
        await peer.send(request("GET", "/"))
        async with asyncio.timeout(1):
            heads = [await peer.reader.readuntil(b"\r\n\r\n") for _ in range(3)]
        assert heads == [
            b"HTTP/1.1 200 OK\r\n\r\n",
            b"HTTP/1.1 204 No Content\r\n\r\n",
            b"HTTP/1.1 304 Not Modified\r\n\r\n",
        ]
        answer = await peer.answer()  # straight after: no stray bytes in between
        assert (answer.status, answer.body) == (200, b"body")


# -- the app failing -----------------------------------------------------------------------------
def openai_error(status: int, message: str) -> tuple[bytes, bytes]:
    return b"application/json", json.dumps({"error": {"message": message}}).encode()


@pytest.mark.parametrize("when", ["before-start", "after-start"])
@on_each_loop
async def test_an_app_failing_before_answering_gets_500_from_error_body_and_a_close(
    when: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        if when == "after-start":
            await send({"type": "http.response.start", "status": 200, "headers": []})
        raise ValueError("the provider is down")

    with caplog.at_level(logging.ERROR, logger="osmosis.eval.model.bridge"):
        async with serving(app, error_body=openai_error) as served:
            peer = await served.connect()
            await peer.send(request("POST", "/v1/chat/completions", b"{}"))
            answer = await peer.answer()
            assert answer.status == 500
            assert answer.headers["content-type"] == "application/json"
            assert answer.headers["connection"] == "close"
            assert json.loads(answer.body) == {"error": {"message": "Internal Server Error"}}
            assert await peer.rest() == b""
    assert "the request handler failed" in caplog.text and "the provider is down" in caplog.text


@pytest.mark.parametrize("sent", ["nothing", "only-the-start"])
@on_each_loop
async def test_an_app_returning_without_answering_gets_500(sent: str) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        if sent == "only-the-start":
            await send({"type": "http.response.start", "status": 200, "headers": []})

    async with serving(app) as served:
        peer = await served.connect()
        await peer.send(request("GET", "/") + request("GET", "/behind"))
        async with asyncio.timeout(1):
            assert (await peer.answer()).status == 500
        assert await peer.rest() == b""  # and nothing else: the one behind is not answered


@on_each_loop
async def test_an_app_failing_mid_stream_has_its_answer_cut_off_by_closing() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"partial", "more_body": True})
        raise ValueError("mid-stream")

    async with serving(app) as served:
        peer = await served.connect()
        await peer.send(request("GET", "/"))
        head = await peer.reader.readuntil(b"\r\n\r\n")
        assert b"transfer-encoding: chunked" in head
        assert await peer.rest() == b"7\r\npartial\r\n"  # no last chunk: closed instead


@on_each_loop
async def test_an_app_header_that_would_end_its_line_early_fails_the_answer() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await answer_with(send, 200, b"x", (b"x-note", b"a\r\nx-injected: yes"))

    async with serving(app) as served:
        peer = await served.connect()
        await peer.send(request("GET", "/"))
        answer = await peer.answer()
        assert answer.status == 500 and b"injected" not in answer.head


# -- requests refused ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "sent",
    [
        b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + b"\x00" * 40,
        b"HELLO\r\n\r\n",
        b"GET / HTTP/2.0\r\nHost: b\r\n\r\n",
        b"GET / HTTP/0.9\r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        b"GET / HTTP/1.1\r\nBad Header\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: b\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"0\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: b\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
        b"GET /ws HTTP/1.1\r\nHost: b\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
        b"CONNECT example.test:443 HTTP/1.1\r\nHost: example.test:443\r\n\r\n",
    ],
    ids=[
        "tls-hello",
        "no-request-line",
        "http-2.0",
        "http-0.9",
        "h2-preface",
        "bad-header",
        "length-and-chunked",
        "two-lengths",
        "websocket-upgrade",
        "connect",
    ],
)
@on_each_loop
async def test_what_is_not_an_http_1_request_is_answered_400_and_closed(sent: bytes) -> None:
    echo = Echo()
    async with serving(echo) as served:
        peer = await served.connect()
        await peer.send(sent)
        async with asyncio.timeout(1):
            answer = await peer.answer()
        assert (answer.status, answer.headers["connection"]) == (400, "close")
        assert answer.headers["content-type"] == "text/plain; charset=utf-8"
        assert await peer.rest() == b""
    assert echo.scopes == []


@pytest.mark.parametrize(("size", "status"), [(1000, 200), (1100, 431)])
@on_each_loop
async def test_a_head_over_max_head_in_one_piece_is_answered_431(size: int, status: int) -> None:
    async with serving(Echo(), max_head=1024) as served:
        peer = await served.connect()
        start = b"GET / HTTP/1.1\r\nHost: b\r\nX-Pad: "
        await peer.send(start + b"p" * (size - len(start) - 4) + b"\r\n\r\n")
        answer = await peer.answer()
        assert answer.status == status
        if status == 431:
            assert answer.body == b"the request head is too large"
            assert await peer.rest() == b""


async def drip(peer: Peer, first: bytes, piece: bytes, limit: int) -> tuple[int, Answer]:
    """Send `first`, then `piece` after `piece` (none of them ending the head), until an
    answer comes back: the bytes sent by then, and the answer. Gives up at `limit`.

    The answer is read as soon as it comes: a piece sent after the server closed makes it
    reset the connection, after which the stream reader hands out nothing it holds."""
    sent = 0
    data = first
    while sent < limit:
        await peer.send(data)
        sent += len(data)
        data = piece
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.02):  # readuntil takes nothing if cut short
                return sent, await peer.answer()
    raise AssertionError(f"no answer after {sent} bytes of head")


@pytest.mark.parametrize(
    ("first", "piece"),
    [
        (b"GET / HTTP/1.1\r\nX-Endless: ", b"v" * 200),
        (b"GET / HTTP/1.1\r\n", b"X-Many: " + b"v" * 190 + b"\r\n"),
        (b"GET /", b"u" * 200),
        (b"GET / HTTP/1.1\r\nX-Endless", b"n" * 200),
    ],
    ids=["endless-value", "endless-headers", "endless-url", "endless-name"],
)
@on_each_loop
async def test_an_endless_head_is_answered_431_soon_after_max_head(
    first: bytes, piece: bytes
) -> None:
    echo = Echo()
    async with serving(echo, max_head=1024) as served:
        peer = await served.connect()
        sent, answer = await drip(peer, first, piece, limit=64 * 1024)
        assert 1024 < sent <= 4 * 1024  # about max_head and a read, give or take a slow server
        assert answer.head.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
        assert answer.body == b"the request head is too large"
        assert await peer.rest() == b""
    assert echo.scopes == []


@on_each_loop
async def test_the_default_head_limit_is_64_kib() -> None:
    async with serving(Echo()) as served:
        peer = await served.connect()
        await peer.send(b"GET / HTTP/1.1\r\nX-Big: " + b"b" * 60_000 + b"\r\n\r\n")
        assert (await peer.answer()).status == 200
        sent, answer = await drip(peer, b"GET / HTTP/1.1\r\nX-Endless: ", b"v" * 8192, 1 << 20)
        assert 64 * 1024 < sent <= 128 * 1024
        assert answer.status == 431


# -- the client going away -----------------------------------------------------------------------
@on_each_loop
async def test_http_disconnect_is_delivered_once_the_client_goes_away() -> None:
    heard: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await heard.put(await receive())
        await heard.put(await receive())  # the client is gone by then
        await answer_with(send, 200, b"too late")  # to nobody: not an error
        await heard.put({"type": "answered"})

    async with serving(app) as served:
        peer = await served.connect()
        await peer.send(request("POST", "/", b"hi"))
        assert await heard.get() == {"type": "http.request", "body": b"hi", "more_body": False}
        await asyncio.sleep(0.02)
        assert heard.empty()  # still there: no disconnect yet
        peer.writer.close()
        async with asyncio.timeout(1):
            assert await heard.get() == {"type": "http.disconnect"}
            assert await heard.get() == {"type": "answered"}


@on_each_loop
async def test_receive_after_the_answer_is_out_says_disconnect_at_once() -> None:
    heard = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await answer_with(send, 200, b"done")
        async with asyncio.timeout(1):
            heard.append(await receive())

    async with serving(app) as served:
        peer = await served.connect()
        for _ in range(2):
            await peer.send(request("GET", "/"))
            assert (await peer.answer()).body == b"done"
    assert heard == [{"type": "http.disconnect"}] * 2


# -- stopping -------------------------------------------------------------------------------------
@on_each_loop
async def test_stop_lets_an_answer_in_flight_finish_and_closes_the_rest_at_once() -> None:
    answering = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await asyncio.sleep(0.3)
        answering.set()
        await answer_with(send, 200, b"finished")

    async with serving(app, graceful_sec=1.0) as served:
        busy, idle = await served.connect(), await served.connect()
        await busy.send(request("GET", "/"))
        await asyncio.sleep(0.02)
        stopping = asyncio.ensure_future(served.server.stop())
        answered_by_then: list[bool] = []
        stopping.add_done_callback(lambda _: answered_by_then.append(answering.is_set()))
        assert await idle.rest() == b""
        assert not answering.is_set()  # the idle one was closed at once, not at the end
        answer = await busy.answer()
        assert (answer.body, answer.headers["connection"]) == (b"finished", "close")
        assert await busy.rest() == b""
        async with asyncio.timeout(0.5):
            await stopping
        assert answered_by_then == [True]
        with pytest.raises(ConnectionRefusedError):
            await served.connect()


@on_each_loop
async def test_stop_waits_for_an_answer_still_being_written_out() -> None:
    big = b"x" * (16 * 1024 * 1024)  # far more than the socket buffers hold

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await answer_with(send, 200, big)

    async with serving(app, graceful_sec=2.0) as served:
        peer = await served.connect()
        await peer.send(request("GET", "/"))
        await asyncio.sleep(0.05)  # the app is done; most of its answer is not out yet
        stopping = asyncio.ensure_future(served.server.stop())
        await asyncio.sleep(0.1)
        answer = await peer.answer()  # reading only now
        assert answer.body == big
        await stopping


@on_each_loop
async def test_stop_cancels_an_app_still_running_after_graceful_sec() -> None:
    cancelled = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with serving(app, graceful_sec=0.1) as served:
        peer = await served.connect()
        await peer.send(request("GET", "/"))
        await asyncio.sleep(0.02)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await served.server.stop()
        assert 0.09 <= loop.time() - started < 0.6
        assert cancelled.is_set()
        assert await peer.rest() == b""  # dropped without an answer
