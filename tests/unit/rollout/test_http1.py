"""The lean HTTP/1.1 client (osmosis.rollout.http1) against loopback servers that write
bytes the tests choose: framings, keep-alive, and how each failure is sorted.

Every async test runs on asyncio's loop and on uvloop's (what the engine's hosts run):
their transports differ in the details this client leans on (end of stream, aborts).
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import socket
import ssl
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from osmosis.rollout.http1 import (
    ConnectFailed,
    Http1Client,
    TransportFailed,
    encode_headers,
)
from tests.unit.event_loops import on_each_loop

Handler = Callable[["RawServer", asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawServer:
    """A loopback server whose handler writes raw bytes; counts the connections it accepts
    and keeps each request it reads (head and body)."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.accepted = 0
        self.requests: list[tuple[bytes, bytes]] = []
        self.stopping = asyncio.Event()  # a handler that must hold waits for this
        self._server: asyncio.Server | None = None
        self.port = 0
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task[Any]] = set()

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        self.stopping.set()
        for writer in self._writers:
            writer.transport.abort()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=1)
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def read_request(self, reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        body = await reader.readexactly(length)
        self.requests.append((head, body))
        return head, body

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.append(writer)
        self.accepted += 1
        try:
            await self.handler(self, reader, writer)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away: what some tests are about
        except RuntimeError as error:  # uvloop's word for a write after the client left
            assert "closed" in str(error)
        finally:
            writer.transport.close()


def answering(*answers: bytes, close: bool = False) -> RawServer:
    """A server writing `answers` in turn, one per request it reads, on every connection
    (closing it after the first answer if `close`)."""

    async def handle(
        server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        for answer in answers:
            await server.read_request(reader)
            writer.write(answer)
            await writer.drain()
            if close:
                return
        await server.stopping.wait()

    return RawServer(handle)


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


# -- what is sent and what comes back ---------------------------------------------------------
@on_each_loop
async def test_a_request_carries_method_base_path_host_length_headers_and_body() -> None:
    async with answering(OK) as server:
        client = Http1Client(server.url + "/api/")
        headers = encode_headers({"Authorization": "Bearer t", "X-Trace": "1"})
        reply = await client.request("POST", "/rollout?x=1", body=b"{}", headers=headers, timeout=1)
        await client.aclose()

    assert reply.status == 200 and reply.body == b"ok"
    head, body = server.requests[0]
    assert head == (
        b"POST /api/rollout?x=1 HTTP/1.1\r\n"
        + b"Host: 127.0.0.1:%d\r\n" % server.port
        + b"Content-Length: 2\r\n"
        b"Authorization: Bearer t\r\nX-Trace: 1\r\n\r\n"
    )
    assert body == b"{}"


@on_each_loop
async def test_a_get_without_a_body_sends_no_length_and_a_post_without_one_sends_zero() -> None:
    async with answering(OK, OK) as server:
        client = Http1Client(server.url)
        await client.request("GET", "/a", timeout=1)
        await client.request("POST", "/b", timeout=1)
        await client.aclose()

    get_head, post_head = (head for head, _ in server.requests)
    assert b"content-length" not in get_head.lower()
    assert b"Content-Length: 0\r\n" in post_head


@on_each_loop
async def test_a_content_length_answer_comes_back_with_lowercased_and_joined_headers() -> None:
    answer = (
        b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
        b'Set-Thing: a\r\nSet-Thing: b\r\nContent-Length: 7\r\n\r\n{"a":1}'
    )
    async with answering(answer) as server:
        client = Http1Client(server.url)
        reply = await client.request("GET", "/", timeout=1)
        await client.aclose()

    assert reply.status == 201
    assert reply.headers["content-type"] == "application/json"
    assert reply.headers["set-thing"] == "a, b"
    assert reply.body == b'{"a":1}'


@on_each_loop
async def test_a_chunked_answer_sent_in_pieces_is_put_back_together() -> None:
    async def handle(
        server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await server.read_request(reader)
        pieces = [
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
            b"lo\r\n",
            b"6\r\n world\r\n0\r\n",
            b"\r\n",
        ]
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.01)
        await server.stopping.wait()

    async with RawServer(handle) as server:
        client = Http1Client(server.url)
        reply = await client.request("GET", "/", timeout=1)
        await client.aclose()

    assert reply.body == b"hello world"


@on_each_loop
async def test_an_answer_without_length_is_read_until_the_server_closes() -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it"
    async with answering(answer, close=True) as server:
        client = Http1Client(server.url)
        first = await client.request("GET", "/", timeout=1)
        second = await client.request("GET", "/", timeout=1)
        await client.aclose()

    assert first.body == second.body == b"all of it"
    assert server.accepted == 2  # a body ended by closing leaves nothing to reuse


@on_each_loop
async def test_204_and_304_answers_have_no_body_and_keep_the_connection() -> None:
    answers = (
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.1 304 Not Modified\r\nETag: x\r\n\r\n",
        OK,
    )
    async with answering(*answers) as server:
        client = Http1Client(server.url)
        replies = [await client.request("GET", "/", timeout=1) for _ in answers]
        await client.aclose()

    assert [(r.status, r.body) for r in replies] == [(204, b""), (304, b""), (200, b"ok")]
    assert server.accepted == 1


@on_each_loop
async def test_an_interim_100_answer_is_passed_over_for_the_real_one() -> None:
    answer = b"HTTP/1.1 100 Continue\r\nX-Interim: 1\r\n\r\n" + OK
    async with answering(answer) as server:
        client = Http1Client(server.url)
        reply = await client.request("POST", "/", body=b"data", timeout=1)
        await client.aclose()

    assert (reply.status, reply.body) == (200, b"ok")
    assert "x-interim" not in reply.headers


# -- keep-alive ---------------------------------------------------------------------------------
@on_each_loop
async def test_sequential_requests_reuse_one_keep_alive_connection() -> None:
    async with answering(*[OK] * 5) as server:
        client = Http1Client(server.url)
        for _ in range(5):
            assert (await client.request("GET", "/", timeout=1)).body == b"ok"
        await client.aclose()

    assert server.accepted == 1


@on_each_loop
async def test_an_answer_saying_connection_close_is_not_reused() -> None:
    answer = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
    async with answering(answer, close=True) as server:
        client = Http1Client(server.url)
        await client.request("GET", "/", timeout=1)
        await client.request("GET", "/", timeout=1)
        await client.aclose()

    assert server.accepted == 2


@on_each_loop
async def test_a_connection_idle_longer_than_keepalive_sec_is_not_reused() -> None:
    async with answering(OK, OK) as server:
        client = Http1Client(server.url, keepalive_sec=0.05)
        await client.request("GET", "/", timeout=1)
        await asyncio.sleep(0.1)
        await client.request("GET", "/", timeout=1)
        await client.aclose()

    assert server.accepted == 2


@on_each_loop
async def test_a_keep_alive_connection_the_server_closed_is_replaced_by_a_new_one() -> None:
    # The server answers as if keeping the connection, then closes it while it idles.
    async with answering(OK, close=True) as server:
        client = Http1Client(server.url)
        await client.request("GET", "/", timeout=1)
        await asyncio.sleep(0.05)  # the close reaches the client
        reply = await client.request("GET", "/", timeout=1)
        await client.aclose()

    assert reply.body == b"ok"
    assert server.accepted == 2


@on_each_loop
async def test_a_server_talking_out_of_turn_on_an_idle_connection_gets_it_dropped() -> None:
    async def handle(
        server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await server.read_request(reader)
        writer.write(OK)
        await asyncio.sleep(0.02)  # then, unasked (as a server timing the connection out):
        writer.write(b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        said.set()
        await server.stopping.wait()

    said = asyncio.Event()
    async with RawServer(handle) as server:
        client = Http1Client(server.url)
        await client.request("GET", "/", timeout=1)
        # In this order whatever the machine's load: the 408 is out before the next request.
        await said.wait()
        await asyncio.sleep(0.05)
        reply = await client.request("GET", "/", timeout=1)
        await client.aclose()

    assert reply.status == 200  # not the 408, which was nobody's answer
    assert server.accepted == 2


@on_each_loop
async def test_bytes_after_a_complete_answer_do_not_change_it_and_the_connection_is_dropped() -> (
    None
):
    extra = b"HTTP/1.1 500 Oops\r\nX-Extra: 1\r\nContent-Length: 0\r\n\r\n"
    async with answering(OK + extra, OK) as server:
        client = Http1Client(server.url)
        reply = await client.request("GET", "/", timeout=1)
        await asyncio.sleep(0.02)
        again = await client.request("GET", "/", timeout=1)
        await client.aclose()

    assert (reply.status, dict(reply.headers), reply.body) == (200, {"content-length": "2"}, b"ok")
    assert again.status == 200
    assert server.accepted == 2


# -- failures ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "partial",
    [
        b"",
        b"HTTP/1.1 200 OK\r\nContent-",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
    ],
    ids=["before-answering", "mid-head", "mid-length-body", "mid-chunked-body"],
)
@on_each_loop
async def test_a_server_closing_mid_answer_raises_transport_failed(partial: bytes) -> None:
    async with answering(partial, close=True) as server:
        client = Http1Client(server.url)
        with pytest.raises(TransportFailed) as raised:
            await client.request("POST", "/", body=b"x", timeout=1)
        await client.aclose()

    assert not isinstance(raised.value, ConnectFailed)  # the request may have been handled


@on_each_loop
async def test_an_answer_that_is_not_http_raises_transport_failed() -> None:
    async with answering(b"SSH-2.0-OpenSSH_9.6\r\n\r\n") as server:
        client = Http1Client(server.url)
        with pytest.raises(TransportFailed, match=r"not HTTP/1\.1"):
            await client.request("GET", "/", timeout=1)
        await client.aclose()


@on_each_loop
async def test_a_refused_port_raises_connect_failed() -> None:
    with socket.socket() as bound:  # bound, never listening: connections are refused
        bound.bind(("127.0.0.1", 0))
        client = Http1Client(f"http://127.0.0.1:{bound.getsockname()[1]}")
        with pytest.raises(ConnectFailed, match="cannot connect"):
            await client.request("GET", "/", timeout=1)
        await client.aclose()


@on_each_loop
async def test_a_connection_not_accepted_in_connect_timeout_raises_connect_failed() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(0)
        port = listening.getsockname()[1]
        # Fill the accept queue, never accepted: the kernel drops further handshakes.
        fillers = [socket.socket() for _ in range(3)]
        for filler in fillers:
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
        try:
            client = Http1Client(f"http://127.0.0.1:{port}", connect_timeout=0.1)
            with pytest.raises(ConnectFailed, match="timed out"):
                await client.request("GET", "/", timeout=1)
            await client.aclose()
        finally:
            for filler in fillers:
                filler.close()


@on_each_loop
async def test_a_server_that_never_answers_raises_timeout_and_the_connection_is_dropped() -> None:
    async def handle(
        server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        first = server.accepted == 1
        await server.read_request(reader)
        if first:
            await asyncio.sleep(0.15)  # past the client's timeout
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlate")
        else:
            writer.write(OK)
        await server.stopping.wait()

    async with RawServer(handle) as server:
        client = Http1Client(server.url)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(TimeoutError):
            await client.request("GET", "/", timeout=0.1)
        assert 0.09 <= loop.time() - started < 0.5
        await asyncio.sleep(0.1)  # the late answer is out by now
        reply = await client.request("GET", "/", timeout=1)
        await client.aclose()

    assert reply.body == b"ok"  # the late answer is not taken for the next one's
    assert server.accepted == 2


@on_each_loop
async def test_a_cancelled_request_drops_its_connection() -> None:
    async def handle(
        server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        first = server.accepted == 1
        await server.read_request(reader)
        if first:
            await asyncio.sleep(0.1)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlate")
            await server.stopping.wait()
        writer.write(OK)
        await server.stopping.wait()

    async with RawServer(handle) as server:
        client = Http1Client(server.url)
        pending = asyncio.ensure_future(client.request("GET", "/", timeout=None))
        await asyncio.sleep(0.02)
        pending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pending
        reply = await client.request("GET", "/", timeout=1)
        await client.aclose()

    assert reply.body == b"ok"
    assert server.accepted == 2


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n0123456789a",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"6\r\n012345\r\n5\r\n6789a\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n\r\n0123456789a",
    ],
    ids=["content-length", "chunked", "until-close"],
)
@on_each_loop
async def test_an_answer_larger_than_max_body_raises_transport_failed(answer: bytes) -> None:
    async with answering(answer, close=True) as server:
        client = Http1Client(server.url, max_body=10)
        with pytest.raises(TransportFailed, match="larger than 10 bytes"):
            await client.request("GET", "/", timeout=1)
        roomy = Http1Client(server.url, max_body=11)
        assert (await roomy.request("GET", "/", timeout=1)).body == b"0123456789a"
        await client.aclose()
        await roomy.aclose()


@on_each_loop
async def test_a_closed_client_refuses_requests_and_fails_the_one_in_flight() -> None:
    async def handle(
        server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await server.read_request(reader)
        await server.stopping.wait()

    async with RawServer(handle) as server:
        client = Http1Client(server.url)
        pending = asyncio.ensure_future(client.request("GET", "/", timeout=1))
        await asyncio.sleep(0.02)
        await client.aclose()
        with pytest.raises(TransportFailed):
            await pending
        with pytest.raises(ConnectFailed, match="closed"):
            await client.request("GET", "/", timeout=1)


# -- answers read as they come ------------------------------------------------------------------
@on_each_loop
async def test_open_returns_at_the_head_and_read_waits_for_the_rest() -> None:
    release = asyncio.Event()

    async def handle(
        server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        for _ in range(2):
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\none\r\n")
            await release.wait()
            writer.write(b"3\r\ntwo\r\n0\r\n\r\n")
        await server.stopping.wait()

    async with RawServer(handle) as server:
        client = Http1Client(server.url)
        exchange = await client.open("GET", "/", timeout=1)
        assert exchange.status == 200
        assert exchange.headers["transfer-encoding"] == "chunked"
        release.set()
        assert await exchange.read(timeout=1) == b"onetwo"
        with pytest.raises(RuntimeError):
            await exchange.read(timeout=1)
        again = await client.open("GET", "/", timeout=1)
        assert await again.read(timeout=1) == b"onetwo"
        await client.aclose()

    assert server.accepted == 1  # a body read whole gives the connection back


@on_each_loop
async def test_an_exchange_read_past_its_timeout_or_closed_drops_the_connection() -> None:
    async def handle(
        server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart")
        await server.stopping.wait()

    async with RawServer(handle) as server:
        client = Http1Client(server.url)
        held = await client.open("GET", "/", timeout=1)
        with pytest.raises(TimeoutError):
            await held.read(timeout=0.05)
        dropped = await client.open("GET", "/", timeout=1)
        dropped.close()
        dropped.close()  # again: nothing left to do
        await client.open("GET", "/", timeout=1)
        await client.aclose()

    assert server.accepted == 3


@on_each_loop
async def test_an_exchange_whose_server_closes_mid_body_raises_transport_failed() -> None:
    async def handle(
        server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart")
        await asyncio.sleep(0.05)

    async with RawServer(handle) as server:
        client = Http1Client(server.url)
        exchange = await client.open("GET", "/", timeout=1)
        with pytest.raises(TransportFailed, match="mid-answer"):
            await exchange.read(timeout=1)
        await client.aclose()


@on_each_loop
async def test_open_times_out_when_the_head_does_not_come() -> None:
    async def handle(
        server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n")  # and never the rest of the head
        await server.stopping.wait()

    async with RawServer(handle) as server:
        client = Http1Client(server.url)
        with pytest.raises(TimeoutError):
            await client.open("GET", "/", timeout=0.05)
        await client.aclose()


# -- other transports ----------------------------------------------------------------------------
@pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="no Unix sockets here")
@on_each_loop
async def test_requests_go_over_a_unix_socket_and_reuse_it() -> None:
    accepted = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        for _ in range(2):
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")
            writer.write(OK)
        await writer.drain()
        writer.close()

    with tempfile.TemporaryDirectory(dir="/tmp") as directory:
        path = str(Path(directory) / "s")
        server = await asyncio.start_unix_server(handle, path)
        async with server:
            client = Http1Client("http://localhost", unix_socket=path)
            for _ in range(2):
                assert (await client.request("GET", "/health", timeout=1)).body == b"ok"
            await client.aclose()

    assert accepted == 1


def _self_signed() -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem = certificate.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return pem, key_pem


@on_each_loop
async def test_https_speaks_tls_and_checks_the_servers_certificate() -> None:
    pem, key_pem = _self_signed()
    with tempfile.TemporaryDirectory() as directory:
        cert_file, key_file = Path(directory) / "cert.pem", Path(directory) / "key.pem"
        cert_file.write_bytes(pem)
        key_file.write_bytes(key_pem)
        served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        served.load_cert_chain(cert_file, key_file)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"GET /secure HTTP/1.1\r\n")
            writer.write(OK)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass  # the client that does not trust the certificate hangs up
        finally:
            writer.transport.abort()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=served)
    async with server:
        url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        trusting = ssl.create_default_context(cadata=pem.decode())
        client = Http1Client(url, ssl_context=trusting)
        assert (await client.request("GET", "/secure", timeout=1)).body == b"ok"
        await client.aclose()

        doubting = Http1Client(url, ssl_context=ssl.create_default_context())
        with pytest.raises(ConnectFailed, match="certificate"):
            await doubting.request("GET", "/secure", timeout=1)
        await doubting.aclose()
        await asyncio.sleep(0.01)  # the handlers see the clients go


# -- what is refused before anything is sent -----------------------------------------------------
def test_encode_headers_writes_one_line_per_header_from_a_mapping_or_pairs() -> None:
    assert encode_headers({"Authorization": "Bearer t"}) == b"Authorization: Bearer t\r\n"
    assert encode_headers([("X-A", "1"), ("X-A", "2")]) == b"X-A: 1\r\nX-A: 2\r\n"
    assert encode_headers({}) == b""


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("X-A", "1\r\nX-Injected: yes"),
        ("X-A", "1\nX-Injected: yes"),
        ("X-A", "1\rX"),
        ("X-A\r\nX-Injected", "yes"),
        ("X-A: yes\r\nX-B", "1"),
        ("X-A:", "1"),
    ],
    ids=[
        "crlf-in-value",
        "lf-in-value",
        "cr-in-value",
        "crlf-in-name",
        "colon-crlf-in-name",
        "colon-in-name",
    ],
)
def test_encode_headers_refuses_what_would_end_a_header_line_early(name: str, value: str) -> None:
    with pytest.raises(ValueError, match="invalid HTTP header"):
        encode_headers({name: value})


@pytest.mark.parametrize("url", ["ftp://host/", "http://", "localhost:8000", "/path"])
def test_a_client_needs_an_http_or_https_url_with_a_host(url: str) -> None:
    with pytest.raises(ValueError, match="not an http"):
        Http1Client(url)


@on_each_loop
async def test_an_ipv6_server_is_reached_and_named_in_brackets_in_host() -> None:
    heads: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(OK)
        await writer.drain()
        writer.close()

    try:
        server = await asyncio.start_server(handle, "::1", 0)
    except OSError:
        pytest.skip("no IPv6 loopback here")
    async with server:
        port = server.sockets[0].getsockname()[1]
        client = Http1Client(f"http://[::1]:{port}")
        assert (await client.request("GET", "/", timeout=1)).body == b"ok"
        await client.aclose()

    assert f"Host: [::1]:{port}\r\n".encode() in heads[0]
