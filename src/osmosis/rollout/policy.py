"""Calling the policy model from a workflow.

The controller gives each rollout its own OpenAI-compatible URL and bearer token. These
helpers use them and record every exchange, so a workflow that returns None still produces
its conversation as the sample:

    reply = await ctx.chat([{"role": "user", "content": "What is 17 * 23?"}])
    client = ctx.openai_client()   # a ready openai.AsyncOpenAI, recorded the same way
"""

from __future__ import annotations

import asyncio
import json
import time
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import aiohttp
import httpx

from osmosis.rollout.context import PolicyCall, RolloutContext, require_rollout_context
from osmosis.rollout.types import Message, Messages

if TYPE_CHECKING:
    from openai import AsyncOpenAI

# The bridge ignores the model name and pins the run's model; this one only fills the field.
PLACEHOLDER_MODEL = "osmosis-rollout"
_TIMEOUT_SEC = 600.0
_TIMEOUT = httpx.Timeout(_TIMEOUT_SEC, connect=10.0)


class PolicyError(Exception):
    """The policy endpoint answered with an error status."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(f"policy call failed with HTTP {status_code}: {message}")
        self.status_code = status_code


_sessions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession] = (
    weakref.WeakKeyDictionary()
)


def _shared_session() -> aiohttp.ClientSession:
    # One pooled session per event loop: a connection per call would dominate fast policies,
    # and aiohttp's pool stays cheap at the concurrency rollouts run at (httpx's does not).
    loop = asyncio.get_running_loop()
    session = _sessions.get(loop)
    if session is None or session.closed:
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60),
            timeout=aiohttp.ClientTimeout(total=_TIMEOUT_SEC, sock_connect=10.0),
        )
        _sessions[loop] = session
    return session


async def close_shared_client() -> None:
    """Close this event loop's pooled session (the rollout server does so at shutdown)."""
    session = _sessions.pop(asyncio.get_running_loop(), None)
    if session is not None:
        await session.close()


async def chat(
    messages: Sequence[Message],
    *,
    tools: Sequence[dict[str, Any]] | None = None,
    rollout: RolloutContext | None = None,
    **params: Any,
) -> Message:
    """Send one chat completion to the rollout's policy and return the assistant message.

        reply = await chat([{"role": "user", "content": "What is 2 + 2?"}])
        reply["content"]  # "4"

    `params` pass through (temperature, tool_choice, response_format, ...).
    """
    ctx = rollout or require_rollout_context()
    url = _completions_url(ctx)
    body: dict[str, Any] = {"model": PLACEHOLDER_MODEL, "messages": list(messages), **params}
    if tools is not None:
        body["tools"] = list(tools)
    headers = {"Authorization": f"Bearer {ctx.api_key}"} if ctx.api_key else {}
    started = time.perf_counter()
    async with _shared_session().post(url, json=body, headers=headers) as response:
        content = await response.read()
        status = response.status
    latency_ms = (time.perf_counter() - started) * 1000
    if status >= 400:
        raise PolicyError(status, _error_text(content))
    payload = json.loads(content)
    message = dict(payload["choices"][0]["message"])
    _record(ctx, body, message, payload, latency_ms)
    return message


def openai_client(rollout: RolloutContext | None = None, **kwargs: Any) -> AsyncOpenAI:
    """An `openai.AsyncOpenAI` pointed at the rollout's policy, recording each exchange.

    client = openai_client()
    await client.chat.completions.create(model="any", messages=[...])
    """
    try:
        from openai import AsyncOpenAI
    except ImportError as exc:  # openai is optional inside rollout environments
        raise ImportError("openai_client() needs the openai package: pip install openai") from exc
    ctx = rollout or require_rollout_context()
    transport = _RecordingTransport(ctx)
    return AsyncOpenAI(
        base_url=ctx.chat_completions_url,
        api_key=ctx.api_key or "unused",
        # openai accepts classic httpx clients as well as httpx2 ones; only its stubs say no.
        http_client=httpx.AsyncClient(transport=transport, timeout=_TIMEOUT),  # type: ignore[arg-type]
        **kwargs,
    )


class _RecordingTransport(httpx.AsyncBaseTransport):
    """Passes requests through and records non-streaming chat completions."""

    def __init__(self, ctx: RolloutContext) -> None:
        self._ctx = ctx
        self._inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        started = time.perf_counter()
        response = await self._inner.handle_async_request(request)
        if not request.url.path.endswith("/chat/completions") or response.status_code >= 400:
            return response
        try:
            body = json.loads(request.content)
        except ValueError:
            return response
        if body.get("stream"):
            return response  # streamed replies are passed through unrecorded
        content = await response.aread()
        latency_ms = (time.perf_counter() - started) * 1000
        try:
            payload = json.loads(content)
            _record(self._ctx, body, dict(payload["choices"][0]["message"]), payload, latency_ms)
        except (ValueError, KeyError, IndexError, TypeError):
            pass  # recording is best effort; the caller still gets the response
        return httpx.Response(
            status_code=response.status_code,
            headers=response.headers,
            content=content,
            request=request,
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


def _completions_url(ctx: RolloutContext) -> str:
    if not ctx.chat_completions_url:
        raise RuntimeError("this rollout has no chat_completions_url")
    return ctx.chat_completions_url.rstrip("/") + "/chat/completions"


def _record(
    ctx: RolloutContext, body: dict[str, Any], message: Message, payload: Any, latency_ms: float
) -> None:
    usage = payload.get("usage") or {} if isinstance(payload, dict) else {}
    messages: Messages = [dict(m) for m in body.get("messages") or []]
    ctx.recorder.record(
        PolicyCall(
            request_messages=messages,
            response_message=message,
            model=payload.get("model") if isinstance(payload, dict) else None,
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
            latency_ms=round(latency_ms, 3),
        )
    )


def _error_text(content: bytes) -> str:
    try:
        error = json.loads(content).get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
    except (ValueError, AttributeError):
        pass
    return content[:500].decode("utf-8", errors="replace")
