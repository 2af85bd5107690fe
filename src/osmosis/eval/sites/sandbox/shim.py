"""The network shim that runs inside a rollout's sandbox, in front of the rollout server.

Standalone on purpose: it runs under the rollout's own interpreter (`python -I -S shim.py`),
which may be an `osmosis-ai` venv without our package, so it imports the standard library only
and keeps to syntax every supported Python reads.

    python -I -S shim.py --listen-fd 3 --rollout-port 8000 \\
        --bridge-port 41234 --handoff-socket /run/osmosis/bridge/handoff.sock \\
        --rlimit FSIZE=1073741824 --lifeline-fd 5 -- python main.py

The sandbox has a network namespace of its own with only a loopback, so the rollout server
still binds `127.0.0.1:$_OSMOSIS_ROLLOUT_PORT` and calls the bridge at the rollout-scoped URL on
`127.0.0.1:<bridge port>`, unchanged. The shim joins that loopback to the engine by handing
connected sockets over (SCM_RIGHTS, one byte of payload), never by copying their bytes:

- engine -> rollout: the engine listens on a Unix socket outside the sandbox and hands the
  listening descriptor over (`--listen-fd`). For each connection accepted on it the shim
  connects to `127.0.0.1:<rollout port>` and sends that TCP socket back over the accepted
  connection; the engine speaks HTTP on it directly. A connect that fails (the server is not
  up yet) closes the Unix connection with nothing sent: the engine sees a failed connect and
  retries. The socket's path is never visible inside, so the rollout cannot swap it for a link
  to another socket.
- rollout -> bridge: the shim listens on `127.0.0.1:<bridge port>` and sends each accepted
  connection to the engine's hand-over socket (`--handoff-socket`, bound read-only into the
  sandbox), where the bridge serves it.

The shim is then out of the path: a relay cost every message a hop through this process, on
cores the engine and the rollout share (`bench/sandbox.py`, both alternated on 2 shared cores:
sandboxed / unsandboxed attempts/s 0.80-0.85x with the relay, 0.87-0.92x with hand-overs,
whose shim spends no measurable CPU per attempt where the relay spent 0.06-0.09 ms). What an
exited server had sent is in the engine's own socket already.

An environment build uses the second half alone, with a relay (`--bridge-socket`, no
`--listen-fd`): its uv reaches the package proxy's socket through `127.0.0.1:<port>`
(`package_index`), which is no event loop of the engine's to take sockets over.

It starts the rollout server as its child with the given resource limits (`--rlimit NAME=N`,
soft limit; the hard limit is set a little above so a signal comes first), forwards SIGTERM
and SIGINT to it, and exits with its status (128 + signal number when a signal killed it).
With `--lifeline-fd`, the read end of a pipe only the engine process writes to (and never
does): its end of file says the engine is gone, however it died, and the shim SIGKILLs the
server and exits (bwrap's init then ends whatever else the sandbox ran). The kernel's
parent-death signal is the first guard; this one does not depend on which thread spawned
bwrap, nor on bwrap keeping that signal.

Its start runs beside the rollout server's own on the same cores: so it is one `selectors`
loop over non-blocking sockets, with no asyncio, argparse or subprocess (~100 ms of imports
under load).
"""

from __future__ import annotations

import errno
import os
import resource
import sys
import time

TYPE_CHECKING = False  # typing's import alone would delay the rollout's start a few ms
if TYPE_CHECKING:
    import selectors
    import signal
    import socket

_CHUNK = 256 * 1024
# As uvicorn listens: the kernel's default backlog drops a burst of hundreds of connections
# (TCP) or refuses it (a Unix socket), and the first wave of a run is such a burst.
_BACKLOG = 2048
_ACCEPT_BATCH = 64  # connections taken per readiness of a listener, so no side starves
_ACCEPT_RETRY_SEC = 1.0  # a listener that failed to accept rests this long (as asyncio's)
_UNIX_CONNECT_SEC = 10.0  # a full backlog on the host's side: wait for room, not forever
_DRAIN_SEC = 1.0  # how long the shim passes on what an exited server had sent
_QUIET_SEC = 0.05  # no traffic for this long: nothing more is coming from the exited server
_HARD_MARGIN = {"CPU": 5}  # seconds between SIGXCPU (soft) and SIGKILL (hard)
_OPTIONS = (
    "--listen-fd",
    "--rollout-port",
    "--bridge-port",
    "--bridge-socket",
    "--handoff-socket",
    "--rlimit",
    "--lifeline-fd",
)
_USAGE = (
    "usage: shim.py [--listen-fd FD --rollout-port PORT] [--bridge-port PORT "
    "(--handoff-socket | --bridge-socket) PATH] [--rlimit NAME=N ...] [--lifeline-fd FD] "
    "-- COMMAND ..."
)


class _UsageError(Exception):
    pass


def main(argv: list[str] | None = None) -> int:
    try:
        options, command = _parse(sys.argv[1:] if argv is None else argv)
        limits = [_parse_limit(text) for text in options.get("--rlimit", [])]
        listen_fd = _single_int(options, "--listen-fd")
        rollout_port = _single_int(options, "--rollout-port")
        bridge_port = _single_int(options, "--bridge-port")
        bridge_socket = options.get("--bridge-socket", [None])[-1]
        handoff_socket = options.get("--handoff-socket", [None])[-1]
        lifeline = _single_int(options, "--lifeline-fd")
    except _UsageError as error:
        sys.stderr.write(f"{_USAGE}\nosmosis-sandbox-shim: error: {error}\n")
        return 2
    child = None
    if listen_fd is not None and rollout_port is not None:
        # A rollout server starts first: its interpreter and imports (~0.5 s) overlap the
        # shim's own imports and listeners. The engine's connections wait in the listening
        # socket's backlog meanwhile, and nothing calls the bridge before the engine
        # dispatches. An environment build (no --listen-fd) may reach the package proxy at
        # once: its listener comes first.
        child = _spawn(command, limits)
        _relay_stops(child)  # at once: a stop during the imports below still reaches it
    _import_late()
    relay = _Relay()
    if lifeline is not None:
        relay.watch_lifeline(lifeline)
    if child is not None:
        relay.watch_child(child)
        engine_side = socket.socket(fileno=listen_fd)
        relay.listen(engine_side, ("connect", ("127.0.0.1", rollout_port)))
    bridge_target = ("pass", handoff_socket) if handoff_socket else ("unix", bridge_socket)
    if bridge_port and bridge_target[1]:
        bridge_side = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        bridge_side.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        bridge_side.bind(("127.0.0.1", bridge_port))
        bridge_side.listen(_BACKLOG)
        relay.listen(bridge_side, bridge_target)
    if child is None:
        child = _spawn(command, limits)
        relay.watch_child(child)
    status = relay.run(child)
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _relay_stops(pid: int) -> None:
    """SIGTERM and SIGINT go on to the child (the interpreter's own `_signal`: `signal` is
    imported later)."""
    raw = sys.modules["_signal"]
    for signum in (raw.SIGTERM, raw.SIGINT):
        raw.signal(signum, lambda received, _frame: _relay(pid, received))


def _import_late() -> None:
    """`selectors`, `signal` and `socket` (each imports `enum`), once the rollout server is
    spawned: its start need not wait for them."""
    import selectors as late_selectors
    import signal as late_signal
    import socket as late_socket

    globals().update(selectors=late_selectors, signal=late_signal, socket=late_socket)


def _parse(argv: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """`--name value` or `--name=value` options, then `--` and the command."""
    options: dict[str, list[str]] = {}
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg == "--":
            index += 1
            break
        name, equals, value = arg.partition("=")
        if name not in _OPTIONS:
            break  # the command, without a `--` before it
        if not equals:
            index += 1
            if index >= len(argv):
                raise _UsageError(f"argument {name}: expected one argument")
            value = argv[index]
        options.setdefault(name, []).append(value)
        index += 1
    command = argv[index:]
    if not command:
        raise _UsageError("the rollout server's command is missing (after --)")
    if ("--listen-fd" in options) != ("--rollout-port" in options):
        raise _UsageError("--listen-fd and --rollout-port go together")
    return options, command


def _single_int(options: dict[str, list[str]], name: str) -> int | None:
    values = options.get(name)
    if not values:
        return None
    try:
        return int(values[-1])
    except ValueError:
        raise _UsageError(f"argument {name}: invalid int value: {values[-1]!r}") from None


def _parse_limit(text: str) -> tuple[int, str, int]:
    name, _, value = text.partition("=")
    try:
        kind: int = getattr(resource, "RLIMIT_" + name.upper())
        return kind, name.upper(), int(value)
    except (AttributeError, ValueError):
        raise _UsageError(f"--rlimit {text!r}: expected NAME=N, e.g. FSIZE=1048576") from None


def _spawn(command: list[str], limits: list[tuple[int, str, int]]) -> int:
    """The rollout server (or the build), under its resource limits: its pid.

    Only the standard descriptors and the readiness pipe the engine handed down
    (`_OSMOSIS_ROLLOUT_READY_FD`) go on to it: the listening descriptor stays with the shim,
    and the shim keeps no copy of the pipe, so that its end of file still means the rollout
    exited."""
    ready = _ready_fd()
    most = os.sysconf("SC_OPEN_MAX")
    pid = os.fork()
    if pid == 0:  # the child: nothing here may return into the shim's code
        try:
            for kind, name, value in limits:
                resource.setrlimit(kind, (value, value + _HARD_MARGIN.get(name, 0)))
            # Python ignores these; an ignored signal stays ignored across exec, and a file
            # past the FSIZE limit must end the writer (SIGXFSZ), as subprocess restores them.
            # The interpreter's own `_signal`, always loaded: `signal` is imported later.
            raw = sys.modules["_signal"]
            for signum in ("SIGPIPE", "SIGXFZ", "SIGXFSZ"):
                if hasattr(raw, signum):
                    raw.signal(getattr(raw, signum), raw.SIG_DFL)
            # The listening descriptor came from bwrap inheritable: it must not reach the
            # rollout, nor anything else of the shim's.
            os.closerange(3, most if ready is None else ready)
            if ready is not None:
                os.set_inheritable(ready, True)
                os.closerange(ready + 1, most)
            os.execvp(command[0], command)
        except BaseException as error:  # reported, then the child is gone
            try:
                message = f"osmosis-sandbox-shim: cannot execute {command[0]}: {error}\n"
                os.write(2, message.encode())
            finally:
                os._exit(127)
    if ready is not None:
        os.close(ready)
    return pid


def _ready_fd() -> int | None:
    """The readiness pipe the engine handed down (`_OSMOSIS_ROLLOUT_READY_FD`), if any."""
    try:
        fd = int(os.environ.get("_OSMOSIS_ROLLOUT_READY_FD", ""))
        os.fstat(fd)
    except (ValueError, OSError):
        return None
    return fd


class _End:
    """One socket of a relayed connection: what is waiting to be written to it (read from its
    peer), whether it has sent its end of file, whether it has been sent one."""

    __slots__ = ("eof_in", "events", "peer", "pending", "shut_out", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.peer: _End | None = None
        self.pending = b""
        self.eof_in = False
        self.shut_out = False
        self.events = 0


class _Relay:
    """Listeners, connections being handed over or relayed, and the child's exit, on one
    selector."""

    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()
        self.listeners: list[socket.socket] = []
        self._wake_read = -1
        self._resting: dict[socket.socket, tuple[float, tuple[str, object]]] = {}
        """Listeners that could not accept (`_accept`): when they listen again."""

    def listen(self, sock: socket.socket, target: tuple[str, object]) -> None:
        sock.setblocking(False)
        self.listeners.append(sock)
        self.selector.register(sock, selectors.EVENT_READ, ("listen", target))

    def _rest_left(self) -> float | None:
        """Seconds until the next resting listener is due (it listens again if so); None when
        none rests."""
        if not self._resting:
            return None
        now, soonest = time.monotonic(), None
        for listener, (due, target) in list(self._resting.items()):
            if due <= now:
                del self._resting[listener]
                self.selector.register(listener, selectors.EVENT_READ, ("listen", target))
            elif soonest is None or due - now < soonest:
                soonest = due - now
        return soonest

    def watch_child(self, pid: int) -> None:
        """SIGCHLD wakes the loop (its wakeup descriptor); SIGTERM and SIGINT go to the child."""
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        self._wake_read = read
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
        _relay_stops(pid)
        self.selector.register(read, selectors.EVENT_READ, ("wake", None))

    def watch_lifeline(self, fd: int) -> None:
        """The engine's lifeline: readable (at its end of file) once the engine is gone."""
        os.set_blocking(fd, False)
        self.selector.register(fd, selectors.EVENT_READ, ("lifeline", fd))

    def _lifeline(self, fd: int, pid: int | None) -> None:
        """The engine is gone when its lifeline reads end of file: SIGKILL the server (`pid`,
        None once it was reaped)."""
        try:
            gone = os.read(fd, 4096) == b""
        except BlockingIOError:
            return
        except OSError:
            gone = True
        if gone:  # nobody will ever talk to this server again
            self.selector.unregister(fd)
            os.close(fd)
            if pid is not None:
                _relay(pid, signal.SIGKILL)

    def run(self, pid: int) -> int:
        """Serve until the child exits, then pass on what it had sent through a relay (its
        last answer may still be on its way): its wait status. A handed-over connection needs
        no such care: the kernel delivers what the server wrote to the engine's socket."""
        while True:
            status = _reaped(pid)
            if status is not None:
                break
            for key, mask in self.selector.select(self._rest_left()):
                kind, target = key.data
                if kind == "listen":
                    self._accept(key.fileobj, target)  # type: ignore[arg-type]
                elif kind == "wake":
                    _drain(self._wake_read)
                elif kind == "lifeline":
                    self._lifeline(target, pid)
                elif kind == "connecting":
                    self._connected(key.fileobj, target)  # type: ignore[arg-type]
                else:
                    self._ready(target, mask)
        for sock in self.listeners:
            if sock not in self._resting:
                self.selector.unregister(sock)
            sock.close()
        # Until the connections go quiet, for a second at most: an idle one the engine keeps
        # open must not hold the server's death back.
        give_up = time.monotonic() + _DRAIN_SEC
        while (left := give_up - time.monotonic()) > 0:
            ready = self.selector.select(min(left, _QUIET_SEC))
            if not ready:
                break
            for key, mask in ready:
                kind, target = key.data
                if kind == "wake":
                    _drain(self._wake_read)
                elif kind == "lifeline":
                    self._lifeline(target, None)
                elif kind == "conn":
                    self._ready(target, mask)
        return status

    # -- connections -------------------------------------------------------------------------
    def _accept(self, listener: socket.socket, target: tuple[str, object]) -> None:
        kind, address = target
        for _ in range(_ACCEPT_BATCH):
            try:
                accepted, _address = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                # Out of descriptors, say (a rollout holding hundreds of connections): the
                # rest wait in the backlog, and the listener rests instead of spinning.
                self.selector.unregister(listener)
                self._resting[listener] = (time.monotonic() + _ACCEPT_RETRY_SEC, target)
                return
            try:
                if kind == "connect":
                    self._connect(accepted, address)  # type: ignore[arg-type]
                elif kind == "pass":
                    _pass(accepted, address)  # type: ignore[arg-type]
                else:
                    self._join(accepted, address)  # type: ignore[arg-type]
            except OSError:
                accepted.close()  # the caller sees its connection closed

    def _connect(self, engine: socket.socket, address: tuple[str, int]) -> None:
        """Connect to the rollout server for a connection the engine made on its Unix socket:
        once connected, the socket goes to the engine over it. Nothing listens yet (the server
        is starting): the engine's connection is closed, and it retries."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        code = sock.connect_ex(address)
        if code in (errno.EINPROGRESS, errno.EWOULDBLOCK):
            self.selector.register(sock, selectors.EVENT_WRITE, ("connecting", engine))
        elif code == 0:
            _hand_over(engine, sock)
        else:
            sock.close()
            engine.close()

    def _connected(self, sock: socket.socket, engine: socket.socket) -> None:
        self.selector.unregister(sock)
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
            _hand_over(engine, sock)
        else:
            sock.close()
            engine.close()

    def _join(self, downstream: socket.socket, path: str) -> None:
        """Relay a connection to the Unix socket at `path` (an environment build's)."""
        sock = _unix_connect(path)
        if sock is None:
            downstream.close()  # nothing listens: the caller sees its connection closed
            return
        downstream.setblocking(False)
        downstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        near, far = _End(downstream), _End(sock)
        near.peer, far.peer = far, near
        self._update(near)
        self._update(far)

    def _ready(self, end: _End, mask: int) -> None:
        peer = end.peer
        assert peer is not None
        try:
            if mask == selectors.EVENT_READ and not (end.eof_in or peer.pending):
                # Most events: a message passed on whole, and nothing else changes.
                data = end.sock.recv(_CHUNK)
                if data:
                    try:
                        sent = peer.sock.send(data)
                    except (BlockingIOError, InterruptedError):
                        sent = 0
                    if sent == len(data):
                        return
                    peer.pending = data[sent:]
                    self._update(end)
                    self._update(peer)
                    return
                end.eof_in = True
                mask = 0  # the end of file is handled below
            if mask & selectors.EVENT_WRITE and end.pending:
                self._send(end, end.pending)
            if mask & selectors.EVENT_READ and not end.eof_in:
                data = end.sock.recv(_CHUNK)
                if data:
                    self._send(peer, data)
                else:
                    end.eof_in = True
            for side in (end, peer):
                other = side.peer
                assert other is not None
                if other.eof_in and not side.pending and not side.shut_out:
                    side.shut_out = True
                    side.sock.shutdown(socket.SHUT_WR)  # half-close: the answer may still come
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._close(end)
            return
        if end.eof_in and peer.eof_in and end.shut_out and peer.shut_out:
            self._close(end)
            return
        self._update(end)
        self._update(peer)

    def _send(self, end: _End, data: bytes) -> None:
        """Write `data` to `end`, keeping what the socket does not take now."""
        try:
            sent = end.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        end.pending = data[sent:]

    def _update(self, end: _End) -> None:
        """Read from a side only while its peer has nothing left to write (flow control both
        ways); write to it while something waits for it."""
        peer = end.peer
        assert peer is not None
        events = 0
        if not end.eof_in and not peer.pending:
            events |= selectors.EVENT_READ
        if end.pending:
            events |= selectors.EVENT_WRITE
        if events == end.events:
            return
        if end.events == 0:
            self.selector.register(end.sock, events, ("conn", end))
        elif events == 0:
            self.selector.unregister(end.sock)
        else:
            self.selector.modify(end.sock, events, ("conn", end))
        end.events = events

    def _close(self, end: _End) -> None:
        for side in (end, end.peer):
            if side is None:
                continue
            if side.events:
                self.selector.unregister(side.sock)
                side.events = 0
            side.sock.close()


def _unix_connect(path: str) -> socket.socket | None:
    """A non-blocking connection to the Unix socket at `path`; None if nothing listens."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    code = sock.connect_ex(path)
    if code == errno.EAGAIN:
        # The listener's backlog is full (a Unix socket refuses at once where TCP queues):
        # wait for room, as TCP would.
        sock.settimeout(_UNIX_CONNECT_SEC)
        try:
            sock.connect(path)
            code = 0
        except OSError:
            code = errno.ECONNREFUSED
        sock.setblocking(False)
    if code != 0:
        sock.close()
        return None
    return sock


def _pass(sock: socket.socket, path: str) -> None:
    """Hand a connection the rollout made to the engine's hand-over socket at `path`."""
    via = _unix_connect(path)
    if via is None:
        sock.close()  # nothing listens: the rollout sees its connection closed
    else:
        _hand_over(via, sock)


def _hand_over(via: socket.socket, sock: socket.socket) -> None:
    """Send `sock` over the Unix connection `via` (one byte, the descriptor beside it in
    SCM_RIGHTS, a C int), then close both: the receiver's copy is the connection now."""
    try:
        fd = sock.fileno().to_bytes(4, sys.byteorder)
        via.sendmsg([b"\0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fd)])
    except OSError:
        pass  # the receiver hung up: its side of the connection is gone with it
    finally:
        via.close()
        sock.close()


def _reaped(pid: int) -> int | None:
    """The child's wait status once it exited, else None."""
    try:
        reaped, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return 0
    return status if reaped == pid else None


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except (BlockingIOError, InterruptedError):
        pass


def _relay(pid: int, signum: int) -> None:
    try:  # noqa: SIM105 - contextlib's import would delay the rollout's start
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    sys.exit(main())
