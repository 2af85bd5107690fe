"""A lean HTTP/1.1 server on asyncio protocols: keep-alive, Content-Length and chunked bodies.

Why not uvicorn + FastAPI: the fake model must serve well over 1,000 requests/s on one core so
that a benchmark of the engine measures the engine, not the fake. A framework stack spends most
of that budget on routing and validation the fake does not need. This module parses just enough
HTTP for OpenAI clients (httpx, aiohttp, curl) and hands each request to one async handler.

Requests on one connection are answered in order, one at a time, so pipelining is safe.

    async def handler(request: Request) -> Response | StreamResponse:
        return Response(200, b"ok", content_type="text/plain")

    server = await serve(handler, "127.0.0.1", 0)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024

# Reason phrases are looked up once, not per response.
_REASONS = {status.value: status.phrase for status in HTTPStatus}


@dataclass(frozen=True)
class Request:
    """One parsed HTTP request; header names are lower-case."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool


@dataclass(frozen=True)
class Response:
    """A complete response, sent with a Content-Length."""

    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: Sequence[tuple[str, str]] = ()


@dataclass(frozen=True)
class StreamResponse:
    """A response whose body is produced piece by piece and sent with chunked encoding."""

    status: int
    chunks: AsyncIterator[bytes]
    content_type: str = "text/event-stream"
    headers: Sequence[tuple[str, str]] = ()


Handler = Callable[[Request], Awaitable[Response | StreamResponse]]


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _head(
    status: int, content_type: str, headers: Sequence[tuple[str, str]], keep_alive: bool
) -> list[str]:
    lines = [
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}",
        f"Content-Type: {content_type}",
    ]
    lines.extend(f"{name}: {value}" for name, value in headers)
    if not keep_alive:
        lines.append("Connection: close")
    return lines


def encode_response(response: Response, keep_alive: bool) -> bytes:
    """The bytes of a complete response."""
    lines = _head(response.status, response.content_type, response.headers, keep_alive)
    lines.append(f"Content-Length: {len(response.body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + response.body


def _decode_chunked(data: bytearray, start: int) -> tuple[bytes, int] | None:
    """Decode a chunked body starting at `start`; None while it is incomplete."""
    body = bytearray()
    pos = start
    while True:
        line_end = data.find(b"\r\n", pos)
        if line_end < 0:
            return None
        size_text = bytes(data[pos:line_end]).split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise _BadRequest(400, "malformed chunk size") from None
        pos = line_end + 2
        if size == 0:
            # Trailers are not used by any client we serve; skip to the blank line.
            end = data.find(b"\r\n\r\n", pos - 2)
            return (bytes(body), end + 4) if end >= 0 else None
        if len(data) < pos + size + 2:
            return None
        body += data[pos : pos + size]
        if len(body) > MAX_BODY_BYTES:
            raise _BadRequest(413, "request body too large")
        pos += size + 2


class _Connection(asyncio.Protocol):
    """One client connection: parse requests from the buffer and answer them in order."""

    def __init__(self, handler: Handler, connections: set[_Connection]) -> None:
        self._handler = handler
        self._connections = connections
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._task: asyncio.Task[None] | None = None
        self._sent_continue = False

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._connections.discard(self)
        self._transport = None
        if self._task is not None:
            self._task.cancel()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._task is None:
            self._next()

    # -- requests --------------------------------------------------------------------------
    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _next(self) -> None:
        """Start answering the next buffered request, if a whole one has arrived."""
        try:
            request = self._parse()
        except _BadRequest as error:
            self._write(
                encode_response(Response(error.status, str(error).encode(), "text/plain"), False)
            )
            self.close()
            return
        if request is not None:
            self._task = asyncio.get_running_loop().create_task(self._answer(request))

    def _parse(self) -> Request | None:
        buffer = self._buffer
        head_end = buffer.find(b"\r\n\r\n")
        if head_end < 0:
            if len(buffer) > MAX_HEAD_BYTES:
                raise _BadRequest(431, "request head too large")
            return None
        lines = bytes(buffer[:head_end]).decode("latin-1").split("\r\n")
        try:
            method, target, version = lines[0].split(" ", 2)
        except ValueError:
            raise _BadRequest(400, "malformed request line") from None
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise _BadRequest(400, "malformed header")
            headers[name.strip().lower()] = value.strip()

        body_start = head_end + 4
        if "chunked" in headers.get("transfer-encoding", "").lower():
            decoded = _decode_chunked(buffer, body_start)
            if decoded is None:
                self._maybe_continue(headers)
                return None
            body, end = decoded
        else:
            try:
                length = int(headers.get("content-length", "0"))
            except ValueError:
                raise _BadRequest(400, "malformed Content-Length") from None
            if length < 0 or length > MAX_BODY_BYTES:
                raise _BadRequest(413, "request body too large")
            end = body_start + length
            if len(buffer) < end:
                self._maybe_continue(headers)
                return None
            body = bytes(buffer[body_start:end])
        del buffer[:end]
        self._sent_continue = False

        connection = headers.get("connection", "").lower()
        # HTTP/1.1 keeps the connection open unless told otherwise; HTTP/1.0 only if asked.
        keep_alive = connection == "keep-alive" if version == "HTTP/1.0" else connection != "close"
        path, _, query = target.partition("?")
        return Request(method.upper(), path, query, headers, body, keep_alive)

    def _maybe_continue(self, headers: dict[str, str]) -> None:
        # curl waits up to a second for this before sending a large body.
        if not self._sent_continue and headers.get("expect", "").lower() == "100-continue":
            self._sent_continue = True
            self._write(b"HTTP/1.1 100 Continue\r\n\r\n")

    async def _answer(self, request: Request) -> None:
        try:
            response = await self._handler(request)
        except Exception as error:  # a bug in the handler must not kill the connection silently
            message = f'{{"error": {{"message": "internal error: {type(error).__name__}"}}}}'
            response = Response(500, message.encode())
        if isinstance(response, Response):
            self._write(encode_response(response, request.keep_alive))
        else:
            await self._stream(response, request.keep_alive)
        self._task = None
        if not request.keep_alive:
            self.close()
        elif self._transport is not None:
            self._next()

    async def _stream(self, response: StreamResponse, keep_alive: bool) -> None:
        lines = _head(response.status, response.content_type, response.headers, keep_alive)
        lines += ["Cache-Control: no-cache", "Transfer-Encoding: chunked"]
        self._write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        async for chunk in response.chunks:
            if chunk:
                self._write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
        self._write(b"0\r\n\r\n")

    def _write(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)


class HttpServer:
    """A listening server; `close()` also drops idle keep-alive connections."""

    def __init__(self, server: asyncio.Server, connections: set[_Connection]) -> None:
        self._server = server
        self._connections = connections

    @property
    def port(self) -> int:
        """The bound port (useful after binding port 0)."""
        sockets = self._server.sockets
        return int(sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop listening, close every connection and cancel requests in flight."""
        self._server.close()
        for connection in list(self._connections):
            connection.close()
        await self._server.wait_closed()
        # Let connection_lost callbacks run so cancelled handler tasks finish before the loop ends.
        await asyncio.sleep(0)


async def serve(handler: Handler, host: str, port: int) -> HttpServer:
    """Listen on (host, port) and answer every request with `handler`."""
    connections: set[_Connection] = set()
    server = await asyncio.get_running_loop().create_server(
        lambda: _Connection(handler, connections),
        host,
        port,
        reuse_address=True,
        # As uvicorn (vLLM, SGLang) listens: asyncio's default of 100 drops SYNs when
        # hundreds of clients connect at once, a one-second stall no real server has.
        backlog=2048,
    )
    return HttpServer(server, connections)
