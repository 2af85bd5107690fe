"""The build sandbox's package proxy on its own: it reaches only the index's hosts, and the
build (workspace code) cannot hold the worker's threads with silent connections."""

import contextlib
import socket
import threading
import time

import pytest

from osmosis.eval.sites.sandbox import package_index
from osmosis.eval.sites.sandbox.package_index import PackageProxy


@pytest.fixture
def upstream():
    """A loopback server answering `ok` to whatever it is sent: the package index."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(1024)
                conn.sendall(b"ok")

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1]
    listener.close()


def connect(path) -> socket.socket:
    client = socket.socket(socket.AF_UNIX)
    client.settimeout(5)
    client.connect(str(path))
    return client


def through(path, target: str) -> bytes:
    """What the proxy answers a CONNECT to `target` (b"": it closed the connection, before
    the request was even sent, or after)."""
    try:
        return _through(path, target)
    except (ConnectionResetError, BrokenPipeError):
        return b""


def _through(path, target: str) -> bytes:
    with connect(path) as client:
        client.sendall(f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
        answer = client.recv(200)
        if answer.startswith(b"HTTP/1.1 200"):
            client.sendall(b"hello")
            answer += client.recv(10)
        return answer


def wait_for_handlers(count: int) -> None:
    """Until the proxy runs `count` connection handlers (socketserver's threads)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        handlers = [t for t in threading.enumerate() if "process_request" in t.name]
        if len(handlers) >= count:
            return
        time.sleep(0.01)
    raise AssertionError(f"the proxy did not take {count} connections in 10 s")


def test_only_the_index_is_reached(tmp_path, upstream):
    with PackageProxy(tmp_path / "p.sock", {("127.0.0.1", upstream)}) as proxy:
        assert through(tmp_path / "p.sock", f"127.0.0.1:{upstream}").endswith(b"ok")
        assert through(tmp_path / "p.sock", "127.0.0.1:1").startswith(b"HTTP/1.1 403")
        assert through(tmp_path / "p.sock", "169.254.169.254:80").startswith(b"HTTP/1.1 403")
    assert proxy.refused == ["127.0.0.1:1", "169.254.169.254:80"]


def test_silent_connections_are_capped_and_dropped(tmp_path, upstream, monkeypatch):
    monkeypatch.setattr(package_index, "_MAX_CONNECTIONS", 2)
    monkeypatch.setattr(package_index, "_HEAD_TIMEOUT_SEC", 2.0)
    with (
        PackageProxy(tmp_path / "p.sock", {("127.0.0.1", upstream)}),
        contextlib.ExitStack() as held,
    ):
        silent = [held.enter_context(connect(tmp_path / "p.sock")) for _ in range(2)]
        wait_for_handlers(2)  # both hold their slots (on a loaded machine this takes a while)
        # Past the cap: closed at once, with nothing served.
        assert through(tmp_path / "p.sock", f"127.0.0.1:{upstream}") == b""
        # The silent ones are dropped after the head timeout, and their slots come back.
        assert all(conn.recv(10) == b"" for conn in silent)
        assert through(tmp_path / "p.sock", f"127.0.0.1:{upstream}").endswith(b"ok")
