"""The host side of a sandbox's network: the bridge's Unix socket, and slirp4netns for `full`.

    forwarder = await BridgeForwarder.start(socket_dir / "bridge.sock", "127.0.0.1", 41234)
    ...                         # each sandbox's shim connects to it (bound read-only inside)
    await forwarder.stop()

`BridgeForwarder` listens on a Unix socket and forwards every connection to the model bridge's
TCP address, in the engine's event loop. The bridge's token still guards every call; the
forwarder only lets a network-less sandbox reach that one port.

`Slirp` gives a sandbox's network namespace a user-mode NAT to the outside world
(`network = "full"`), started with `--disable-host-loopback`: the host's 127.0.0.1, where the
platform API and the bridge listen, is not reachable through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from osmosis.eval.model.bridge_http import LISTEN_BACKLOG

_CHUNK = 256 * 1024
_SLIRP_READY_SEC = 10.0
_LOOPBACK_WAIT_SEC = 5.0


class BridgeForwarder:
    """A Unix-socket listener that forwards to the bridge's `host:port`."""

    def __init__(self, server: asyncio.AbstractServer, path: Path) -> None:
        self._server = server
        self.path = path
        self._connections: set[asyncio.Task[None]] = set()

    @classmethod
    async def start(cls, path: Path, host: str, port: int) -> BridgeForwarder:
        holder: list[BridgeForwarder] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            if task is not None and holder:
                holder[0]._connections.add(task)
            try:
                await _forward_to(reader, writer, host, port)
            finally:
                if task is not None and holder:
                    holder[0]._connections.discard(task)

        # Every rollout of every sandbox connects here; asyncio's default backlog (100)
        # refuses a Unix connection past it, where TCP would queue it.
        server = await asyncio.start_unix_server(
            handle, path=str(path), limit=_CHUNK, backlog=LISTEN_BACKLOG
        )
        os.chmod(path, 0o666)  # the sandbox's user maps to ours, but needs write to connect
        forwarder = cls(server, path)
        holder.append(forwarder)
        return forwarder

    async def stop(self) -> None:
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2.0)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


async def _forward_to(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, port: int
) -> None:
    try:
        upstream_reader, upstream_writer = await asyncio.open_connection(host, port, limit=_CHUNK)
    except OSError:
        writer.close()
        return
    try:
        await asyncio.gather(
            pipe(reader, upstream_writer), pipe(upstream_reader, writer), return_exceptions=True
        )
    finally:
        for side in (writer, upstream_writer):
            side.close()


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until EOF, then half-close `writer` (the other direction may still answer)."""
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()


_NS_GET_USERNS = 0xB701  # ioctl on a namespace fd: the user namespace that owns it


def _network_owner(pid: int) -> int:
    """An fd of the user namespace that owns `pid`'s network namespace. slirp4netns must join
    that one: with `--disable-userns` the sandbox's own user namespace is a nested one that
    holds no capability over the network namespace (setns(CLONE_NEWNET) would be EPERM)."""
    net = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return fcntl.ioctl(net, _NS_GET_USERNS)
    finally:
        os.close(net)


def _wait_for_loopback(pid: int) -> None:
    """Return once bwrap has given `pid`'s network namespace its 127.0.0.1 (or it is gone).

    bwrap adds 127.0.0.1 to `lo` (exclusively) and then brings it up; slirp4netns brings `lo`
    up too, and the kernel gives an up loopback its 127.0.0.1 itself. Attached too early,
    slirp4netns wins the race and bwrap dies with `loopback: Failed RTM_NEWADDR`."""
    deadline = time.monotonic() + _LOOPBACK_WAIT_SEC
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/net/fib_trie", encoding="ascii", errors="replace") as table:
                if "127.0.0.1" in table.read():
                    return
        except OSError:
            return  # the sandbox is gone: attach() reports it
        time.sleep(0.001)


class SlirpUnavailable(Exception):
    """`full` network was asked for but slirp4netns is missing or did not start."""


class Slirp:
    """slirp4netns attached to one sandbox's network namespace; `stop()` ends it."""

    def __init__(self, process: subprocess.Popen[bytes], exit_fd: int) -> None:
        self._process = process
        self._exit_fd = exit_fd

    @classmethod
    def attach(cls, sandbox_pid: int) -> Slirp:
        """Give the namespaces of `sandbox_pid` (bwrap's child) a NAT'd `tap0`; returns once
        the interface is configured. Raises `SlirpUnavailable`."""
        binary = shutil.which("slirp4netns")
        if binary is None:
            raise SlirpUnavailable(
                "network `full` needs slirp4netns (`apt-get install slirp4netns`), not found "
                "on PATH"
            )
        _wait_for_loopback(sandbox_pid)
        try:
            owner = _network_owner(sandbox_pid)
        except OSError as error:
            raise SlirpUnavailable(f"cannot open the sandbox's network: {error}") from None
        ready_read, ready_write = os.pipe()
        exit_read, exit_write = os.pipe()
        with tempfile.TemporaryFile() as errors:
            try:
                process = subprocess.Popen(
                    [
                        binary,
                        "--configure",
                        "--mtu=65520",
                        "--disable-host-loopback",  # 10.0.2.2 is not the host's 127.0.0.1
                        "--enable-sandbox",  # slirp4netns itself in a mount namespace, no caps
                        f"--ready-fd={ready_write}",
                        f"--exit-fd={exit_read}",
                        f"--userns-path=/proc/self/fd/{owner}",
                        str(sandbox_pid),
                        "tap0",
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=errors,
                    pass_fds=(ready_write, exit_read, owner),
                    start_new_session=True,
                )
            except OSError as error:
                for fd in (ready_read, ready_write, exit_read, exit_write):
                    os.close(fd)
                raise SlirpUnavailable(f"slirp4netns could not run: {error}") from None
            finally:
                os.close(owner)  # slirp4netns holds its own copy
            os.close(ready_write)
            os.close(exit_read)
            try:
                ready, _, _ = select.select([ready_read], [], [], _SLIRP_READY_SEC)
                answered = os.read(ready_read, 1) if ready else b""
            finally:
                os.close(ready_read)
            slirp = cls(process, exit_write)
            if answered != b"1":
                slirp.stop()
                errors.seek(0)
                said = errors.read().decode(errors="replace").strip()
                raise SlirpUnavailable(
                    f"slirp4netns did not configure the sandbox's network: {said}"
                )
            return slirp

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._exit_fd)  # slirp4netns exits when this closes
        deadline = time.monotonic() + 2.0
        while self._process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()


__all__ = ["BridgeForwarder", "Slirp", "SlirpUnavailable", "pipe"]
