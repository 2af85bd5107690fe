"""The sandbox's network shim on its own (no bubblewrap): real sockets on loopback, a real child.

The shim runs as inside a sandbox (`python -I -S shim.py --listen-fd … -- python …`); the test
plays the engine (a Unix listening socket handed over, connections handed back), the rollout
server (the child) and the bridge (a Unix socket that takes connections handed to it, or one
that serves relayed ones, as an environment build's package proxy does).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from osmosis.eval.sites.sandbox.launcher import SHIM_SOURCE
from osmosis.rollout.http1 import ConnectFailed, Http1Client, stream_socket
from tests.ports import free_port

# The rollout server: serves one connection on the rollout port, reading it to its end of file
# (the engine's half-close), calls the bridge through the shim, then answers with what it got,
# what the bridge said, and 3 MB, and exits 3.
ROLLOUT = r"""
import hashlib, socket, sys
port, bridge_port = int(sys.argv[1]), int(sys.argv[2])
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", port))
server.listen()
print("listening", flush=True)
connection, _ = server.accept()
digest, size = hashlib.sha256(), 0
while data := connection.recv(65536):
    digest.update(data)
    size += len(data)
bridge = socket.create_connection(("127.0.0.1", bridge_port))
bridge.sendall(b"ping")
bridge.shutdown(socket.SHUT_WR)
answer = b""
while chunk := bridge.recv(65536):
    answer += chunk
connection.sendall(f"{size} {digest.hexdigest()} {answer.decode()}\n".encode() + b"x" * 3_000_000)
connection.close()
sys.exit(3)
"""


@contextmanager
def bridge_server(path: Path, *, handoff: bool = False) -> Iterator[list[bytes]]:
    """A Unix socket server answering each connection `pong:` + what it read to its end (with
    `handoff`: each connection handed to it)."""
    heard: list[bytes] = []
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen()

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            if handoff:
                with connection:
                    _, fds, _, _ = socket.recv_fds(connection, 1, 1)
                handed = stream_socket(fds)
                assert handed is not None
                handed.setblocking(True)
                connection = handed
            with connection:
                data = b""
                while chunk := connection.recv(65536):
                    data += chunk
                heard.append(data)
                connection.sendall(b"pong:" + data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield heard
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(5)


def shim(
    listener: socket.socket | None, *args: str, child: list[str], **popen: object
) -> subprocess.Popen[bytes]:
    """The shim as bwrap would start it, the child after `--`; its stdout is the child's."""
    listen = [] if listener is None else ["--listen-fd", str(listener.fileno())]
    fds = () if listener is None else (listener.fileno(),)
    return subprocess.Popen(
        [sys.executable, "-I", "-S", str(SHIM_SOURCE), *listen, *args, "--", *child],
        pass_fds=popen.pop("pass_fds", fds),  # type: ignore[arg-type]
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **popen,  # type: ignore[arg-type]
    )


def take_connection(path: Path) -> socket.socket:
    """What the engine does with its Unix socket: the connection to the server handed back."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as via:
        via.settimeout(30)
        via.connect(str(path))
        _, fds, _, _ = socket.recv_fds(via, 1, 1)
    sock = stream_socket(fds)
    assert sock is not None, "no connection was handed over"
    sock.settimeout(30)
    return sock


@pytest.mark.parametrize("bridge", ["handoff", "relay"])
def test_the_engine_gets_the_servers_connection_and_the_bridge_the_rollouts(tmp_path, bridge):
    """5 MB in and 3 MB out between the engine and the server's TCP port over the socket the
    shim handed over, a model call out to the bridge's socket (handed over too, or relayed as
    an environment build's), each end of file passed on while the other direction still
    answers, all of the answer though the server exited right after it; the shim exits with
    the server's code."""
    engine_path = tmp_path / "engine.sock"
    engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    engine.bind(str(engine_path))
    engine.listen(16)
    port, bridge_port = free_port(), free_port()
    payload = os.urandom(5_000_000)
    option = "--handoff-socket" if bridge == "handoff" else "--bridge-socket"
    with bridge_server(tmp_path / "bridge.sock", handoff=bridge == "handoff") as heard, shim(
        engine,
        "--rollout-port", str(port), "--bridge-port", str(bridge_port),
        option, str(tmp_path / "bridge.sock"),
        child=[sys.executable, "-c", ROLLOUT, str(port), str(bridge_port)],
    ) as process:  # fmt: skip
        engine.close()  # the shim holds its own copy, as the sandbox site does
        assert process.stdout is not None
        assert process.stdout.readline() == b"listening\n"
        with take_connection(engine_path) as client:
            assert client.family == socket.AF_INET  # the server's own TCP connection
            client.sendall(payload)
            client.shutdown(socket.SHUT_WR)
            reply = b""
            while chunk := client.recv(1 << 20):
                reply += chunk
        code = process.wait(30)
    head, _, rest = reply.partition(b"\n")
    assert head.decode() == f"{len(payload)} {hashlib.sha256(payload).hexdigest()} pong:ping"
    # All of it, though the server exited right after sending it.
    assert len(rest) == 3_000_000 and rest == b"x" * 3_000_000
    assert heard == [b"ping"]
    assert code == 3


def test_a_connection_before_the_server_listens_is_a_failed_connect_so_the_engine_retries(
    tmp_path,
):
    """Nothing on the rollout port yet: the engine's connection is closed at once with nothing
    handed over, not held, and the rollout client sees a failed connect (safe to repeat)."""
    engine_path = tmp_path / "engine.sock"
    engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    engine.bind(str(engine_path))
    engine.listen(16)
    sleeper = "import time; print('up', flush=True); time.sleep(60)"
    with shim(
        engine, "--rollout-port", str(free_port()), child=[sys.executable, "-c", sleeper]
    ) as process:
        engine.close()
        try:
            assert process.stdout is not None and process.stdout.readline() == b"up\n"
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.settimeout(10)
                client.connect(str(engine_path))
                assert client.recv(10) == b""

            async def request() -> None:
                client = Http1Client("http://rollout", unix_socket=str(engine_path), handoff=True)
                try:
                    with pytest.raises(ConnectFailed, match=f"cannot connect to {engine_path}"):
                        await client.request("GET", "/health", timeout=10)
                finally:
                    await client.aclose()

            asyncio.run(request())
        finally:
            process.kill()


def test_sigterm_reaches_the_server_and_the_shim_exits_with_its_signal(tmp_path):
    """The engine stops a sandboxed server by SIGTERM to the shim: the server gets it (its
    lifespan's shutdown can run) and the shim exits 128 + 15 once it is gone."""
    engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    engine.bind(str(tmp_path / "engine.sock"))
    engine.listen(16)
    server = (
        "import os, signal, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: (print('stopping', flush=True), os._exit(7)))\n"
        "print(os.getpid(), flush=True)\n"
        "time.sleep(60)\n"
    )
    port = str(free_port())
    with shim(engine, "--rollout-port", port, child=[sys.executable, "-c", server]) as process:
        engine.close()
        assert process.stdout is not None
        pid = int(process.stdout.readline())
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 7
        assert process.stdout.read() == b"stopping\n"
    assert not Path(f"/proc/{pid}").exists()  # reaped: no zombie left under the sandbox's init

    suicide = "import os; os.kill(os.getpid(), 9)"
    with shim(None, child=[sys.executable, "-c", suicide]) as killed:
        assert killed.wait(10) == 128 + 9


def test_the_engines_lifeline_closing_ends_the_server_and_the_shim(tmp_path):
    """The engine gone (the lifeline's write end closed, however it died): the shim SIGKILLs
    the server and exits with that, though nobody signalled either of them. While the engine
    lives the server runs on, and the lifeline does not reach the server."""
    read, write = os.pipe()
    server = (
        "import os, time\n"
        "print(os.getpid(), sorted(int(fd) for fd in os.listdir('/proc/self/fd')), flush=True)\n"
        "time.sleep(60)\n"
    )
    with shim(
        None, "--lifeline-fd", str(read), child=[sys.executable, "-c", server], pass_fds=(read,)
    ) as process:
        os.close(read)  # the shim's copy is the only one left
        assert process.stdout is not None
        pid, fds = process.stdout.readline().split(b" ", 1)
        assert str(read).encode() not in fds.strip(b"[]\n").split(b", ")
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait(0.5)  # the engine is alive: nothing happens
        os.close(write)
        assert process.wait(10) == 128 + signal.SIGKILL
    assert not Path(f"/proc/{int(pid)}").exists()


def test_the_server_gets_only_the_readiness_pipe_and_its_file_size_limit_ends_a_writer(
    tmp_path,
):
    """The listening descriptor stays with the shim (the server cannot accept the engine's
    connections itself); the readiness pipe goes on. A file past `--rlimit FSIZE` ends the
    writer with SIGXFSZ: the shim's interpreter ignores that signal, and the server must not
    inherit the ignoring (Python ignores it again itself, so a shell's `head` shows it)."""
    engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    engine.bind(str(tmp_path / "engine.sock"))
    engine.listen(16)
    ready_read, ready_write = os.pipe()
    os.set_inheritable(ready_write, True)
    server = (
        "import os\n"
        "fds = sorted(int(fd) for fd in os.listdir('/proc/self/fd'))\n"
        "print(' '.join(map(str, fds)), flush=True)\n"
        "os.write(int(os.environ['_OSMOSIS_ROLLOUT_READY_FD']), b'ready')\n"
    )
    with shim(
        engine,
        "--rollout-port",
        str(free_port()),
        child=[sys.executable, "-c", server],
        pass_fds=(engine.fileno(), ready_write),
        env={**os.environ, "_OSMOSIS_ROLLOUT_READY_FD": str(ready_write)},
    ) as process:
        engine.close()
        os.close(ready_write)  # the shim's and the server's copies are the only ones left
        assert process.stdout is not None
        fds = [int(fd) for fd in process.stdout.readline().split()]
        assert process.wait(10) == 0
    assert os.read(ready_read, 100) == b"ready"
    assert os.read(ready_read, 100) == b""  # the shim kept no copy: its end is the server's
    os.close(ready_read)
    # 0-2, the pipe, and listdir's own descriptor: nothing else of the shim's.
    assert fds[:3] == [0, 1, 2] and ready_write in fds and len(fds) == 5, fds

    big = tmp_path / "big"
    writer = ["sh", "-c", f"head -c 2000000 /dev/zero > {big}"]
    with shim(None, "--rlimit=FSIZE=1000000", child=writer) as limited:
        assert limited.wait(10) == 128 + signal.SIGXFSZ
    assert big.stat().st_size == 1_000_000


def test_bad_arguments_name_the_problem_and_what_is_valid():
    for args, problem in [
        (["--rollout-port", "8000", "--", "true"], "--listen-fd and --rollout-port go together"),
        (["--rlimit", "NOPE=1", "--", "true"], "--rlimit 'NOPE=1': expected NAME=N"),
        (["--bridge-port", "x", "--", "true"], "argument --bridge-port: invalid int value: 'x'"),
        (["--bridge-port", "1"], "the rollout server's command is missing"),
    ]:
        done = subprocess.run(
            [sys.executable, "-I", "-S", str(SHIM_SOURCE), *args], capture_output=True, text=True
        )
        assert done.returncode == 2
        assert problem in done.stderr and "usage: shim.py" in done.stderr


@pytest.mark.parametrize("limit", [23, 24])  # one of them leaves no descriptor to accept with
def test_out_of_descriptors_the_shim_neither_dies_nor_spins_and_serves_later_calls(tmp_path, limit):
    """A rollout holding more connections to the bridge port than the shim has descriptors
    for: those the shim cannot join are closed (the caller sees a failed call), the shim does
    not die nor spin on its listener (a core burnt for the whole wait), and once descriptors
    are free again a call gets through."""
    rollout = r"""
import resource, socket, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))  # the shim's soft limit, not ours
port = int(sys.argv[1])
held = [socket.create_connection(("127.0.0.1", port)) for _ in range(40)]
print("holding", flush=True)
time.sleep(2)
for sock in held:
    sock.close()
time.sleep(0.2)
call = socket.create_connection(("127.0.0.1", port))
call.sendall(b"late")
call.shutdown(socket.SHUT_WR)
print(call.recv(100).decode(), flush=True)
"""
    bridge_port = free_port()

    def few_descriptors() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, 4096))

    with bridge_server(tmp_path / "bridge.sock"), shim(
        None,
        "--bridge-port", str(bridge_port), "--bridge-socket", str(tmp_path / "bridge.sock"),
        child=[sys.executable, "-c", rollout, str(bridge_port)],
        preexec_fn=few_descriptors,
    ) as process:  # fmt: skip
        assert process.stdout is not None
        assert process.stdout.readline() == b"holding\n"
        before = cpu_seconds(process.pid)
        assert process.stdout.readline() == b"pong:late\n"
        spent = cpu_seconds(process.pid) - before
        assert process.wait(10) == 0
    assert spent < 0.5, f"the shim burnt {spent:.2f} s of CPU in 2 s waiting for descriptors"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
