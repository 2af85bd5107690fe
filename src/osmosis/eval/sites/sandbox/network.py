"""The host side of a sandbox's network: the bridge's hand-over socket, and slirp4netns for `full`.

    forwarder = await BridgeForwarder.start(socket_dir / "handoff.sock", "127.0.0.1", 41234)
    ...                         # each sandbox's shim connects to it (bound read-only inside)
    await forwarder.stop()

`BridgeForwarder` listens on a Unix socket to which the sandbox's shim hands each connection
the rollout makes to the bridge's port inside (one byte, the TCP socket's descriptor in
SCM_RIGHTS), and gives that socket to the model bridge: to the bridge's own server when it
runs in this event loop (`bridge_http.serving`: the bridge answers the rollout's socket
itself, with no process between them), else forwarded to the bridge's TCP address, in the
engine's event loop. Either way the sandbox reaches that one server and nothing else, and the
bridge's token still guards every call. The rollout can reach the hand-over socket too: only
a connected stream socket is taken, one per connection, and anything else is closed.

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
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import cast

from osmosis.eval.model.bridge_address import LISTEN_BACKLOG
from osmosis.eval.model.bridge_http import serving
from osmosis.eval.sites import cpu_split
from osmosis.rollout.http1 import stream_socket

_SLIRP_READY_SEC = 10.0
_ACCEPT_BATCH = 64  # hand-overs taken per readiness of the listener, so the loop moves on
_ACCEPT_RETRY_SEC = 1.0  # a listener that failed to accept rests this long (as asyncio's)
_HANDOFF_WAIT_SEC = 10.0  # the shim sends at once: a silent connection is not the shim's
_LOOPBACK_WAIT_SEC = 5.0


class BridgeForwarder:
    """A Unix socket whose handed-over connections reach the bridge at `host:port`."""

    def __init__(self, host: str, port: int, path: Path) -> None:
        self.host = host
        self.port = port
        self.path = path
        self._listener: socket.socket | None = None
        self._waiting: dict[socket.socket, asyncio.TimerHandle] = {}  # no message in yet
        self._adopting: set[asyncio.Task[None]] = set()
        self._connections: set[_Side] = set()  # the sandbox's side of each forwarded one

    @classmethod
    async def start(cls, path: Path, host: str, port: int) -> BridgeForwarder:
        forwarder = cls(host, port, path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.setblocking(False)
            listener.bind(str(path))
            os.chmod(path, 0o666)  # the sandbox's user maps to ours, but needs write to connect
            # Every rollout of every sandbox connects here; a Unix socket refuses a connection
            # past its backlog, where TCP would queue it.
            listener.listen(LISTEN_BACKLOG)
        except BaseException:
            listener.close()
            raise
        forwarder._listener = listener
        asyncio.get_running_loop().add_reader(listener.fileno(), forwarder._accept)
        return forwarder

    def _accept(self) -> None:
        listener = self._listener
        if listener is None:
            return
        loop = asyncio.get_running_loop()
        for _ in range(_ACCEPT_BATCH):
            try:
                via, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                # Out of descriptors, say: the rest wait in the backlog, and the listener
                # rests instead of spinning.
                loop.remove_reader(listener.fileno())
                loop.call_later(_ACCEPT_RETRY_SEC, self._listen_again)
                return
            via.setblocking(False)
            self._receive(via)

    def _listen_again(self) -> None:
        if self._listener is not None:
            asyncio.get_running_loop().add_reader(self._listener.fileno(), self._accept)

    def _receive(self, via: socket.socket) -> None:
        """Take the descriptor `via` carries (waiting for it if it is not in yet), and close
        `via`: one hand-over per connection."""
        loop = asyncio.get_running_loop()
        try:
            _, fds, _, _ = socket.recv_fds(via, 1, 1, socket.MSG_CMSG_CLOEXEC)
        except (BlockingIOError, InterruptedError):
            if via not in self._waiting:
                loop.add_reader(via.fileno(), self._receive, via)
                self._waiting[via] = loop.call_later(_HANDOFF_WAIT_SEC, self._drop, via)
            return
        except OSError:
            fds = []
        # What is refused is closed before `via`: the sender's end of file means it is gone.
        sock = stream_socket(fds)
        self._drop(via)
        if sock is not None:
            task = loop.create_task(self._adopt(sock))
            self._adopting.add(task)
            task.add_done_callback(self._adopting.discard)

    def _drop(self, via: socket.socket) -> None:
        timer = self._waiting.pop(via, None)
        if timer is not None:
            timer.cancel()
            asyncio.get_running_loop().remove_reader(via.fileno())
        via.close()

    async def _adopt(self, sock: socket.socket) -> None:
        try:
            await asyncio.get_running_loop().connect_accepted_socket(self._accepted, sock)
        except OSError:
            sock.close()

    def _accepted(self) -> asyncio.Protocol:
        # Looked up per connection: the bridge may start after the sandbox (its address is
        # bound first), and it stops before the site does.
        bridge = serving(self.host, self.port)
        if bridge is not None:
            # Served by the bridge itself: a forwarded call cost the engine's loop a second
            # read and write each way (~0.5 ms of its CPU per attempt, `bench/sandbox.py`).
            return bridge.protocol()
        side = _Side(self._connections)
        side.task = asyncio.ensure_future(self._connect(side))
        return side

    async def _connect(self, side: _Side) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, upstream = await loop.create_connection(
                lambda: _Side(self._connections), self.host, self.port
            )
        except OSError:
            side.close()
            return
        side.join(upstream)

    async def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            asyncio.get_running_loop().remove_reader(listener.fileno())
            listener.close()
        for via in list(self._waiting):
            self._drop(via)
        for task in list(self._adopting):
            task.cancel()
        for side in list(self._connections):
            side.close(abort=True)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


class _Side(asyncio.Protocol):
    """One end of a forwarded connection, joined to the other end's `_Side`: what arrives is
    written there as it comes, with no stream and no task per direction (every model call of
    every sandbox passes here, on the engine's event loop). Flow control runs both ways: a
    side whose peer cannot take more stops reading. An end of file is passed on as a
    half-close (the other direction may still answer); the pair closes once both have ended.

    Each side holds what arrives before the pair is joined (reading is paused meanwhile,
    where the event loop allows it before its first read)."""

    def __init__(self, connections: set[_Side]) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.task: asyncio.Future[None] | None = None  # the sandbox's side: its connect
        self._connections = connections
        self._got_eof = False
        self._sent_eof = False
        self._early: list[bytes] = []  # what came before the peer was joined

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream socket's transport (uvloop's are no subclass of asyncio's: no isinstance).
        self.transport = cast(asyncio.Transport, transport)
        self._connections.add(self)
        if self.peer is None:
            self.transport.pause_reading()  # until `join`; the bridge's side is joined at once

    def join(self, peer: _Side) -> None:
        self.peer, peer.peer = peer, self
        for side in (self, peer):
            transport = side.transport
            if transport is None or transport.is_closing():
                self.close()
                return
        for side in (self, peer):
            early, side._early = side._early, []
            for data in early:
                side.data_received(data)
            if side._got_eof and not side.eof_received():
                return
        for side in (self, peer):
            if side.transport is not None and not side.transport.is_closing():
                side.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None:
            self._early.append(data)
        elif peer.transport is not None:
            peer.transport.write(data)

    def eof_received(self) -> bool:
        self._got_eof = True
        peer = self.peer
        if peer is None:
            return True  # passed on by `join`
        if peer.transport is None or not peer.transport.can_write_eof():
            self.close()
            return False
        peer.transport.write_eof()
        peer._sent_eof = True
        if peer._got_eof:  # both directions are done
            self.close()
            return False
        return True  # half-closed: the answer may still come back through us

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._connections.discard(self)
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()  # what it still has to send goes out first
        elif self.task is not None:
            self.task.cancel()  # the sandbox hung up before the bridge answered the connect

    def close(self, *, abort: bool = False) -> None:
        for side in (self, self.peer):
            if side is None or side.transport is None:
                continue
            if abort:
                side.transport.abort()
            else:
                side.transport.close()
        if abort and self.task is not None:
            self.task.cancel()


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
                    preexec_fn=cpu_split.rollout_hook(),  # the rollout's, not the loop's CPU
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


__all__ = ["BridgeForwarder", "Slirp", "SlirpUnavailable"]
