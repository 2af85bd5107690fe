"""The network shim that runs inside a rollout's sandbox, in front of the rollout server.

Standalone on purpose: it runs under the rollout's own interpreter (`python -I -S shim.py`),
which may be an `osmosis-ai` venv without our package, so it imports the standard library only
and keeps to syntax every supported Python reads.

    python -I -S shim.py --listen-fd 3 --rollout-port 8000 \\
        --bridge-port 41234 --bridge-socket /run/osmosis/bridge/bridge.sock \\
        --rlimit FSIZE=1073741824 -- python main.py

The sandbox has a network namespace of its own with only a loopback, so the rollout server
still binds `127.0.0.1:$_OSMOSIS_ROLLOUT_PORT` and calls the bridge at the rollout-scoped URL on
`127.0.0.1:<bridge port>`, unchanged. The shim joins that loopback to the engine:

- engine -> rollout: the engine listens on a Unix socket outside the sandbox and hands the
  listening descriptor over (`--listen-fd`); each connection accepted on it is forwarded to
  `127.0.0.1:<rollout port>`. The socket's path is never visible inside, so the rollout cannot
  swap it for a link to another socket.
- rollout -> bridge: the shim listens on `127.0.0.1:<bridge port>` and forwards each
  connection to the bridge's Unix socket, bound read-only into the sandbox.

An environment build uses the second half alone (no `--listen-fd`): its uv reaches the package
proxy's socket through `127.0.0.1:<port>` (`package_index`).

It starts the rollout server as its child with the given resource limits (`--rlimit NAME=N`,
soft limit; the hard limit is set a little above so a signal comes first), forwards SIGTERM
and SIGINT to it, and exits with its status (128 + signal number when a signal killed it).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import resource
import signal
import socket
import subprocess
import sys
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio  # imported by `_import_asyncio`, once the rollout server is starting

    _Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]

_CHUNK = 256 * 1024
# As uvicorn listens: asyncio's default (100) drops a burst of hundreds of connections (TCP)
# or refuses it (a Unix socket), and the first wave of a run is such a burst.
_BACKLOG = 2048
_HARD_MARGIN = {"CPU": 5}  # seconds between SIGXCPU (soft) and SIGKILL (hard)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="osmosis-sandbox-shim")
    parser.add_argument("--listen-fd", type=int)
    parser.add_argument("--rollout-port", type=int)
    parser.add_argument("--bridge-port", type=int)
    parser.add_argument("--bridge-socket")
    parser.add_argument("--rlimit", action="append", default=[])
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("the rollout server's command is missing (after --)")
    if (args.listen_fd is None) != (args.rollout_port is None):
        parser.error("--listen-fd and --rollout-port go together")
    limits = [_parse_limit(text) for text in args.rlimit]
    child = None
    if args.listen_fd is not None:
        # A rollout server starts first: its interpreter and imports (~0.5 s) overlap the
        # shim's own (asyncio, ~50 ms) and its listeners. The engine's connections wait in
        # the listening socket's backlog meanwhile, and nothing calls the bridge before the
        # engine dispatches. An environment build (no --listen-fd) may reach the package
        # proxy at once: its listener comes first.
        child = _spawn(command, limits)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda received, _frame: _relay(child, received))
    _import_asyncio()
    return asyncio.run(_serve(args, command, limits, child))


def _import_asyncio() -> None:
    globals()["asyncio"] = importlib.import_module("asyncio")


def _spawn(command: list[str], limits: list[tuple[int, str, int]]) -> subprocess.Popen[Any]:
    """The rollout server (or the build), under its resource limits."""

    def set_limits() -> None:
        for kind, name, value in limits:
            resource.setrlimit(kind, (value, value + _HARD_MARGIN.get(name, 0)))

    # The listening descriptor stays with the shim (close_fds): the rollout never holds it.
    # The readiness pipe goes on to the rollout, and the shim keeps no copy of it, so that
    # its end of file still means the rollout exited.
    ready = _ready_fd()
    child = subprocess.Popen(
        command, preexec_fn=set_limits, close_fds=True, pass_fds=() if ready is None else (ready,)
    )
    if ready is not None:
        os.close(ready)
    return child


def _parse_limit(text: str) -> tuple[int, str, int]:
    name, _, value = text.partition("=")
    kind: int = getattr(resource, "RLIMIT_" + name.upper())
    return kind, name.upper(), int(value)


async def _serve(
    args: argparse.Namespace,
    command: list[str],
    limits: list[tuple[int, str, int]],
    child: subprocess.Popen[Any] | None,
) -> int:
    loop = asyncio.get_running_loop()
    servers: list[asyncio.AbstractServer] = []
    if args.listen_fd is not None:  # absent for an environment build: nobody calls in
        engine_side = socket.socket(fileno=args.listen_fd)
        engine_side.setblocking(False)
        servers.append(
            await asyncio.start_unix_server(
                lambda r, w: _forward(r, w, _connect_tcp("127.0.0.1", args.rollout_port)),
                sock=engine_side,
                backlog=_BACKLOG,
            )
        )
    if args.bridge_port and args.bridge_socket:
        servers.append(
            await asyncio.start_server(
                lambda r, w: _forward(r, w, _connect_unix(args.bridge_socket)),
                host="127.0.0.1",
                port=args.bridge_port,
                reuse_address=True,
                backlog=_BACKLOG,
            )
        )

    if child is None:
        child = _spawn(command, limits)
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, _relay, child, signum)
    code = await loop.run_in_executor(None, child.wait)
    for server in servers:
        server.close()
    return 128 - code if code < 0 else code


def _ready_fd() -> int | None:
    """The readiness pipe the engine handed down (`_OSMOSIS_ROLLOUT_READY_FD`), if any."""
    try:
        fd = int(os.environ.get("_OSMOSIS_ROLLOUT_READY_FD", ""))
        os.fstat(fd)
    except (ValueError, OSError):
        return None
    return fd


def _relay(child: subprocess.Popen[Any], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        child.send_signal(signum)


async def _connect_tcp(host: str, port: int) -> _Streams:
    return await asyncio.open_connection(host, port, limit=_CHUNK)


async def _connect_unix(path: str) -> _Streams:
    return await asyncio.open_unix_connection(path, limit=_CHUNK)


async def _forward(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, connect: Awaitable[_Streams]
) -> None:
    try:
        upstream_reader, upstream_writer = await connect
    except OSError:
        writer.close()  # nothing listens yet (the server is starting): the caller retries
        return
    await asyncio.gather(
        _pipe(reader, upstream_writer),
        _pipe(upstream_reader, writer),
        return_exceptions=True,
    )
    for side in (writer, upstream_writer):
        side.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await reader.read(_CHUNK)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()  # half-close: the other direction may still carry a response
    except (ConnectionError, OSError):
        writer.close()


if __name__ == "__main__":
    sys.exit(main())
