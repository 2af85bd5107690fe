"""`openai_client()`: an `openai.AsyncOpenAI` for a workflow, pointed at its rollout's policy
and recording every non-streaming chat completion, as `ctx.chat` does.

    client = ctx.openai_client()
    await client.chat.completions.create(model="any", messages=[...])

Apart from `osmosis.rollout.policy` because it needs httpx (the transport openai uses),
whose import costs ~60 ms that a workflow calling only `ctx.chat` should not pay. What the
two share (the call timeout, recording an exchange) is in `osmosis.rollout.policy_exchange`.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import httpx

from osmosis.rollout.context import RolloutContext, require_rollout_context
from osmosis.rollout.policy_exchange import POLICY_TIMEOUT_SEC, record_exchange

if TYPE_CHECKING:
    from openai import AsyncOpenAI

_TIMEOUT = httpx.Timeout(POLICY_TIMEOUT_SEC, connect=10.0)


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
            record_exchange(
                self._ctx, body, dict(payload["choices"][0]["message"]), payload, latency_ms
            )
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
