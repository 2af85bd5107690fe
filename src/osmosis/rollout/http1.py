"""A lean HTTP/1.1 client: keep-alive connections, one request at a time on each, no frills.

    client = Http1Client("http://127.0.0.1:8123")
    reply = await client.request("POST", "/rollout", body=data, headers=JSON, timeout=30)
    reply.status, reply.headers["content-type"], reply.body
    await client.aclose()

It carries the two exchanges every attempt makes several times (the engine's rollout
protocol calls and a rollout's policy calls to the bridge), where aiohttp spent ~0.25 ms of
CPU per request and this spends ~0.03 ms (`bench/engine.py`; the server side gets cheaper
too, as head and body leave in one write). It speaks plain HTTP or TLS over TCP, or HTTP
over a Unix socket, or over a connection a Unix socket hands over (`handoff`: the sandbox's
shim connects to the server and passes that socket, so no process copies the bytes), and
reads any response framing (`Content-Length`, chunked, or until the server closes). It has
no proxy support, cookies, redirects, compression or connection limits: the callers need
none of them (the bridge's provider calls, which may, stay on aiohttp).

Failures are sorted the way a caller must decide whether to send a request again:
`ConnectFailed` (nothing was sent: safe to repeat), `TransportFailed` (the request may have
reached the server), and `TimeoutError` (the server did not answer in time).
"""

from __future__ import annotations

import asyncio
import collections
import os
import socket
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

import httptools

__all__ = [
    "ConnectFailed",
    "Exchange",
    "Http1Client",
    "Reply",
    "TransportFailed",
    "encode_headers",
    "stream_socket",
]

DEFAULT_MAX_BODY = 256 * 1024 * 1024
_NO_BODY_STATUSES = frozenset({204, 304})
_T = TypeVar("_T")


class TransportFailed(ConnectionError):
    """The connection broke or the answer was not HTTP, after the request was (maybe) sent."""


class ConnectFailed(TransportFailed):
    """No connection could be made: the request never left."""


@dataclass(frozen=True, slots=True)
class Reply:
    """A complete response: `headers` are lower-cased names to values."""

    status: int
    headers: Mapping[str, str]
    body: bytes


def encode_headers(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> bytes:
    """Request header lines, ready to send (encode constant headers once, up front).

    encode_headers({"Authorization": "Bearer t"})  # b'Authorization: Bearer t\\r\\n'
    """
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    lines = []
    for name, value in pairs:
        # A CR or LF would end the header early and let a value write headers of its own.
        if any(c in name for c in "\r\n:") or "\r" in value or "\n" in value:
            raise ValueError(f"invalid HTTP header {name!r}: {value!r}")
        lines.append(f"{name}: {value}\r\n")
    return "".join(lines).encode("latin-1")


class _Connection(asyncio.Protocol):
    """One keep-alive connection; at most one exchange in flight on it."""

    def __init__(self, max_body: int) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.max_body = max_body
        self.closed = False
        self.idle_since = 0.0
        self.head: asyncio.Future[None] | None = None  # set when the status and headers are in
        self.done: asyncio.Future[bytes] | None = None  # set with the body once it is complete
        self.status = 0
        self.headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._size = 0
        self._until_eof = False
        self._keep_alive = True

    # -- asyncio.Protocol ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        if self.done is None:  # nothing asked: a server talking out of turn
            self.abort()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as error:
            self._fail(TransportFailed(f"the server's answer is not HTTP/1.1: {error}"))

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        done = self.done
        if done is None or done.done():
            return
        if self._until_eof and self.head is not None and self.head.done():
            self._complete()  # a body without a length ends where the connection does
            return
        detail = f": {exc}" if exc else ""
        self._fail(TransportFailed(f"the server closed the connection mid-answer{detail}"))

    # -- httptools callbacks ------------------------------------------------------------------
    def on_message_begin(self) -> None:
        done = self.done
        if done is not None and done.done():
            # A second answer in the read that completed this one: the server talks out of
            # turn. Raising stops the parser before it overwrites the status and headers of
            # the answer just completed (data_received then drops the connection).
            raise TransportFailed("the server sent more than one answer")

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        previous = self.headers.get(key)
        self.headers[key] = text if previous is None else f"{previous}, {text}"

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if self.status < 200:  # 1xx: the real answer follows
            return
        self._keep_alive = self.parser.should_keep_alive()
        self._until_eof = (
            "content-length" not in self.headers
            and "chunked" not in self.headers.get("transfer-encoding", "").lower()
            and self.status not in _NO_BODY_STATUSES
        )
        if self._until_eof:
            self._keep_alive = False
        head = self.head
        if head is not None and not head.done():
            head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > self.max_body:
            self._fail(TransportFailed(f"the answer is larger than {self.max_body} bytes"))
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self.status < 200:  # 1xx: the real answer follows
            self.headers = {}
            return
        self._complete()

    # -- the exchange -------------------------------------------------------------------------
    def begin(self, loop: asyncio.AbstractEventLoop, data: bytes) -> None:
        self.head = loop.create_future()
        self.done = loop.create_future()
        self.status, self.headers, self._body, self._size = 0, {}, [], 0
        self._until_eof, self._keep_alive = False, True
        assert self.transport is not None
        self.transport.write(data)

    @property
    def reusable(self) -> bool:
        return self._keep_alive and not self.closed

    def _complete(self) -> None:
        done = self.done
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body = []
        if done is not None and not done.done():
            done.set_result(body)

    def _fail(self, error: BaseException) -> None:
        for future in (self.head, self.done):
            if future is not None and not future.done():
                future.set_exception(error)
                # Whoever awaits it gets the error; this keeps an unawaited one quiet.
                future.exception()
        self.abort()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class Exchange:
    """A response whose status and headers are in and whose body may still be coming (a
    server that holds its answer open). Read it with `read()`, or `close()` it."""

    def __init__(self, client: Http1Client, connection: _Connection) -> None:
        self._client = client
        self._connection: _Connection | None = connection
        self.status = connection.status
        self.headers: Mapping[str, str] = connection.headers

    async def read(self, timeout: float | None) -> bytes:  # noqa: ASYNC109 - one deadline
        """The body, once complete; `TimeoutError` after `timeout` seconds (the connection
        is then closed)."""
        connection = self._connection
        if connection is None:
            raise RuntimeError("this answer was already read or closed")
        self._connection = None
        assert connection.done is not None
        try:
            body = await _within(connection.done, timeout)
        except BaseException:
            self._client._discard(connection)  # mid-answer: it cannot carry another request
            raise
        self._client._release(connection)
        return body

    def close(self) -> None:
        """Give up on the body (the connection is closed)."""
        connection, self._connection = self._connection, None
        if connection is not None:
            self._client._discard(connection)


class Http1Client:
    """Requests to one server (`base_url`'s scheme, host and port; or `unix_socket`).

    With `handoff`, the process at `unix_socket` does not serve the connection itself: it
    sends a connected socket to the server back over it (one byte, SCM_RIGHTS), and that
    socket carries the requests. It closes the connection with nothing sent when it cannot
    reach the server: a failed connect.

    `keepalive_sec` is how long an idle connection is reused: keep it below the server's
    own keep-alive timeout (uvicorn's default is 5 s), so a request never lands on a
    connection the server is closing.
    """

    def __init__(
        self,
        base_url: str,
        *,
        unix_socket: str | None = None,
        handoff: bool = False,
        keepalive_sec: float = 2.0,
        connect_timeout: float = 10.0,
        max_body: int = DEFAULT_MAX_BODY,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self._tls = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._tls else 80)
        default_port = self._port == (443 if self._tls else 80)
        shown = f"[{self._host}]" if ":" in self._host else self._host
        self._host_line = f"Host: {shown}{'' if default_port else f':{self._port}'}\r\n".encode(
            "latin-1"
        )
        self.base_path = parts.path.rstrip("/")
        if handoff and unix_socket is None:
            raise ValueError("handoff needs the unix_socket that hands connections over")
        self._unix_socket = unix_socket
        self._handoff = handoff
        self._keepalive = keepalive_sec
        self._connect_timeout = connect_timeout
        self._max_body = max_body
        self._ssl = ssl_context if ssl_context is not None else (True if self._tls else None)
        self._idle: collections.deque[_Connection] = collections.deque()
        self._busy: set[_Connection] = set()
        self._closed = False

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes = b"",
        headers: bytes = b"",
        timeout: float | None,  # noqa: ASYNC109 - the whole exchange
    ) -> Reply:
        """Send one request and read the whole answer within `timeout` seconds."""
        connection = await self._send(method, path, body, headers)
        assert connection.done is not None
        try:
            data = await _within(connection.done, timeout)
        except BaseException:
            self._discard(connection)
            raise
        reply = Reply(connection.status, connection.headers, data)
        self._release(connection)
        return reply

    async def open(
        self,
        method: str,
        path: str,
        *,
        body: bytes = b"",
        headers: bytes = b"",
        timeout: float | None,  # noqa: ASYNC109 - until the status line and headers
    ) -> Exchange:
        """Send one request and return once its status and headers are in."""
        connection = await self._send(method, path, body, headers)
        assert connection.head is not None
        try:
            await _within(connection.head, timeout)
        except BaseException:
            self._discard(connection)
            raise
        return Exchange(self, connection)

    async def aclose(self) -> None:
        """Close every connection (answers still being read fail)."""
        self._closed = True
        for connection in [*self._idle, *self._busy]:
            connection.abort()
        self._idle.clear()
        self._busy.clear()

    # -- connections ---------------------------------------------------------------------------
    async def _send(self, method: str, path: str, body: bytes, headers: bytes) -> _Connection:
        if self._closed:
            raise ConnectFailed("the client is closed")
        loop = asyncio.get_running_loop()
        connection = self._reuse(loop.time()) or await self._connect(loop)
        head = f"{method} {self.base_path}{path} HTTP/1.1\r\n".encode("latin-1")
        length = b"Content-Length: %d\r\n" % len(body) if body or method != "GET" else b""
        self._busy.add(connection)
        connection.begin(loop, b"".join((head, self._host_line, length, headers, b"\r\n", body)))
        return connection

    def _reuse(self, now: float) -> _Connection | None:
        idle = self._idle
        while idle:
            connection = idle.pop()  # the most recently used: the least likely to be closing
            if not connection.closed and now - connection.idle_since < self._keepalive:
                return connection
            connection.abort()
        return None

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> _Connection:
        def factory() -> _Connection:
            return _Connection(self._max_body)

        try:
            async with asyncio.timeout(self._connect_timeout):
                if self._unix_socket is not None and self._handoff:
                    sock = await _handed_over(loop, self._unix_socket)
                    _, protocol = await loop.create_connection(factory, sock=sock)
                elif self._unix_socket is not None:
                    _, protocol = await loop.create_unix_connection(factory, self._unix_socket)
                else:
                    _, protocol = await loop.create_connection(
                        factory,
                        self._host,
                        self._port,
                        ssl=self._ssl,
                        server_hostname=self._host if self._tls else None,
                    )
        except TimeoutError as error:
            where = self._unix_socket or f"{self._host}:{self._port}"
            raise ConnectFailed(f"connecting to {where} timed out") from error
        except OSError as error:
            where = self._unix_socket or f"{self._host}:{self._port}"
            raise ConnectFailed(f"cannot connect to {where}: {error}") from error
        return protocol

    def _release(self, connection: _Connection) -> None:
        self._busy.discard(connection)
        if connection.reusable and not self._closed:
            connection.done = connection.head = None
            connection.idle_since = asyncio.get_running_loop().time()
            self._idle.append(connection)
        else:
            connection.abort()

    def _discard(self, connection: _Connection) -> None:
        self._busy.discard(connection)
        connection.abort()


async def _handed_over(loop: asyncio.AbstractEventLoop, path: str) -> socket.socket:
    """The connected socket the process at the Unix socket `path` sends (`Http1Client`'s
    `handoff`); `OSError` when it sends none or not a connected stream socket."""
    via = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        via.setblocking(False)
        await loop.sock_connect(via, path)
        try:
            # It connects first, then sends: the message is seldom in already.
            message = socket.recv_fds(via, 1, 1, socket.MSG_CMSG_CLOEXEC)
        except BlockingIOError:
            readable = loop.create_future()
            loop.add_reader(via.fileno(), _settle, readable)
            try:
                await readable
            finally:
                loop.remove_reader(via.fileno())
            message = socket.recv_fds(via, 1, 1, socket.MSG_CMSG_CLOEXEC)
    finally:
        via.close()
    sock = stream_socket(message[1])
    if sock is None:
        raise ConnectionRefusedError("no connection was handed over")
    return sock


def stream_socket(fds: list[int]) -> socket.socket | None:
    """The socket of the one descriptor a peer passed (SCM_RIGHTS) if it is a connected stream
    socket; anything else (another kind of file, a listening or an unconnected socket, a
    datagram socket) and any further descriptor is closed: None."""
    for extra in fds[1:]:
        os.close(extra)
    if not fds:
        return None
    try:
        sock = socket.socket(fileno=fds[0])
    except OSError:  # not a socket
        os.close(fds[0])
        return None
    try:
        if (
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE) == socket.SOCK_STREAM
            and not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
            and sock.getpeername() is not None  # OSError (ENOTCONN) when not connected
        ):
            sock.setblocking(False)
            return sock
    except OSError:
        pass
    sock.close()
    return None


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _within(
    future: asyncio.Future[_T],
    timeout: float | None,  # noqa: ASYNC109
) -> _T:
    if future.done() or timeout is None:
        return await future
    # A timer on the loop is cheaper than asyncio.timeout's context per request.
    loop = asyncio.get_running_loop()
    timer = loop.call_later(max(timeout, 0.0), _expire, future)
    try:
        return await future
    finally:
        timer.cancel()


def _expire(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_exception(TimeoutError("the server did not answer in time"))
