"""Requests per second of the fake model server, beside baselines measured the same way.

    .venv/bin/python bench/fake_model.py [--seconds 3] [--connections 32]

Each server runs in its own process pinned to CPU 0 (`taskset`-style, via sched_setaffinity);
the load generator is this process, pinned to CPU 1, so its work does not count against the
server. The client keeps `--connections` HTTP/1.1 keep-alive connections busy, one request in
flight on each, and counts complete responses after a short warm-up.

Rows:
    static        our HTTP layer answering a fixed body: the ceiling for the fake model
    fake-model    POST /v1/chat/completions, an arithmetic question, non-streaming
    fake-stream   the same with stream=true (server-sent events, chunked)
    fake-tools    the same with a tool offered (answered with a tool call)
    fastapi       FastAPI + uvicorn answering a fixed JSON body (for reference), if installed
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, bench/ comes first on sys.path, and bench/platform.py would shadow the
# standard library's `platform` (which aiohttp, httpx and uuid import).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]
# ruff: noqa: E402

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

SERVER_CPU = 0
CLIENT_CPU = 1
WARMUP_SECONDS = 0.5

_QUESTION = {"model": "bench", "messages": [{"role": "user", "content": "What is 17 * 23?"}]}
_TOOL = {
    "type": "function",
    "function": {
        "name": "multiply",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        },
    },
}
BODIES = {
    "static": _QUESTION,
    "fake-model": _QUESTION,
    "fake-stream": {**_QUESTION, "stream": True},
    "fake-tools": {**_QUESTION, "tools": [_TOOL]},
    "fastapi": _QUESTION,
}


# -- servers (run in a child process) ------------------------------------------------------
async def _serve(kind: str) -> None:
    if kind == "static":
        from osmosis.testing._http import Request, Response, serve

        body = json.dumps({"choices": [{"message": {"content": "391"}}]}).encode()

        async def handler(request: Request) -> Response:
            return Response(200, body)

        server = await serve(handler, "127.0.0.1", 0)
        port = server.port
    else:
        from osmosis.testing import FakeModelServer

        fake = await FakeModelServer().start_async()
        port = fake.port
    print(port, flush=True)
    await asyncio.Event().wait()


def _serve_fastapi() -> None:
    import socket

    import uvicorn
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def complete() -> dict[str, object]:
        return {"choices": [{"message": {"content": "391"}}]}

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # accept into the backlog before uvicorn starts, so the port is live
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])


def _start_server(kind: str) -> tuple[subprocess.Popen[str], int]:
    command = [sys.executable, __file__, "--serve", "fastapi" if kind == "fastapi" else kind]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    port = int(process.stdout.readline())
    return process, port


# -- load generator --------------------------------------------------------------------------
@dataclass
class _Tally:
    done: int = 0
    failed: int = 0  # non-200 answers: a rate of errors would be a meaningless figure
    counting: bool = False


class _Client(asyncio.Protocol):
    """One keep-alive connection with one request in flight; re-sends on every response."""

    def __init__(self, request: bytes, tally: _Tally, chunked: bool) -> None:
        self.request = request
        self.tally = tally
        self.chunked = chunked
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self.request)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            ok = self.buffer.startswith(b"HTTP/1.1 200 ")
            if not self._complete():
                break
            if self.tally.counting:
                self.tally.done += 1
                self.tally.failed += not ok
            assert self.transport is not None
            self.transport.write(self.request)

    def _complete(self) -> bool:
        head_end = self.buffer.find(b"\r\n\r\n")
        if head_end < 0:
            return False
        if self.chunked:
            end = self.buffer.find(b"\r\n0\r\n\r\n", head_end)
            if end < 0:
                return False
            del self.buffer[: end + 7]
            return True
        head = bytes(self.buffer[:head_end]).lower()
        start = head.index(b"content-length:") + len(b"content-length:")
        length = int(head[start : head.index(b"\r\n", start) if b"\r\n" in head[start:] else None])
        if len(self.buffer) < head_end + 4 + length:
            return False
        del self.buffer[: head_end + 4 + length]
        return True


async def _load(port: int, kind: str, seconds: float, connections: int) -> tuple[float, int]:
    body = json.dumps(BODIES[kind]).encode()
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    tally = _Tally()
    loop = asyncio.get_running_loop()
    clients = []
    for _ in range(connections):
        _, client = await loop.create_connection(
            lambda: _Client(request, tally, chunked=kind == "fake-stream"), "127.0.0.1", port
        )
        clients.append(client)
    await asyncio.sleep(WARMUP_SECONDS)
    tally.counting = True
    started = time.perf_counter()
    await asyncio.sleep(seconds)
    tally.counting = False
    elapsed = time.perf_counter() - started
    for client in clients:
        assert client.transport is not None
        client.transport.close()
    await asyncio.gather(*(client.lost for client in clients))
    return tally.done / elapsed, tally.failed


def _available(kind: str) -> bool:
    if kind != "fastapi":
        return True
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per row")
    parser.add_argument("--connections", type=int, default=32, help="keep-alive connections")
    parser.add_argument("--only", nargs="*", choices=sorted(BODIES), help="rows to run")
    parser.add_argument("--serve", choices=sorted(BODIES), help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.serve is not None:
        if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
            os.sched_setaffinity(0, {SERVER_CPU})
        if args.serve == "fastapi":
            _serve_fastapi()
        else:
            asyncio.run(_serve(args.serve))
        return

    pinned = hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1
    if pinned:
        os.sched_setaffinity(0, {CLIENT_CPU})
    print(
        f"server on CPU {SERVER_CPU}, client on CPU {CLIENT_CPU}" if pinned else "not pinned",
        f"{args.connections} keep-alive connections, {args.seconds:g} s per row",
        sep="; ",
    )
    for kind in args.only or list(BODIES):
        if not _available(kind):
            print(f"{kind:<12} skipped (not installed)")
            continue
        process, port = _start_server(kind)
        try:
            rate, failed = asyncio.run(_load(port, kind, args.seconds, args.connections))
        finally:
            process.terminate()
            process.wait()
        note = f"  ({failed} answers were not 200!)" if failed else ""
        print(f"{kind:<12} {rate:>9,.0f} requests/s{note}")


if __name__ == "__main__":
    main()
