"""The package index a sandboxed environment build may reach, and the proxy that enforces it.

    index = PackageIndex.from_environment(os.environ)   # OSMOSIS_PACKAGE_INDEX, else uv's
    with PackageProxy(socket_path, index.hosts, log=print):
        ...   # the build's uv reaches `index.hosts` through the socket, and nothing else

An environment build runs a rollout's own build backend, so it is workspace code: its sandbox
has no network but a loopback (`shim` forwards one port of it to the proxy's Unix socket).
The proxy, on the host, connects only to the index's hosts — by name, on their port — and
answers 403 to anything else (the platform's ports, the cloud metadata address, another
index). What uv would use on the host decides the index when the operator names none:
`UV_DEFAULT_INDEX`/`UV_INDEX_URL`, `UV_INDEX`/`UV_EXTRA_INDEX_URL`, `UV_FIND_LINKS`, else
PyPI (with `files.pythonhosted.org`, where PyPI's files are). Local directories among them are
bound read-only into the sandbox instead.
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

PYPI = "https://pypi.org/simple"
_PYPI_FILES = ("files.pythonhosted.org", 443)
_DEFAULT_PORTS = {"https": 443, "http": 80}
# uv's settings for where packages come from, and how it talks to them: passed into the build
# sandbox as the operator set them (never the repository's: uv runs with `--no-config`).
_PASSED_THROUGH = (
    "UV_DEFAULT_INDEX",
    "UV_INDEX_URL",
    "UV_INDEX",
    "UV_EXTRA_INDEX_URL",
    "UV_FIND_LINKS",
    "UV_OFFLINE",
    "UV_INDEX_STRATEGY",
    "UV_NATIVE_TLS",
    "UV_HTTP_TIMEOUT",
    "UV_CONCURRENT_DOWNLOADS",
    "UV_NO_BUILD_ISOLATION",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
)
_URL_LISTS = ("UV_INDEX", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS")
_HEAD_LIMIT = 64 * 1024
_CONNECT_TIMEOUT_SEC = 30.0
_HEAD_TIMEOUT_SEC = 30.0  # a connection that never sends its request head is dropped
_MAX_CONNECTIONS = 64  # at once: beyond, a connection is closed (uv opens far fewer)
_CHUNK = 256 * 1024


@dataclass(frozen=True)
class PackageIndex:
    """Where a sandboxed build gets packages: uv's settings, the hosts, the local folders."""

    env: Mapping[str, str]
    """uv's index settings for the sandbox (`UV_DEFAULT_INDEX`, `UV_FIND_LINKS`…)."""
    hosts: frozenset[tuple[str, int]]
    """`(host, port)` the proxy may connect to."""
    directories: tuple[Path, ...]
    """Local indexes and find-links folders, and the operator's CA files: bound read-only."""
    shown: str
    """Where packages come from, in words (for the run's log)."""

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> PackageIndex:
        """`OSMOSIS_PACKAGE_INDEX` (a URL or a folder) when set, else what uv would use."""
        env = {name: environ[name] for name in _PASSED_THROUGH if environ.get(name)}
        chosen = environ.get("OSMOSIS_PACKAGE_INDEX", "").strip()
        if chosen:
            for name in ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "UV_INDEX", "UV_EXTRA_INDEX_URL"):
                env.pop(name, None)
            env["UV_DEFAULT_INDEX"] = chosen
        locations: list[str] = []
        for name, value in env.items():
            if name in _URL_LISTS:
                locations += value.replace(",", " ").split()
            elif name in ("UV_DEFAULT_INDEX", "UV_INDEX_URL"):
                locations.append(value)
        if not env.get("UV_DEFAULT_INDEX") and not env.get("UV_INDEX_URL"):
            locations.append(PYPI)
        hosts: set[tuple[str, int]] = set()
        directories: list[Path] = []
        for location in locations:
            location = location.split("=", 1)[1] if _is_named(location) else location
            parts = urlsplit(location)
            if parts.scheme in _DEFAULT_PORTS and parts.hostname:
                hosts.add((parts.hostname, parts.port or _DEFAULT_PORTS[parts.scheme]))
                if parts.hostname == "pypi.org":
                    hosts.add(_PYPI_FILES)
            elif parts.scheme in ("", "file"):
                directories.append(Path(parts.path if parts.scheme else location))
        named = sorted(f"{host}:{port}" for host, port in hosts) + [str(d) for d in directories]
        if env.get("UV_OFFLINE"):
            named.append("uv's cache (UV_OFFLINE)")
        for name in ("SSL_CERT_FILE", "SSL_CERT_DIR"):
            if env.get(name):
                directories.append(Path(env[name]))
        existing = tuple(path for path in directories if path.is_absolute() and path.exists())
        return cls(env=env, hosts=frozenset(hosts), directories=existing, shown=", ".join(named))


def _is_named(location: str) -> bool:
    """`UV_INDEX` entries may be `name=url`."""
    name, sep, rest = location.partition("=")
    return bool(sep) and "://" in rest and "/" not in name


class PackageProxy:
    """An HTTP proxy on a Unix socket that reaches only `hosts` (CONNECT for https, absolute
    URLs for http); everything else gets 403 and is listed in `refused`."""

    def __init__(
        self,
        path: Path,
        hosts: Iterable[tuple[str, int]],
        *,
        log: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.path = path
        self.hosts = frozenset(hosts)
        self.refused: list[str] = []
        self._log = log
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        proxy = self

        slots = threading.BoundedSemaphore(_MAX_CONNECTIONS)

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                # The build is workspace code: it must not hold a thread of the worker per
                # connection it opens and leaves silent.
                if not slots.acquire(blocking=False):
                    return
                try:
                    proxy._serve(self.request)
                finally:
                    slots.release()

        self._server = socketserver.ThreadingUnixStreamServer(str(path), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="osmosis-package-proxy", daemon=True
        )

    def __enter__(self) -> PackageProxy:
        self.path.chmod(0o666)  # the sandbox's user maps to ours, but needs write to connect
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=5)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def _serve(self, client: socket.socket) -> None:
        client.settimeout(_HEAD_TIMEOUT_SEC)
        head, rest = _read_head(client)
        client.settimeout(None)
        if head is None:
            return
        method, target = _request_line(head)
        destination = _destination(method, target)
        if destination is None or destination not in self.hosts:
            shown = f"{destination[0]}:{destination[1]}" if destination else repr(target[:80])
            with self._lock:
                first = shown not in self.refused
                if first:
                    self.refused.append(shown)
            if first:
                self._log(f"→ build sandbox: refused a connection to {shown} (not the index)")
            with contextlib.suppress(OSError):
                client.sendall(
                    b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                    b"\r\nosmosis: an environment build reaches only the package index\r\n"
                )
            return
        try:
            upstream = socket.create_connection(destination, timeout=_CONNECT_TIMEOUT_SEC)
        except OSError as error:
            with contextlib.suppress(OSError):
                client.sendall(
                    b"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\n\r\n"
                    + str(error).encode(errors="replace")
                )
            return
        upstream.settimeout(None)
        with self._lock:
            self._open |= {client, upstream}
        try:
            if method == "CONNECT":
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                upstream.sendall(_origin_form(head))
            if rest:
                upstream.sendall(rest)
            back = threading.Thread(target=_relay, args=(upstream, client), daemon=True)
            back.start()
            _relay(client, upstream)
            back.join()
        except OSError:
            pass
        finally:
            with self._lock:
                self._open -= {client, upstream}
            upstream.close()


def _read_head(client: socket.socket) -> tuple[bytes | None, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > _HEAD_LIMIT:
            return None, b""
        try:
            chunk = client.recv(_CHUNK)
        except OSError:
            return None, b""
        if not chunk:
            return None, b""
        data += chunk
    end = data.index(b"\r\n\r\n") + 4
    return data[:end], data[end:]


def _request_line(head: bytes) -> tuple[str, str]:
    words = head.split(b"\r\n", 1)[0].decode("latin-1").split()
    return (words[0].upper(), words[1]) if len(words) >= 2 else ("", "")


def _destination(method: str, target: str) -> tuple[str, int] | None:
    if method == "CONNECT":
        host, _, port = target.rpartition(":")
        host = host.strip("[]").lower()
        return (host, int(port)) if host and port.isdigit() else None
    parts = urlsplit(target)
    if parts.scheme != "http" or not parts.hostname:
        return None
    try:
        return parts.hostname.lower(), parts.port or 80
    except ValueError:
        return None


def _origin_form(head: bytes) -> bytes:
    """A proxied `GET http://host/path` as the origin expects it: `GET /path`, and one request
    per connection (`Connection: close`), so every request's host is checked."""
    first, _, headers = head.partition(b"\r\n")
    method, target, version = first.split(b" ", 2)
    parts = urlsplit(target.decode("latin-1"))
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    kept = [
        line
        for line in headers.split(b"\r\n")
        if line and not line.lower().startswith((b"connection:", b"proxy-connection:"))
    ]
    lines = [b" ".join((method, path.encode("latin-1"), version)), *kept, b"Connection: close"]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _relay(source: socket.socket, sink: socket.socket) -> None:
    """Copy until EOF, then half-close `sink`: the other direction may still answer."""
    try:
        while chunk := source.recv(_CHUNK):
            sink.sendall(chunk)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


__all__ = ["PYPI", "PackageIndex", "PackageProxy"]
