"""The model bridge: the only way a rollout reaches the policy model.

One bridge serves one evaluation run, on loopback, inside the engine's event loop. Each
attempt gets a rollout-scoped OpenAI base URL (`bridge.rollout_url(rollout_id)`) and the run's
bearer token (`bridge.token`); any OpenAI-speaking client or agent framework works with them.
The bridge pins the run's model, holds the provider credentials, refuses credential and
transport overrides (`osmosis.eval.bridge_rules`), counts tokens and cost per rollout, records
every call for the trajectory, and retries provider faults (`osmosis.eval.retry`).

    async with ModelBridge(target=resolve_model("openai/gpt-4o-mini", env)) as bridge:
        url = bridge.rollout_url(rollout_id)        # give to the rollout with bridge.token
        ...
        calls = bridge.take_calls(rollout_id)        # for the trajectory
        usage = bridge.usage(rollout_id)             # tokens and USD for the attempt record
        if bridge.outage.is_set(): ...               # halt dispatch, leave work pending

Route: `POST /v1/rollouts/{rollout_id}/chat/completions` (clients append `/chat/completions`
to the rollout URL). `stream=true` is emulated: the provider is called without streaming and
the finished completion is replayed as SSE (`osmosis.eval.bridge_wire`), with keep-alive
comments while a slow provider works.

Provider outages: when a retryable fault (429, 5xx, no connection, timeout) outlasts the
`RetryPolicy`, the workflow gets 503 and `bridge.outage` is set with `bridge.outage_reason`,
so the engine halts dispatch instead of recording failures. Nothing clears it but the engine
(`clear_outage()`): a later successful call does not, because one lucky call says little
about a provider that just failed for a minute.

Served by uvicorn (httptools parser) running a bare ASGI callable: one route needs no
framework, and the bridge's own overhead stays far below the provider transport's.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import importlib.util
import json
import logging
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Generator, Mapping, MutableMapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

import uvicorn

from osmosis.eval.bridge_calls import CallLog, CallRecord, Usage
from osmosis.eval.bridge_rules import RequestRejected, inference_params
from osmosis.eval.bridge_wire import HEARTBEAT, error_body, sse_error, sse_stream
from osmosis.eval.pricing import price_for
from osmosis.eval.providers import (
    Completion,
    ModelTarget,
    ProviderError,
    Transport,
    open_transport,
)
from osmosis.eval.retry import RetriesExhausted, RetryPolicy, call_with_retries

__all__ = ["CallRecord", "ModelBridge", "Usage"]

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_PREFIX = "/v1/rollouts/"
_SUFFIX = "/chat/completions"
_MAX_BODY = 64 * 1024 * 1024
_REDACTED = "[REDACTED]"
_GRACEFUL_STOP = 3
_JSON_HEADERS = [(b"content-type", b"application/json")]
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


@dataclass(frozen=True)
class _Outcome:
    """What the provider side produced for one request."""

    status: int
    completion: Completion | None = None
    error: str | None = None
    code: str | None = None
    attempts: int = 0


class _EmbeddedServer(uvicorn.Server):
    """uvicorn without its signal handlers: the engine owns Ctrl-C and SIGTERM, and the bridge
    stops when the engine says so, at once rather than at uvicorn's next 0.1 s poll."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.exit_requested = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    async def main_loop(self) -> None:
        await self.on_tick(0)  # sets the default response headers
        await self.exit_requested.wait()


class ModelBridge:
    """A rollout-scoped OpenAI endpoint in front of the run's model.

    Args:
        target: the run's model (`resolve_model(...)` or a `ModelTarget`).
        token: the bearer token rollouts must send; a fresh random one by default.
        retry: how provider faults are retried before the bridge gives up (and declares an
            outage).
        redact: applied to every error text the bridge writes or records, after the
            target's own credentials are blanked.
        heartbeat: seconds between keep-alive comments on a stream still waiting for the
            provider.

        bridge = ModelBridge(target=target, retry=RetryPolicy(max_attempts=4))
        await bridge.start()
        ...
        await bridge.stop()
    """

    def __init__(
        self,
        *,
        target: ModelTarget,
        token: str | None = None,
        retry: RetryPolicy = RetryPolicy(),  # noqa: B008 - frozen, so sharing it is safe
        redact: Callable[[str], str] | None = None,
        heartbeat: float = 10.0,
    ) -> None:
        self.target = target
        self.token = token if token is not None else secrets.token_hex(16)
        if not self.token:
            raise ValueError("the bridge token must not be empty")
        self.retry = retry
        self.heartbeat = heartbeat
        self.outage = asyncio.Event()
        """Set when the provider stayed unavailable past the retry policy; see the module doc."""
        self.outage_reason: str | None = None
        self._redact = redact
        self._token_bytes = self.token.encode()
        self._secrets = tuple(s for s in (*target.secrets(), self.token) if s)
        self._log = CallLog(target.model_path)
        self._transport: Transport | None = None
        self._server: _EmbeddedServer | None = None
        self._serving: asyncio.Task[None] | None = None
        self._base_url: str | None = None
        self._pending: set[asyncio.Task[_Outcome]] = set()

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self, host: str = "127.0.0.1", port: int = 0) -> ModelBridge:
        """Open the provider transport and listen on `host:port` (0: a free port).

        Returns once connections are accepted; `base_url` then holds the real port.
        """
        if self._server is not None:
            raise RuntimeError("the model bridge is already running")
        # Off the event loop: the price map is a 3.5 MB JSON file, and LiteLLM's import
        # (for targets that need it) takes seconds.
        self._log.price = await asyncio.to_thread(price_for, self.target.model_path)
        self._transport = await asyncio.to_thread(open_transport, self.target)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        except OSError:
            sock.close()
            await self._transport.aclose()
            self._transport = None
            raise
        config = uvicorn.Config(
            self._asgi,
            lifespan="off",
            interface="asgi3",  # a bound method defeats uvicorn's detection
            proxy_headers=False,  # loopback only: no proxy to trust, one middleware fewer
            http="httptools" if importlib.util.find_spec("httptools") else "h11",
            # Leave the process's logging alone (a platform server may share the process):
            # no dictConfig, no level changes, no access log.
            log_config=None,
            log_level=None,
            access_log=False,
            server_header=False,
            date_header=False,
            # Agents pause between turns (tools, graders); keep their connections open.
            timeout_keep_alive=75,
            timeout_graceful_shutdown=_GRACEFUL_STOP,
        )
        server = _EmbeddedServer(config)
        self._server = server
        self._serving = asyncio.create_task(server.serve(sockets=[sock]), name="model-bridge")
        while not server.started:
            if self._serving.done():
                sock.close()
                self._server = None
                await self._transport.aclose()
                self._transport = None
                self._serving.result()  # re-raises why it could not start
                raise RuntimeError("the model bridge stopped while starting")
            await asyncio.sleep(0.002)
        bound_host, bound_port = sock.getsockname()[:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        self._base_url = f"http://{shown}:{bound_port}/v1"
        return self

    async def stop(self) -> None:
        """Stop listening (in-flight calls get a few seconds to finish) and close the
        provider connections. Recorded calls and usage stay readable."""
        server, serving = self._server, self._serving
        self._server = self._serving = None
        if server is not None and serving is not None:
            server.should_exit = True
            server.exit_requested.set()
            await serving
        for task in list(self._pending):
            task.cancel()
        transport, self._transport = self._transport, None
        if transport is not None:
            await transport.aclose()

    async def __aenter__(self) -> ModelBridge:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- addresses ---------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:PORT/v1` once started."""
        if self._base_url is None:
            raise RuntimeError("the model bridge has not started; await bridge.start()")
        return self._base_url

    def rollout_url(self, rollout_id: str) -> str:
        """The OpenAI base URL one rollout uses: `…/v1/rollouts/{rollout_id}`."""
        if not rollout_id or "/" in rollout_id:
            raise ValueError(f"invalid rollout id {rollout_id!r}")
        return f"{self.base_url}/rollouts/{rollout_id}"

    # -- accounting --------------------------------------------------------------------------
    def take_calls(self, rollout_id: str) -> list[CallRecord]:
        """Remove and return the calls recorded for `rollout_id`, oldest first ([] if none)."""
        return self._log.take_calls(rollout_id)

    def usage(self, rollout_id: str) -> Usage:
        """Tokens and cost of every call `rollout_id` made so far (zeros if none)."""
        return self._log.usage(rollout_id)

    def forget(self, rollout_id: str) -> None:
        """Drop everything kept for `rollout_id` (call it once the attempt is recorded, so
        memory follows concurrency rather than the number of attempts)."""
        self._log.forget(rollout_id)

    def clear_outage(self) -> None:
        """Forget a declared outage (the engine decides when the provider is back)."""
        self.outage.clear()
        self.outage_reason = None

    # -- errors and secrets -------------------------------------------------------------------
    def scrub(self, text: str) -> str:
        """`text` with the target's credentials and the bridge token blanked, then `redact`."""
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, _REDACTED)
        return self._redact(text) if self._redact is not None else text

    def _declare_outage(self, reason: str) -> None:
        if not self.outage.is_set():
            self.outage_reason = reason
            self.outage.set()
            logger.warning("model provider outage declared: %s", reason)

    def _log_retry(self, error: ProviderError, attempt: int, wait: float) -> None:
        what = f"HTTP {error.status}" if error.status is not None else error.cause
        logger.info(
            "model provider answered %s (attempt %d); retrying in %.2f s: %s",
            what,
            attempt,
            wait,
            self.scrub(error.message),
        )

    # -- calling the provider ----------------------------------------------------------------
    async def _call_provider(self, request: Mapping[str, Any]) -> _Outcome:
        transport = self._transport
        if transport is None:
            return _Outcome(503, error="the model bridge is stopping", code="bridge_stopping")
        attempts = 0

        async def attempt() -> Completion:
            nonlocal attempts
            attempts += 1
            return await transport.complete(request)

        try:
            completion = await call_with_retries(attempt, self.retry, on_retry=self._log_retry)
        except RetriesExhausted as exhausted:
            reason = self.scrub(f"the model provider is unavailable: {exhausted}")
            self._declare_outage(reason)
            return _Outcome(503, error=reason, code="provider_unavailable", attempts=attempts)
        except ProviderError as error:
            status = error.status if error.status is not None and error.status >= 400 else 502
            return _Outcome(
                status, error=self.scrub(error.message), code=error.code, attempts=attempts
            )
        except Exception as error:  # a fault of ours, not the provider's: say so, keep serving
            logger.exception("model bridge: unexpected error calling the provider")
            message = self.scrub(f"internal bridge error: {type(error).__name__}: {error}")
            return _Outcome(500, error=message, code="bridge_error", attempts=attempts)
        return _Outcome(200, completion=completion, attempts=attempts)

    def _record(
        self,
        rollout_id: str,
        started_at: datetime,
        began: float,
        messages: list[Any],
        params: Mapping[str, Any],
        outcome: _Outcome,
    ) -> None:
        self._log.record(
            rollout_id=rollout_id,
            started_at=started_at,
            latency_ms=(time.perf_counter() - began) * 1000,
            messages=messages,
            params=params,
            status=outcome.status,
            completion=outcome.completion.payload if outcome.completion is not None else None,
            error=outcome.error,
            attempts=outcome.attempts,
        )

    async def _serve_call(
        self,
        rollout_id: str,
        started_at: datetime,
        began: float,
        messages: list[Any],
        params: dict[str, Any],
    ) -> _Outcome:
        # The run's model, whatever the client named: the bridge pins it.
        request = {**params, "model": self.target.model, "messages": messages}
        outcome = await self._call_provider(request)
        self._record(rollout_id, started_at, began, messages, params, outcome)
        return outcome

    # -- HTTP ----------------------------------------------------------------------------------
    async def _asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        rollout_id = path[len(_PREFIX) : -len(_SUFFIX)]
        if (
            not path.startswith(_PREFIX)
            or not path.endswith(_SUFFIX)
            or not rollout_id
            or "/" in rollout_id
        ):
            await _send_error(send, 404, f"no route for {path}; POST {_PREFIX}{{id}}{_SUFFIX}")
            return
        if scope["method"] != "POST":
            await _send_error(send, 405, f"use POST {path}")
            return
        if not self._authorized(scope):
            await _send_error(
                send,
                401,
                "missing or invalid bearer token for the evaluation bridge",
                code="invalid_api_key",
                headers=[(b"www-authenticate", b"Bearer")],
            )
            return
        body = await _read_body(receive)
        if body is None:
            await _send_error(send, 413, "the request body is too large")
            return
        await self._chat(rollout_id, body, send)

    def _authorized(self, scope: Scope) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, credentials = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(
                    credentials.strip(), self._token_bytes
                )
        return False

    async def _chat(self, rollout_id: str, raw: bytes, send: Send) -> None:
        started_at = datetime.now(UTC)
        began = time.perf_counter()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            await _send_error(send, 400, "the request body must be a JSON object")
            return
        messages = body.get("messages")
        try:
            params = inference_params(body)
        except RequestRejected as rejected:
            outcome = _Outcome(400, error=rejected.message, code="invalid_request")
            kept = messages if isinstance(messages, list) else []
            self._record(rollout_id, started_at, began, kept, {}, outcome)
            await _send_error(send, 400, rejected.message, param=rejected.param)
            return
        assert isinstance(messages, list)  # inference_params checked it
        if body.get("stream") is True:
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
            call = self._serve_call(rollout_id, started_at, began, messages, params)
            await self._stream(call, include_usage, send)
            return
        outcome = await self._serve_call(rollout_id, started_at, began, messages, params)
        completion = outcome.completion
        if completion is None:
            await _send_error(send, outcome.status, outcome.error or "", code=outcome.code)
            return
        payload = completion.raw
        if payload is None:
            payload = json.dumps(completion.payload, separators=(",", ":")).encode()
        await _send_bytes(send, 200, payload, _JSON_HEADERS)

    async def _stream(self, call: Awaitable[_Outcome], include_usage: bool, send: Send) -> None:
        # The provider call runs as its own task so that it finishes, and is recorded, even
        # if this client goes away mid-stream.
        task = asyncio.ensure_future(call)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        done, _ = await asyncio.wait({task}, timeout=self.heartbeat)
        if done:
            # Answered before the first heartbeat: errors keep their real HTTP status.
            outcome = task.result()
            if outcome.completion is None:
                await _send_error(send, outcome.status, outcome.error or "", code=outcome.code)
            else:
                body = sse_stream(outcome.completion.payload, include_usage=include_usage)
                await _send_bytes(send, 200, body, _SSE_HEADERS)
            return
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        while not done:
            await send({"type": "http.response.body", "body": HEARTBEAT, "more_body": True})
            done, _ = await asyncio.wait({task}, timeout=self.heartbeat)
        outcome = task.result()
        if outcome.completion is None:
            tail = sse_error(outcome.status, outcome.error or "", code=outcome.code)
        else:
            tail = sse_stream(outcome.completion.payload, include_usage=include_usage)
        await send({"type": "http.response.body", "body": tail, "more_body": False})


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body; None when it exceeds the limit."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(parts)
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > _MAX_BODY:
            return None
        parts.append(chunk)
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


async def _send_bytes(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _send_error(
    send: Send,
    status: int,
    message: str,
    *,
    code: str | None = None,
    param: str | None = None,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    body = error_body(status, message, code=code, param=param)
    await _send_bytes(send, status, body, [*_JSON_HEADERS, *(headers or [])])
