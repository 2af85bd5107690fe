"""`FakeModelServer`: the scripted OpenAI-compatible model, served on a loopback port.

Use it from synchronous tests (it runs in a background thread) or from asyncio tests (it
serves on the running loop):

    with FakeModelServer(latency=0.01) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused")

    async with FakeModelServer(script={"judge": '{"score": 1}'}) as server:
        ...
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

from osmosis.testing._app import FakeModelApp, Stats
from osmosis.testing._http import HttpServer, serve
from osmosis.testing._model import FakeModel, ModelOptions
from osmosis.testing.script import ChatRequest, Rule, Script, ScriptLike

_T = TypeVar("_T")
_STOP_TIMEOUT = 10.0


class FakeModelServer:
    """A deterministic OpenAI-compatible chat model on `http://HOST:PORT/v1`.

    Unscripted, it calls the first offered tool, answers arithmetic ("What is 17 * 23?" gets
    "391") and otherwise echoes the last message. `script` rules answer first (see
    `osmosis.testing.script`).

    Options:
        host, port: where to listen; port 0 picks a free port (read it from `port`).
        latency: seconds to wait before each answer, without blocking other requests.
        wrong_rate, seed: the share of arithmetic prompts answered with a wrong number;
            the same prompt is wrong, or right, every time for the same seed.
        error_rate, error_status: the share of chat requests answered with this error;
            decided per (seed, conversation, attempt), so retries usually succeed.
        retry_after: seconds advertised in Retry-After on 429 and 503 answers.
        rate_limit: the most chat completions accepted in any one second (a provider's rate
            limit); those above it are answered 429 at once, with `retry_after`. 0: no limit.
        model: the model id `GET /v1/models` lists (responses echo the request's model).
        script: rules, or a `{substring: answer}` mapping, that answer before the built-ins.

        with FakeModelServer(error_rate=0.5, error_status=500, seed=1) as server:
            httpx.post(server.base_url + "/chat/completions", json={...})
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        latency: float = 0.0,
        wrong_rate: float = 0.0,
        seed: int = 0,
        error_rate: float = 0.0,
        error_status: int = 429,
        retry_after: float = 1.0,
        model: str = "fake-model",
        script: ScriptLike = (),
        rate_limit: float = 0.0,
    ) -> None:
        self.options = ModelOptions(
            latency=latency,
            wrong_rate=wrong_rate,
            seed=seed,
            error_rate=error_rate,
            error_status=error_status,
            retry_after=retry_after,
            model=model,
            rate_limit=rate_limit,
        )
        self.host = host
        self._requested_port = port
        self._app = FakeModelApp(FakeModel(self.options, Script(script)))
        self._http: HttpServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self._thread_error: BaseException | None = None
        self._port: int | None = None  # kept after stop, so URLs stay printable

    # -- addresses -------------------------------------------------------------------------
    @property
    def port(self) -> int:
        """The port it listens on (the real one when started with port 0)."""
        if self._port is None:
            raise RuntimeError("the fake model server has not started; use `with` or start()")
        return self._port

    @property
    def url(self) -> str:
        """The server root, e.g. http://127.0.0.1:8123 (GET /stats lives here)."""
        host = "127.0.0.1" if self.host in ("", "0.0.0.0") else self.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, e.g. http://127.0.0.1:8123/v1."""
        return self.url + "/v1"

    # -- running on the caller's event loop --------------------------------------------------
    async def start_async(self) -> FakeModelServer:
        """Listen on the running event loop; requests are served while the loop runs."""
        if self._http is not None:
            raise RuntimeError("the fake model server is already running")
        self._loop = asyncio.get_running_loop()
        self._http = await serve(self._app, self.host, self._requested_port)
        self._port = self._http.port
        return self

    async def stop_async(self) -> None:
        """Close the listener and every connection."""
        http, self._http = self._http, None
        if http is not None:
            await http.close()

    async def __aenter__(self) -> FakeModelServer:
        return await self.start_async()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop_async()

    # -- running in a background thread -----------------------------------------------------
    def start(self) -> FakeModelServer:
        """Serve from a background thread with its own event loop; returns once listening."""
        if self._thread is not None or self._http is not None:
            raise RuntimeError("the fake model server is already running")
        ready = threading.Event()
        self._thread_error = None
        self._thread = threading.Thread(
            target=self._thread_main, args=(ready,), name="osmosis-fake-model", daemon=True
        )
        self._thread.start()
        ready.wait()
        if self._thread_error is not None:
            self._thread.join()
            self._thread = None
            raise self._thread_error
        return self

    def stop(self) -> None:
        """Stop the background thread and wait for it (idempotent)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        thread.join(_STOP_TIMEOUT)

    def __enter__(self) -> FakeModelServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _thread_main(self, ready: threading.Event) -> None:
        async def main() -> None:
            self._stop = asyncio.Event()
            try:
                await self.start_async()
            except BaseException as error:  # handed to start(), which re-raises it
                self._thread_error = error
                return
            finally:
                ready.set()
            try:
                await self._stop.wait()
            finally:
                await self.stop_async()

        asyncio.run(main())

    # -- inspecting and scripting ------------------------------------------------------------
    def _on_loop(self, function: Callable[[], _T]) -> _T:
        """Run `function` on the server's loop thread: the app's state is not thread-safe."""
        loop = self._loop
        if self._thread is None or loop is None or not loop.is_running():
            return function()

        async def call() -> _T:
            return function()

        return asyncio.run_coroutine_threadsafe(call(), loop).result(_STOP_TIMEOUT)

    def stats(self) -> Stats:
        """Counters since start or the last reset: `server.stats().chat_completions`."""
        return self._on_loop(self._app.stats)

    def reset(self) -> None:
        """Zero the stats, clear `requests` and restart the injected-error sequence."""
        self._on_loop(self._app.reset)

    @property
    def requests(self) -> list[ChatRequest]:
        """The last 1,000 chat requests received, oldest first."""
        return self._on_loop(lambda: list(self._app.history))

    def add_rule(self, rule: Rule) -> None:
        """Script one more answer while running: `server.add_rule(Rule(respond=Fail(500)))`."""
        self._on_loop(lambda: self._app.model.script.add(rule))

    def clear_rules(self) -> None:
        """Remove every scripted rule; the built-in behaviour answers again."""
        self._on_loop(self._app.model.script.clear)

    def __repr__(self) -> str:
        where = self.url if self._http is not None else "stopped"
        options: dict[str, Any] = {
            k: v for k, v in vars(self.options).items() if v != getattr(ModelOptions, k)
        }
        return f"FakeModelServer({where}, {options})"
