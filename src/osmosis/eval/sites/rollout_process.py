"""The rollout server as a child process that the engine starts, watches and always reaps.

    process = await RolloutProcess.start(env, rollout_dir, "main.py", env={}, artifact_root=root,
                                         log=print, redactor=Redactor([]))
    process.base_url  # 'http://127.0.0.1:41234', healthy
    await process.stop()

The entrypoint is exec'd directly (`<python> main.py`, no shell, no `uv run`) in the rollout
directory, with the supervisor's variables (`_OSMOSIS_ROLLOUT_PORT`,
`_OSMOSIS_ROLLOUT_ARTIFACT_ROOT`, `_OSMOSIS_ROLLOUT_INSTANCE_ID`, `_OSMOSIS_ROLLOUT_READY_FD`,
`PYTHONUNBUFFERED=1`) and the
offline settings (`OFFLINE_DEFAULTS`: LiteLLM's bundled price map instead of a download at
import, no Hugging Face telemetry, `DO_NOT_TRACK`), which the inherited environment or the
run's `[env]` may override.

What the child sees: our environment minus every `OSMOSIS_*` / `_OSMOSIS_*` variable (the
engine's settings and platform token; the SDK would also read `OSMOSIS_API_KEY` as its model
key) and minus the common model-provider credentials (`PROVIDER_CREDENTIAL_VARIABLES`), plus
the run's `[env]` table and resolved secrets, which win over both removals. A rollout reaches
the model only through the bridge; a provider key it really needs must be passed explicitly.
In a uv venv, `PYTHONPATH`/`PYTHONHOME`/`CONDA_PREFIX` are dropped and `VIRTUAL_ENV`/`PATH`
point at the venv, as activation would.

Readiness is signalled, not only polled: the child inherits the write end of a pipe
(`READY_FD_ENV` names it) and our SDK's server writes to it once its application has started,
a few milliseconds before it listens; from then on `GET /health` is tried every few
milliseconds. A server that does not know the pipe (the osmosis-ai SDK's) is polled, from
every 20 ms up to every 0.1 s.

The child never outlives the engine: it leads its own process group (so a terminal Ctrl-C
reaches only the engine, which then stops it in order), on Linux the kernel SIGKILLs it when
the thread that started it dies (`PR_SET_PDEATHSIG`; start it from the event loop's thread),
`stop()` sends SIGTERM then SIGKILL to the whole group, and an `atexit` hook does the same for
any process still running when the interpreter exits. Grandchildren that leave the group are
beyond reach.

The spawn itself (the command, the environment, the leash) is `spawn`'s, standard library
only, so the command line can start a run's server at its entry (`prestart`); `adopt` then
watches that process as `start` watches its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from osmosis.eval.errors import HostError
from osmosis.eval.results.redact import Redactor
from osmosis.eval.sites.environment import RolloutEnvironment
from osmosis.eval.sites.spawn import (
    OFFLINE_DEFAULTS,
    PROVIDER_CREDENTIAL_VARIABLES,
    READY_FD_ENV,
    Launch,
    _free_port,
    _signal_group,
    child_environment,
    forget,
    ready_pipe,
    rollout_launch,
    spawn,
)
from osmosis.listen import port_taken
from osmosis.rollout.http1 import Http1Client, TransportFailed
from osmosis.rollout.protocol import SHUTDOWN_HEADER

LOG_PREFIX = "[rollout] "
DEFAULT_STARTUP_TIMEOUT_SEC = 60.0
DEFAULT_STOP_GRACE_SEC = 5.0
_ERROR_TAIL_LINES = 20
_MAX_LINE_BYTES = 1 << 20  # a longer line is logged in pieces rather than held whole
_MAX_PENDING_LINES = 10_000  # lines waiting for a slow log; beyond that the oldest are dropped
_READER_JOIN_SEC = 2.0
_KILL_WAIT_SEC = 10.0
_HEALTH_REQUEST_SEC = 2.0
_POLL_FIRST_SEC = 0.02
_POLL_MAX_SEC = 0.1
_POLL_SIGNALLED_SEC = 0.003
_PORT_TRIES = 3  # launches on a fresh port each, when the one chosen was taken meanwhile
# The last line of a Python traceback ("ValueError: boom"), or a line that says it is an error.
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b(:.*)?$")
_ERROR_LINE = re.compile(r"\b(error|fatal|critical|panic)\b", re.IGNORECASE)


class RolloutStartError(HostError):
    """The rollout server exited or never answered `GET /health` while starting. The message
    carries its exit code (if it exited) and its last lines of output, secrets redacted: an
    entrypoint that raises at import is the user's error, not osmosis'."""

    default_hint = "fix the rollout's entrypoint; nothing was dispatched"

    def __init__(self, message: str, *, returncode: int | None, output: list[str]) -> None:
        self.returncode = returncode
        self.output_tail = output
        if output:
            message += "; its last output:\n" + "\n".join(f"  | {line}" for line in output)
        super().__init__(message)


def lost_its_port(error: RolloutStartError, port: int) -> bool:
    """Whether the server exited at start (not: never answered) while another socket has
    the loopback `port` it was given: it could not bind it."""
    return error.returncode is not None and port_taken("127.0.0.1", port)


class RolloutProcess:
    """A running rollout server: its port, its health, its death, its output.

    process = await RolloutProcess.start(env, rollout_dir, "main.py", env=variables,
                                         artifact_root=root, log=log, redactor=redactor)
    capacity = (await process.health())["concurrency"]["max_concurrent"]

    Use `start()` to make one; `stop()` (or `async with`) ends it. `exited` is set the moment
    the child dies, whoever killed it, so the engine drains its attempts back to pending.
    """

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        *,
        name: str,
        port: int,
        instance_id: str,
        log: Callable[[str], None],
        redactor: Redactor,
        loop: asyncio.AbstractEventLoop,
        socket_path: Path | None = None,
        ready_fd: int | None = None,
        terminate: Callable[[int], None] | None = None,
    ) -> None:
        self._popen = popen
        self._ready_fd = ready_fd
        self._terminate = terminate
        self.name = name
        self.port = port
        self.pid = popen.pid
        self.instance_id = instance_id
        self.socket_path = socket_path
        self.base_url = f"unix:{socket_path}" if socket_path else f"http://127.0.0.1:{port}"
        self._health_url = "http://rollout" if socket_path else self.base_url
        self._log = log
        self._redactor = redactor
        self._loop = loop
        self._exited = asyncio.Event()
        self._tail: deque[str] = deque(maxlen=_ERROR_TAIL_LINES)
        self._pending: deque[str] = deque()
        self._pending_lock = threading.Lock()
        self._flush_scheduled = False
        self._dropped = 0
        self._stop_requested = False
        self._nothing_to_shut_down = False  # its /health said so (SHUTDOWN_HEADER)
        self._reader = threading.Thread(
            target=self._read_output, name=f"rollout-output-{self.pid}", daemon=True
        )
        self._waiter = threading.Thread(
            target=self._wait_for_exit, name=f"rollout-wait-{self.pid}", daemon=True
        )

    @classmethod
    async def start(
        cls,
        environment: RolloutEnvironment,
        rollout_dir: Path,
        entrypoint: str | Path,
        *,
        env: Mapping[str, str],
        artifact_root: Path,
        log: Callable[[str], None],
        redactor: Redactor,
        port: int | None = None,
        startup_timeout: float = DEFAULT_STARTUP_TIMEOUT_SEC,
        base_env: Mapping[str, str] | None = None,
        name: str | None = None,
        wrap: Callable[[Launch], Launch] | None = None,
        spawned: Callable[[], None] | None = None,
    ) -> RolloutProcess:
        """Start `<environment.python> <entrypoint>` in `rollout_dir` and wait until
        `GET /health` answers 200. `env` is the run's `[env]` table plus resolved secrets;
        `base_env` defaults to `os.environ`; `name` (default: the rollout directory's) is what
        messages call it; `wrap` may rewrite the launch (a sandbox); `spawned()` is called
        once the process runs, before it answers. Raises `RolloutStartError`.

        process = await RolloutProcess.start(env, Path("rollouts/multiply"), "main.py",
                                             env={}, artifact_root=root, log=print,
                                             redactor=Redactor([]))
        """
        for launch in range(1, _PORT_TRIES + 1):
            chosen = port if port is not None else _free_port()
            # Spawned here, on the event loop's thread, not in a worker thread: the kernel's
            # parent-death signal fires when the *thread* that forked the child ends.
            process = cls._launch(
                environment,
                rollout_dir,
                entrypoint,
                env=env,
                base_env=os.environ if base_env is None else base_env,
                artifact_root=artifact_root,
                port=chosen,
                log=log,
                redactor=redactor,
                name=name,
                wrap=wrap,
            )
            if spawned is not None:
                spawned()
            try:
                await process._watch_until_healthy(startup_timeout)
            except RolloutStartError as error:
                # The port was free when chosen, but another process of this machine (an
                # outgoing connection's local port, say) took it before the server bound it.
                # (A sandboxed server binds in a network of its own: not retried here.)
                retry = port is None and wrap is None and launch < _PORT_TRIES
                if not (retry and lost_its_port(error, chosen)):
                    raise
                log(
                    f"rollout server {process.name!r}: port {chosen} was taken before it "
                    "could listen; starting it again on another port"
                )
                continue
            return process
        raise AssertionError("unreachable")

    @classmethod
    async def adopt(
        cls,
        popen: subprocess.Popen[bytes],
        *,
        name: str,
        port: int,
        instance_id: str,
        ready_fd: int,
        log: Callable[[str], None],
        redactor: Redactor,
        startup_timeout: float = DEFAULT_STARTUP_TIMEOUT_SEC,
        socket_path: Path | None = None,
        terminate: Callable[[int], None] | None = None,
    ) -> RolloutProcess:
        """Watch a server spawned earlier (`prestart`, a sandbox's spare) as if `start` had
        spawned it: its output from now (what it printed so far included), its health, its
        death. Takes `ready_fd`, the read end of its readiness pipe; `socket_path` and
        `terminate` are its launch's (`Launch`). Raises `RolloutStartError`.

        process = await RolloutProcess.adopt(early.popen, name="x", port=early.port, ...)
        """
        process = cls(
            popen,
            name=name,
            port=port,
            instance_id=instance_id,
            log=log,
            redactor=redactor,
            loop=asyncio.get_running_loop(),
            socket_path=socket_path,
            ready_fd=ready_fd,
            terminate=terminate,
        )
        await process._watch_until_healthy(startup_timeout)
        return process

    async def _watch_until_healthy(self, startup_timeout: float) -> None:
        self._reader.start()
        self._waiter.start()
        try:
            await self._wait_healthy(startup_timeout)
        except BaseException:
            await self.stop()
            raise

    @classmethod
    def _launch(
        cls,
        environment: RolloutEnvironment,
        rollout_dir: Path,
        entrypoint: str | Path,
        *,
        env: Mapping[str, str],
        base_env: Mapping[str, str],
        artifact_root: Path,
        port: int,
        log: Callable[[str], None],
        redactor: Redactor,
        name: str | None,
        wrap: Callable[[Launch], Launch] | None = None,
    ) -> RolloutProcess:
        instance_id = uuid.uuid4().hex
        rollout_dir = rollout_dir.resolve()
        entrypoint_path = rollout_dir / entrypoint
        if not entrypoint_path.is_file():
            raise RolloutStartError(
                f"rollout {rollout_dir.name!r}: entrypoint {entrypoint_path} does not exist",
                returncode=None,
                output=[],
            )
        artifact_root.resolve().mkdir(parents=True, exist_ok=True)
        launch = rollout_launch(
            environment,
            rollout_dir,
            entrypoint,
            env=env,
            base_env=base_env,
            artifact_root=artifact_root,
            port=port,
            instance_id=instance_id,
        )
        ready_read, ready_write = ready_pipe(launch)
        if wrap is not None:
            launch = wrap(launch)
        try:
            popen = spawn(launch, ready_write)
        except (OSError, subprocess.SubprocessError) as exc:  # e.g. the interpreter was deleted
            os.close(ready_read)
            raise RolloutStartError(
                f"rollout {rollout_dir.name!r}: cannot execute {launch.argv[0]}: {exc}",
                returncode=None,
                output=[],
            ) from exc
        except BaseException:  # `launch.started` failed: the child is gone already
            os.close(ready_read)
            raise
        return cls(
            popen,
            name=name or rollout_dir.name,
            port=port,
            instance_id=instance_id,
            log=log,
            redactor=redactor,
            loop=asyncio.get_running_loop(),
            socket_path=launch.socket_path,
            ready_fd=ready_read,
            terminate=launch.terminate,
        )

    # --- state -------------------------------------------------------------------------------

    @property
    def returncode(self) -> int | None:
        """The exit code once the child has exited (negative: killed by that signal)."""
        return self._popen.returncode

    @property
    def alive(self) -> bool:
        """True until the child has exited."""
        return not self._exited.is_set() and self._popen.returncode is None

    @property
    def exited(self) -> asyncio.Event:
        """Set when the child exits, for whatever reason. Do not set it yourself."""
        return self._exited

    @property
    def exit_reason(self) -> str:
        """Why the child is gone: its exit code or signal and its last error line (the end of
        a traceback, or a line that says error), redacted; '' while alive.

        process.exit_reason  # "rollout server 'x' exited unexpectedly (code 3): ValueError: boom"
        """
        if self.alive:
            return ""
        if self._stop_requested:
            return f"rollout server {self.name!r} was stopped"
        code = self.returncode
        how = f"code {code}"
        if code is not None and code < 0:
            with contextlib.suppress(ValueError):
                how += f", killed by {signal.Signals(-code).name}"
        reason = f"rollout server {self.name!r} exited unexpectedly ({how})"
        cause = last_error_line(self._tail)
        return f"{reason}: {cause}" if cause else reason

    @property
    def output_tail(self) -> list[str]:
        """The child's last lines of output, redacted."""
        return list(self._tail)

    async def wait_dead(self) -> int | None:
        """Wait until the child exits and return its exit code.

        died = asyncio.create_task(process.wait_dead())  # halt dispatch when it completes
        """
        await self._exited.wait()
        return self._popen.returncode

    async def health(self) -> dict[str, Any]:
        """The `GET /health` document; the engine reads `concurrency.max_concurrent` from it.

        (await process.health())["status"]  # 'ok'
        """
        client = self._http()
        try:
            reply = await client.request("GET", "/health", timeout=_HEALTH_REQUEST_SEC)
        finally:
            await client.aclose()
        if reply.status != 200:
            raise TransportFailed(f"rollout {self.name!r}: GET /health answered {reply.status}")
        document: dict[str, Any] = json.loads(reply.body)
        return document

    # --- stopping ----------------------------------------------------------------------------

    async def stop(self, grace: float = DEFAULT_STOP_GRACE_SEC) -> int | None:
        """SIGTERM the process group, wait up to `grace` seconds, then SIGKILL it. Idempotent;
        if the wait is cancelled (Ctrl-C), the group is killed at once. Returns the exit code.
        A server that said stopping it runs no code of anyone's (`SHUTDOWN_HEADER`) is killed
        at once: its graceful exit would be uvicorn's fixed ~0.2 s and nothing else.

        await process.stop()
        """
        self._close_ready_pipe()
        try:
            if not self._stop_requested:
                self._stop_requested = True
                if self._nothing_to_shut_down:
                    pass
                elif self._terminate is not None:
                    self._terminate(self.pid)
                else:
                    _signal_group(self.pid, signal.SIGTERM)
            if not self._nothing_to_shut_down:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._exited.wait(), timeout=grace)
            # Also reaches members of the group that outlived (or ignored) the leader.
            _signal_group(self.pid, signal.SIGKILL)
            with contextlib.suppress(TimeoutError):  # unkillable (stuck in the kernel): give up
                await asyncio.wait_for(self._exited.wait(), timeout=_KILL_WAIT_SEC)
            await asyncio.to_thread(self._reader.join, _READER_JOIN_SEC)
        except BaseException:
            _signal_group(self.pid, signal.SIGKILL)  # cancelled mid-stop: never leave it running
            raise
        finally:
            if self._popen.returncode is not None:
                forget(self.pid)
        return self._popen.returncode

    async def __aenter__(self) -> RolloutProcess:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    # --- starting ----------------------------------------------------------------------------

    async def _wait_healthy(self, budget_sec: float) -> None:
        deadline = time.monotonic() + budget_sec
        interval = _POLL_FIRST_SEC
        signalled = asyncio.Event()
        ready_fd = self._ready_fd
        if ready_fd is not None:

            def on_ready() -> None:
                # Once: the pipe stays readable (its data unread, or its end of file), and a
                # level-triggered reader would spin the loop until the server answers.
                self._loop.remove_reader(ready_fd)
                signalled.set()

            self._loop.add_reader(ready_fd, on_ready)
        client = self._http()
        try:
            while True:
                if self._exited.is_set():
                    await asyncio.to_thread(self._reader.join, _READER_JOIN_SEC)  # final lines
                    raise RolloutStartError(
                        f"rollout {self.name!r} exited with code {self.returncode} before "
                        "it answered GET /health",
                        returncode=self.returncode,
                        output=self.output_tail,
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RolloutStartError(
                        f"rollout {self.name!r} did not answer GET /health with 200 within "
                        f"{budget_sec:g} s (still running; stopped)",
                        returncode=None,
                        output=self.output_tail,
                    )
                if await self._answers_health(client, min(_HEALTH_REQUEST_SEC, remaining)):
                    return
                if signalled.is_set():  # the server is about to listen, or it exited
                    interval = _POLL_SIGNALLED_SEC
                wait = min(interval, max(deadline - time.monotonic(), 0))
                await _first_of(self._exited, signalled, timeout=wait)
                interval = min(interval * 1.5, _POLL_MAX_SEC)
        finally:
            self._close_ready_pipe()
            await client.aclose()

    def _close_ready_pipe(self) -> None:
        fd, self._ready_fd = self._ready_fd, None
        if fd is not None:
            self._loop.remove_reader(fd)
            os.close(fd)

    def _http(self) -> Http1Client:
        # The project's lean client, not httpx: httpx's import pulls in its own command line
        # (rich, click, pygments), ~0.2 s of a short run's start. No proxy: loopback, or the
        # sandboxed server's Unix socket, whose shim hands a connection over.
        return Http1Client(
            self._health_url,
            unix_socket=str(self.socket_path) if self.socket_path else None,
            handoff=self.socket_path is not None,
            connect_timeout=_HEALTH_REQUEST_SEC,
        )

    async def _answers_health(self, client: Http1Client, request_sec: float) -> bool:
        try:
            reply = await client.request("GET", "/health", timeout=request_sec)
            body = json.loads(reply.body) if reply.status == 200 else None
        except (TransportFailed, TimeoutError, ValueError):
            return False
        if not isinstance(body, dict):
            return False
        # Both SDKs echo the instance id we handed over; another id is another server that
        # happens to hold the port, not ours.
        answered = body.get("instance_id")
        if answered is not None and answered != self.instance_id:
            return False
        self._nothing_to_shut_down = reply.headers.get(SHUTDOWN_HEADER) == "none"
        return True

    # --- threads -----------------------------------------------------------------------------

    def _read_output(self) -> None:
        """Drain the child's pipe for its whole life, so it never blocks on a full pipe, and
        hand redacted lines to the event loop, whatever the speed of `log`."""
        stream: IO[bytes] | None = self._popen.stdout
        if stream is None:
            return
        try:
            while True:
                raw = stream.readline(_MAX_LINE_BYTES)
                if not raw:
                    break
                line = self._redactor.redact(raw.decode("utf-8", "replace").rstrip("\r\n"))
                self._tail.append(line)
                self._queue(line)
        except (OSError, ValueError):
            pass  # the pipe went away with the process
        finally:
            stream.close()

    def _queue(self, line: str) -> None:
        with self._pending_lock:
            if len(self._pending) >= _MAX_PENDING_LINES:
                self._pending.popleft()
                self._dropped += 1
            self._pending.append(line)
            if self._flush_scheduled:
                return
            self._flush_scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._flush)
        except RuntimeError:  # the loop is closed: nobody is left to read the log
            with self._pending_lock:
                self._pending.clear()
                self._flush_scheduled = False

    def _flush(self) -> None:
        with self._pending_lock:
            lines = list(self._pending)
            self._pending.clear()
            dropped, self._dropped = self._dropped, 0
            self._flush_scheduled = False
        if dropped:
            self._emit(f"… {dropped} lines dropped: the log could not keep up")
        for line in lines:
            self._emit(line)

    def _emit(self, line: str) -> None:
        with contextlib.suppress(Exception):  # a failing log must not take the loop down
            self._log(LOG_PREFIX + line)

    def _wait_for_exit(self) -> None:
        self._popen.wait()
        with contextlib.suppress(RuntimeError):  # loop closed: no one is waiting any more
            self._loop.call_soon_threadsafe(self._exited.set)


async def _first_of(*events: asyncio.Event, timeout: float) -> None:  # noqa: ASYNC109
    """Return when any of `events` is set, or after `timeout` seconds."""
    if any(event.is_set() for event in events):
        await asyncio.sleep(timeout)  # a set event must not turn the wait into a spin
        return
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


def last_error_line(lines: Iterable[str]) -> str | None:
    """The line of a process's output that says why it failed: the last traceback line
    (`ValueError: boom`), else the last line that says error; None when none does (the last
    line is then often just "Uvicorn running on ...", which explains nothing).

    last_error_line(["Traceback (most recent call last):", "  ...", "KeyError: 'x'"])
    # "KeyError: 'x'"
    """
    kept = [line.strip() for line in lines if line.strip()]
    for pattern in (_EXCEPTION_LINE, _ERROR_LINE):
        found = next((line for line in reversed(kept) if pattern.search(line)), None)
        if found is not None:
            return found
    return None


__all__ = [
    "DEFAULT_STARTUP_TIMEOUT_SEC",
    "DEFAULT_STOP_GRACE_SEC",
    "LOG_PREFIX",
    "OFFLINE_DEFAULTS",
    "PROVIDER_CREDENTIAL_VARIABLES",
    "READY_FD_ENV",
    "Launch",
    "RolloutProcess",
    "RolloutStartError",
    "child_environment",
    "last_error_line",
    "lost_its_port",
]
