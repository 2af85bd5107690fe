"""The model bridge's HTTP/1.1 server: a lean host for one bare ASGI callable.

    server = AsgiServer(app, keep_alive_sec=75, graceful_sec=3, error_body=render)
    await server.start(sock)        # a bound socket; connections are accepted from here
    ...
    await server.stop()             # requests in flight get `graceful_sec` to finish

Every attempt's model call crosses it. uvicorn (what the bridge ran on before) spent most of
the bridge's own CPU on its protocol machinery and wrote each answer's head and body in two
system calls; this parses with the same `httptools` parser, runs the app once per request,
and writes a complete answer in one call (`bench/engine.py`).

What it does, and no more: keep-alive (idle connections close after `keep_alive_sec`,
also one whose request stopped arriving half-way), `Content-Length` and chunked request
bodies (read whole, up to `max_body` bytes, else 413), a target and header lines of up to
`max_head` bytes (else 431), `Expect: 100-continue`, pipelined requests answered in order
(the connection is not read while one waits behind the answer in progress, so a client
cannot pile them up), streamed answers (chunked, when the app gives no `content-length`;
HTTP/1.0 clients get the body ended by closing), no body for HEAD, 204 and 304,
`http.disconnect` once the client went away or the answer is out, 400 for a request that is
not HTTP/1.0 or 1.1 (or asks for an upgrade), and 500 when the app fails or returns before
answering (their bodies from `error_body`, e.g. the OpenAI error shape). No TLS, no
websockets, no lifespan, no access log.

`screen(method, path, headers)` sees each request once its head is in, before any of its
body: a `Refusal` it returns is the answer (in order, the connection kept alive), the body is
read and dropped as it arrives, and the app never runs. That is how the bridge turns away a
request it will not serve without holding what was sent.

The rollouts that call it may be hostile (they run sandboxed agent code), hence the limits:
a connection holds at most `max_head` (plus one read) of an unfinished head, one request
body of `max_body` (a refused one: none; it is read and dropped up to `max_drain` bytes, so
the client reads its answer rather than a reset, and cut off past that), and the requests
parsed from one read.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, cast
from urllib.parse import unquote

import httptools

from osmosis.eval.model.bridge_address import LISTEN_BACKLOG

__all__ = ["AsgiServer", "Refusal", "Screen", "serving"]

logger = logging.getLogger("osmosis.eval.model.bridge")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]
ErrorBody = Callable[[int, str], tuple[bytes, bytes]]
"""(status, message) -> (content type, body) of an answer the server gives itself."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """A complete answer `screen` gives a request instead of the app: status, body, headers
    (`content-length` is added)."""

    status: int
    body: bytes
    headers: tuple[tuple[bytes, bytes], ...] = ()


Screen = Callable[[str, str, list[tuple[bytes, bytes]]], Refusal | None]
"""(method, path, headers) -> a `Refusal`, or None to let the app answer once the body is in."""

_STATUS_LINES = {
    status.value: f"HTTP/1.1 {status.value} {status.phrase}\r\n".encode() for status in HTTPStatus
}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_NO_BODY_STATUSES = frozenset({204, 304})
_CLOSE = b"connection: close\r\n"
_CHUNKED = b"transfer-encoding: chunked\r\n"


def _status_line(status: int) -> bytes:
    return _STATUS_LINES.get(status) or f"HTTP/1.1 {status} Unknown\r\n".encode()


def _plain(status: int, text: str) -> tuple[bytes, bytes]:
    return b"text/plain; charset=utf-8", text.encode()


def _too_large(limit: int) -> str:
    return f"the request body is too large: the limit is {limit} bytes"


class _Refused(Exception):
    """Raised in a parser callback to stop parsing and answer `status` (then close)."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


def _refusal(render: ErrorBody, status: int, text: str) -> bytes:
    """A complete answer the server gives itself (400, 413, 431, 500), closing the connection."""
    content_type, body = render(status, text)
    return b"".join(
        (
            _status_line(status),
            b"content-type: %s\r\n" % content_type,
            b"content-length: %d\r\n" % len(body),
            _CLOSE,
            b"\r\n",
            body,
        )
    )


class _Request:
    """One parsed request, waiting for or being answered by the app."""

    __slots__ = (
        "body",
        "expect_continue",
        "headers",
        "http_version",
        "keep_alive",
        "method",
        "read",
        "refusal",
        "url",
    )

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.method = "GET"
        self.http_version = "1.1"
        self.keep_alive = True
        self.expect_continue = False
        self.read = False  # the app has received the body
        self.refusal: Refusal | None = None  # screened out: its body is dropped as it comes


class _Connection(asyncio.Protocol):
    def __init__(self, server: AsgiServer) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.current: _Request | None = None  # being parsed
        self.size = 0  # of current's body
        self.head_size = 0  # of current's request line and headers the parser handed over
        self.head_open = False  # current's head is not complete yet
        self.head_read = 0  # bytes read while current's head stayed open (see data_received)
        self.reading_paused = False
        self.queue: collections.deque[_Request] = collections.deque()  # parsed, not answered
        self.task: asyncio.Task[None] | None = None  # the app answering queue[0]
        self.gone = asyncio.Event()  # the client went away
        self.writable = asyncio.Event()
        self.writable.set()
        self.idle_timer: asyncio.TimerHandle | None = None
        self.closing = False
        self.client: tuple[str, int] | None = None
        self.local: tuple[str, int] | None = None

    # -- asyncio.Protocol ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self.server.connections.add(self)
        peer = transport.get_extra_info("peername")
        here = transport.get_extra_info("sockname")
        self.client = (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) else None
        self.local = (str(here[0]), int(here[1])) if isinstance(here, tuple) else None
        self._arm_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.gone.set()
        self.writable.set()  # a writer waiting for room: there will be none
        if self.idle_timer is not None:
            self.idle_timer.cancel()
        self.queue.clear()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def data_received(self, data: bytes) -> None:
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        if self.head_open:
            self.head_read += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(400, "upgrades are not supported")
            return
        except httptools.HttpParserError as error:
            # A callback's own exception (a limit it enforces) arrives as the context.
            refused = error.__context__
            if isinstance(refused, _Refused):
                self._refuse(refused.status, refused.text)
            else:
                self._refuse(400, f"invalid HTTP request: {error}")
            return
        if self.head_open and self.head_read > self.server.max_head:
            # httptools buffers an unfinished header line itself, out of on_header's sight:
            # a head still open after a whole read was all head, so count reads too.
            self._refuse(431, "the request head is too large")
        elif self.task is None and not self.queue:
            # A request cut off half-way must not hold the connection open for ever.
            self._arm_idle()

    # -- httptools callbacks ------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.current = _Request()
        self.size = 0
        self.head_size = 0
        self.head_open = True
        self.head_read = 0

    def on_url(self, url: bytes) -> None:
        assert self.current is not None
        self.head_size += len(url)
        if self.head_size > self.server.max_head:
            raise _Refused(431, "the request head is too large")
        self.current.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.current is not None
        self.head_size += len(name) + len(value) + 4  # ": " and CRLF
        if self.head_size > self.server.max_head:
            raise _Refused(431, "the request head is too large")
        name = name.lower()
        self.current.headers.append((name, value))
        if name == b"expect" and value.lower() == b"100-continue":
            self.current.expect_continue = True

    def on_headers_complete(self) -> None:
        request = self.current
        assert request is not None
        self.head_open = False
        version = self.parser.get_http_version()
        if version not in ("1.1", "1.0"):
            raise _Refused(400, f"HTTP/{version} is not supported")
        if self.parser.should_upgrade():
            # Else the parser passes the request on (the app would run) and then stops.
            raise _Refused(400, "upgrades are not supported")
        request.method = self.parser.get_method().decode("ascii")
        request.http_version = version
        # HTTP/1.0 knows no chunks: its answers without a length end by closing.
        request.keep_alive = version == "1.1" and self.parser.should_keep_alive()
        screen = self.server.screen
        if screen is not None:
            raw_path = request.url.partition(b"?")[0]
            path = unquote(raw_path.decode("latin-1"))
            request.refusal = screen(request.method, path, request.headers)
        if request.expect_continue and not self.queue and self.transport is not None:
            self.transport.write(_CONTINUE)  # curl waits for it before a large body

    def on_body(self, body: bytes) -> None:
        request = self.current
        assert request is not None
        self.size += len(body)
        if request.refusal is not None and self.size <= self.server.max_drain:
            return  # refused already: read to keep the connection in step, never kept
        if self.size > self.server.max_body:
            # Raised, not flagged: parsing must stop here, or a request pipelined after
            # this one in the same read would be answered in its place.
            request.body = []
            raise _Refused(413, _too_large(self.server.max_body))
        request.body.append(body)

    def on_message_complete(self) -> None:
        request, self.current = self.current, None
        assert request is not None
        self.queue.append(request)
        if self.task is None:
            self._next()
        elif len(self.queue) > 1 and not self.reading_paused and self.transport is not None:
            # One waits behind the answer in progress: read no more until it is taken up,
            # or a client that keeps pipelining piles requests (bodies and all) in memory.
            self.reading_paused = True
            self.transport.pause_reading()

    # -- answering ----------------------------------------------------------------------------
    def _next(self) -> None:
        if not self.queue or self.transport is None or self.transport.is_closing():
            return
        request = self.queue[0]
        if self.reading_paused and len(self.queue) == 1:
            self.reading_paused = False
            self.transport.resume_reading()
        self.task = self.loop.create_task(self._answer(request))

    async def _answer(self, request: _Request) -> None:
        exchange = _Exchange(self, request)
        try:
            refusal = request.refusal
            if refusal is not None:
                await exchange.refuse(refusal)
            else:
                await self.server.app(exchange.scope(), exchange.receive, exchange.send)
        except Exception:
            logger.exception("model bridge: the request handler failed")
            exchange.keep_alive = False
        else:
            if not exchange.started:
                logger.error("model bridge: the request handler returned without answering")
        if not exchange.started:
            # Unanswered, the client would wait for ever, or take the next answer for this one.
            exchange.write(_refusal(self.server.error_body, 500, "Internal Server Error"))
            exchange.keep_alive = False
        elif not exchange.complete:
            exchange.keep_alive = False  # the answer is cut short: only closing says so
        self.task = None
        if self.queue and self.queue[0] is request:
            self.queue.popleft()
        if self.gone.is_set():
            return
        if not exchange.keep_alive or self.closing:
            self.close()
            return
        if self.queue:
            self._next()
        else:
            self._arm_idle()

    def _refuse(self, status: int, text: str) -> None:
        if self.transport is not None and self.task is None:
            self.transport.write(_refusal(self.server.error_body, status, text))
        self.close()

    def _arm_idle(self) -> None:
        if self.idle_timer is not None:
            self.idle_timer.cancel()
        self.idle_timer = self.loop.call_later(self.server.keep_alive_sec, self._idle_out)

    def _idle_out(self) -> None:
        self.idle_timer = None
        if self.task is None and not self.queue:
            self.close()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


class _Exchange:
    """The ASGI side of one request: its scope, `receive` and `send`."""

    __slots__ = (
        "bodiless",
        "chunked",
        "complete",
        "connection",
        "head",
        "keep_alive",
        "request",
        "started",
    )

    def __init__(self, connection: _Connection, request: _Request) -> None:
        self.connection = connection
        self.request = request
        self.keep_alive = request.keep_alive
        self.head: bytes | None = None  # the status line and headers, until written
        self.started = False
        self.complete = False
        self.chunked = False
        self.bodiless = request.method == "HEAD"  # or a 204/304 status: no body bytes at all

    def scope(self) -> Scope:
        raw_path, _, query = self.request.url.partition(b"?")
        connection = self.connection
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": self.request.http_version,
            "method": self.request.method,
            "scheme": "http",
            "path": unquote(raw_path.decode("latin-1")),
            "raw_path": raw_path,
            "query_string": query,
            "root_path": "",
            "headers": self.request.headers,
            "client": connection.client,
            "server": connection.local,
        }

    async def receive(self) -> Message:
        request = self.request
        if not request.read:
            request.read = True
            body, request.body = request.body, []
            data = body[0] if len(body) == 1 else b"".join(body)
            return {"type": "http.request", "body": data, "more_body": False}
        if not self.complete:  # ASGI: also once the answer is sent, not only once gone
            await self.connection.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        connection = self.connection
        if connection.gone.is_set():
            return  # nobody to answer any more
        if not connection.writable.is_set():
            await connection.writable.wait()
        kind = message["type"]
        if kind == "http.response.start":
            if self.started or self.head is not None:
                raise RuntimeError("the response has already started")
            self.head = self._head(message["status"], message.get("headers", ()))
            return
        if kind != "http.response.body" or (self.head is None and not self.started):
            raise RuntimeError(f"unexpected ASGI message {kind!r}")
        if self.complete:
            raise RuntimeError("the response is already complete")
        body: bytes = message.get("body", b"")
        more = bool(message.get("more_body", False))
        parts: list[bytes] = []
        if self.head is not None:
            parts.append(self.head)
            self.head = None
            self.started = True
        if self.bodiless:
            body = b""
        if self.chunked:
            if body:
                parts += [b"%x\r\n" % len(body), body, b"\r\n"]
            if not more:
                parts.append(b"0\r\n\r\n")
        else:
            parts.append(body)
        if not more:
            self.complete = True
        self.write(b"".join(parts))  # head and body in one system call

    async def refuse(self, refusal: Refusal) -> None:
        length = (b"content-length", b"%d" % len(refusal.body))
        await self.send(
            {
                "type": "http.response.start",
                "status": refusal.status,
                "headers": [*refusal.headers, length],
            }
        )
        await self.send({"type": "http.response.body", "body": refusal.body})

    def _head(self, status: int, headers: Any) -> bytes:
        if status in _NO_BODY_STATUSES:
            self.bodiless = True  # the client reads no body, not even a last chunk
        lines = [_status_line(status)]
        has_length = False
        for name, value in headers:
            lowered = name.lower()
            if b"\r" in value or b"\n" in value or b"\r" in name or b"\n" in name:
                raise RuntimeError("invalid HTTP header")
            if lowered == b"content-length":
                has_length = True
            elif lowered == b"connection" and b"close" in value.lower():
                self.keep_alive = False
            lines += [lowered, b": ", value, b"\r\n"]
        if has_length or self.bodiless:
            pass
        elif self.request.http_version == "1.1":
            self.chunked = True
            lines.append(_CHUNKED)
        else:
            self.keep_alive = False  # HTTP/1.0: closing ends the body
        if not self.keep_alive or self.connection.closing:
            self.keep_alive = False
            lines.append(_CLOSE)
        lines.append(b"\r\n")
        return b"".join(lines)

    def write(self, data: bytes) -> None:
        transport = self.connection.transport
        if transport is not None and not transport.is_closing():
            transport.write(data)


class AsgiServer:
    """Serves one ASGI callable on a bound socket; see the module doc."""

    def __init__(
        self,
        app: App,
        *,
        keep_alive_sec: float = 75.0,
        graceful_sec: float = 3.0,
        max_body: int = 64 * 1024 * 1024,
        max_head: int = 64 * 1024,
        error_body: ErrorBody = _plain,
        screen: Screen | None = None,
        max_drain: int = 256 * 1024 * 1024,
    ) -> None:
        self.app = app
        self.screen = screen
        self.max_drain = max(max_drain, max_body)
        self.keep_alive_sec = keep_alive_sec
        self.graceful_sec = graceful_sec
        self.max_body = max_body
        self.max_head = max_head
        self.error_body = error_body
        self.connections: set[_Connection] = set()
        self._server: asyncio.Server | None = None
        self._key: tuple[str, int] | None = None

    async def start(self, sock: socket.socket) -> None:
        """Accept connections on `sock` (bound, not yet listening)."""
        loop = asyncio.get_running_loop()
        # asyncio's default backlog (100) drops the SYNs of a burst of rollouts connecting at
        # once, and each dropped one waits a second for the kernel's retry.
        self._server = await loop.create_server(
            lambda: _Connection(self), sock=sock, backlog=LISTEN_BACKLOG
        )
        name = sock.getsockname()
        if isinstance(name, tuple):
            self._key = (str(name[0]), int(name[1]))
            _SERVING[self._key] = (self, loop)

    def protocol(self) -> asyncio.Protocol:
        """A connection this server answers, for a socket accepted elsewhere in its event
        loop (`loop.connect_accepted_socket`, or a listener's protocol factory)."""
        return _Connection(self)

    async def stop(self) -> None:
        """Stop accepting; idle connections close now, busy ones once their answer is out or
        after `graceful_sec`, when what is still running is cancelled."""
        server, self._server = self._server, None
        if server is None:
            return
        if self._key is not None and _SERVING.get(self._key, (None,))[0] is self:
            del _SERVING[self._key]
        server.close()
        for connection in list(self.connections):
            connection.closing = True
            if connection.task is None:
                connection.close()
        # Busy connections close themselves once their answer is out. Wait for that, not for
        # their tasks: an answer's tail may still sit in the transport's buffer when the app
        # is done, and aborting then would cut it off.
        closed = [asyncio.ensure_future(c.gone.wait()) for c in self.connections]
        if closed:
            await asyncio.wait(closed, timeout=self.graceful_sec)
            for waiter in closed:
                waiter.cancel()
        for connection in list(self.connections):
            if connection.task is not None:
                connection.task.cancel()
            connection.abort()
        leftover = [c.task for c in self.connections if c.task is not None]
        if leftover:
            await asyncio.wait(leftover, timeout=1.0)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 1.0)


_SERVING: dict[tuple[str, int], tuple[AsgiServer, asyncio.AbstractEventLoop]] = {}
"""The started servers of this process, by the TCP address they listen on (`serving`)."""


def serving(host: str, port: int) -> AsgiServer | None:
    """The started `AsgiServer` of this process, in the running event loop, that listens on
    `host:port` (or on every address, at `port`); None if there is none. The sandbox gives
    it the connections its shim hands over rather than forwarding them over TCP.

        server = serving("127.0.0.1", 41234)
        await loop.connect_accepted_socket(server.protocol, sock)   # no second hop
    """
    loop = asyncio.get_running_loop()
    for key in ((host, port), ("0.0.0.0", port), ("::", port)):
        found = _SERVING.get(key)
        if found is not None and found[1] is loop:
            return found[0]
    return None
