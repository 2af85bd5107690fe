"""What makes the sandbox cheap keeps it correct (issue 30): the bridge answers the connections
handed to it itself, and the shim runs as bytecode compiled for the rollout's interpreter.

Real sockets, a real `AsgiServer` (the bridge's HTTP server), real bwrap and rollout servers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import marshal
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import uvloop

from osmosis.eval.model.bridge_http import AsgiServer
from osmosis.eval.sites.sandbox import SandboxPolicy, layout
from osmosis.eval.sites.sandbox.launcher import SHIM_SOURCE
from osmosis.eval.sites.sandbox.layout import compile_shim, shim_bytecode, shim_cache_dir
from osmosis.eval.sites.sandbox.network import BridgeForwarder
from osmosis.eval.sites.sandbox.site import SandboxEndpoint
from osmosis.eval.sites.sandbox.support import SandboxUnavailable
from tests.integration.test_sandbox import site_for
from tests.unit.eval.sites.test_bridge_forwarder import open_handed_over


async def _who_asked(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An ASGI app that answers who connected to it: the client address it was given."""
    client = scope["client"]
    body = json.dumps({"client": list(client) if client else None}).encode()
    headers = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _get_over(path: Path) -> dict[str, Any]:
    reader, writer = await open_handed_over(path)
    writer.write(b"GET /v1/x HTTP/1.1\r\nhost: bridge\r\nconnection: close\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    document: dict[str, Any] = json.loads(body)
    return document


async def _listen(server: AsgiServer) -> int:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    await server.start(sock)
    port: int = sock.getsockname()[1]
    return port


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])  # the engine runs on uvloop
def test_the_bridge_in_the_engines_loop_answers_a_handed_over_connection_itself(tmp_path, loop):
    async def main() -> None:
        bridge = AsgiServer(_who_asked)  # type: ignore[arg-type]
        port = await _listen(bridge)
        socket_path = tmp_path / "handoff.sock"
        forwarder = await BridgeForwarder.start(socket_path, "127.0.0.1", port)
        try:
            # The handed-over socket itself, with no second connection made to reach it: a
            # socket pair's, so no client address.
            assert await _get_over(socket_path) == {"client": None}
            await bridge.stop()
            # A bridge that stopped is not reached through the socket any more.
            reader, writer = await open_handed_over(socket_path)
            writer.write(b"GET /v1/x HTTP/1.1\r\nhost: bridge\r\n\r\n")
            # An end of file, or a reset (a broken pipe: closed before the request was written)
            with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                assert await asyncio.wait_for(reader.read(), 10) == b""
            writer.close()
        finally:
            await forwarder.stop()
            await bridge.stop()

    (uvloop.run if loop == "uvloop" else asyncio.run)(main())


def test_a_bridge_in_another_event_loop_is_still_reached_over_its_tcp_port(tmp_path):
    """A bridge this loop does not run (another thread's, another process's): forwarded."""
    ready: concurrent.futures.Future[int] = concurrent.futures.Future()
    finished = threading.Event()

    def other_loop() -> None:
        async def serve() -> None:
            bridge = AsgiServer(_who_asked)  # type: ignore[arg-type]
            ready.set_result(await _listen(bridge))
            await asyncio.to_thread(finished.wait, 30)
            await bridge.stop()

        asyncio.run(serve())

    thread = threading.Thread(target=other_loop)
    thread.start()

    async def main() -> None:
        port = await asyncio.wrap_future(ready)
        socket_path = tmp_path / "handoff.sock"
        forwarder = await BridgeForwarder.start(socket_path, "127.0.0.1", port)
        try:
            answer = await _get_over(socket_path)
            assert answer["client"][0] == "127.0.0.1"  # forwarded: it came as a TCP client
        finally:
            await forwarder.stop()

    try:
        asyncio.run(main())
    finally:
        finished.set()
        thread.join(30)


def test_the_shim_is_compiled_only_for_the_interpreter_that_runs_it(tmp_path):
    # A venv's bin/python links to the interpreter it was made from: this one.
    venv_python = tmp_path / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.symlink_to(Path(sys.executable).resolve())
    compiled = compile_shim(SHIM_SOURCE, venv_python, tmp_path / "shim.pyc")
    assert compiled == tmp_path / "shim.pyc"
    # The bytecode is the shim: run with no command, it says its usage, as the source does.
    ran = subprocess.run(
        [str(venv_python), "-I", "-S", str(compiled)], capture_output=True, text=True, timeout=30
    )
    assert ran.returncode == 2 and "usage: shim.py" in ran.stderr, ran.stderr

    # Another interpreter (another binary, maybe another bytecode format): the source.
    other = tmp_path / "other" / "bin" / "python"
    other.parent.mkdir(parents=True)
    other.write_text("#!/bin/sh\n")
    assert compile_shim(SHIM_SOURCE, other, tmp_path / "other.pyc") == SHIM_SOURCE
    assert not (tmp_path / "other.pyc").exists()


def test_the_compiled_shim_is_kept_between_runs_and_a_broken_copy_is_replaced(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(layout, "_compiled", {})  # as in a new process
    compiled = shim_bytecode(SHIM_SOURCE)
    [kept] = shim_cache_dir().glob("*.pyc")
    assert kept.read_bytes() == compiled

    # The next run reads the kept bytecode instead of compiling: put other (valid) bytecode
    # in its place, and that is what it gets.
    other = compiled[:16] + marshal.dumps(compile("raise SystemExit(7)", "x", "exec"))
    kept.write_bytes(other)
    monkeypatch.setattr(layout, "_compiled", {})
    assert shim_bytecode(SHIM_SOURCE) == other

    # Cut short or not bytecode at all: compiled again, and the copy is whole again.
    for broken in (compiled[: len(compiled) // 2], b"not bytecode"):
        kept.write_bytes(broken)
        monkeypatch.setattr(layout, "_compiled", {})
        assert shim_bytecode(SHIM_SOURCE) == compiled
        assert kept.read_bytes() == compiled
    assert [p.name for p in kept.parent.iterdir()] == [kept.name]  # no temporary file left

    # What another user could have put there is never run in a sandbox, even valid
    # bytecode: writable by group or others, a link, or (as root, who can hand it over)
    # another user's file. Each is compiled again and replaced by a file of our own.
    planted = tmp_path / "planted.pyc"
    planted.write_bytes(other)
    untrusted = [lambda: kept.chmod(0o666), lambda: kept.chmod(0o620)]
    untrusted.append(lambda: (kept.unlink(), kept.symlink_to(planted)))
    if os.geteuid() == 0:
        untrusted.append(lambda: os.chown(kept, 65534, 65534))
    for make_untrusted in untrusted:
        kept.unlink()
        kept.write_bytes(other)
        kept.chmod(0o600)
        make_untrusted()
        monkeypatch.setattr(layout, "_compiled", {})
        assert shim_bytecode(SHIM_SOURCE) == compiled
        assert not kept.is_symlink() and kept.read_bytes() == compiled
        assert kept.stat().st_uid == os.geteuid() and kept.stat().st_mode & 0o077 == 0

    # A cache that cannot be written (a file where its folder would be) costs nothing more.
    blocked = tmp_path / "blocked"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    monkeypatch.setattr(layout, "_compiled", {})
    assert shim_bytecode(SHIM_SOURCE) == compiled


def test_without_a_usable_bwrap_the_site_says_so_and_leaves_nothing_behind(tmp_path):
    rollout = tmp_path / "ws" / "rollouts" / "graceful"
    rollout.mkdir(parents=True)
    (rollout / "main.py").write_text(textwrap.dedent(GRACEFUL))
    not_bwrap = tmp_path / "bwrap"
    not_bwrap.write_text("not a program")  # not executable
    site = site_for(rollout, tmp_path, [], SandboxPolicy(bwrap=not_bwrap))
    before = set(Path(tempfile.gettempdir()).glob("osmosis-sbx-*"))

    with pytest.raises(SandboxUnavailable, match="is not an executable file"):
        asyncio.run(site.start(1))
    assert set(Path(tempfile.gettempdir()).glob("osmosis-sbx-*")) <= before
    assert not (tmp_path / "run" / "rollout_trials.sandbox").exists()


GRACEFUL = """
import json, os, uvicorn

async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                print("lifespan shutdown ran", flush=True)
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = json.dumps({"status": "ok", "concurrency": {"max_concurrent": 2}}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]),
                log_level="warning")
"""


def test_a_sandbox_running_the_compiled_shim_serves_and_stops_its_server_gracefully(tmp_path):
    rollout = tmp_path / "ws" / "rollouts" / "graceful"
    rollout.mkdir(parents=True)
    (rollout / "main.py").write_text(textwrap.dedent(GRACEFUL))
    lines: list[str] = []
    site = site_for(rollout, tmp_path, lines)

    async def main() -> None:
        await site.start(1)
        try:
            (endpoint,) = site.endpoints
            assert isinstance(endpoint, SandboxEndpoint)
            assert endpoint.capacity == 2  # its /health came through the shim
            commands = _commands(endpoint.group.pids(endpoint.process.pid))
            assert any(b"/run/osmosis/shim.pyc" in command[:4] for command in commands)
        finally:
            await site.stop()
        # The server's last lines reach the log from its reader, a little after it exits.
        deadline = time.monotonic() + 5
        while not any("lifespan shutdown ran" in line for line in lines):
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.02)

    asyncio.run(main())
    # SIGTERM found the compiled shim, which passed it on: the server's shutdown ran (a
    # SIGTERM to bwrap instead would have killed it outright).
    assert any("lifespan shutdown ran" in line for line in lines), lines


def _commands(pids: list[int]) -> list[list[bytes]]:
    return [Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") for pid in pids]
