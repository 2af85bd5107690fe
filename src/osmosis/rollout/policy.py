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
from urllib.parse import urlsplit

from osmosis.rollout.context import RolloutContext, require_rollout_context
from osmosis.rollout.http1 import Http1Client, encode_headers
from osmosis.rollout.policy_exchange import POLICY_TIMEOUT_SEC, record_exchange
from osmosis.rollout.types import Message

if TYPE_CHECKING:
    from openai import AsyncOpenAI

# The bridge ignores the model name and pins the run's model; this one only fills the field.
PLACEHOLDER_MODEL = "osmosis-rollout"
_KEEPALIVE_SEC = 4.0  # below uvicorn's default keep-alive (5 s): never a closing connection
_JSON = encode_headers({"Content-Type": "application/json"})


class PolicyError(Exception):
    """The policy endpoint answered with an error status."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(f"policy call failed with HTTP {status_code}: {message}")
        self.status_code = status_code


_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Http1Client]] = (
    weakref.WeakKeyDictionary()
)


def _shared_client(origin: str) -> Http1Client:
    # One pool of keep-alive connections per event loop and server: a connection per call
    # would dominate fast policies, and the lean client costs a tenth of aiohttp's CPU
    # per call (osmosis.rollout.http1).
    loop = asyncio.get_running_loop()
    clients = _clients.get(loop)
    if clients is None:
        clients = _clients[loop] = {}
    client = clients.get(origin)
    if client is None:
        client = clients[origin] = Http1Client(origin, keepalive_sec=_KEEPALIVE_SEC)
    return client


async def close_shared_client() -> None:
    """Close this event loop's pooled connections (the rollout server does so at shutdown)."""
    clients = _clients.pop(asyncio.get_running_loop(), None) or {}
    for client in clients.values():
        await client.aclose()


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
    url = urlsplit(_completions_url(ctx))
    body: dict[str, Any] = {"model": PLACEHOLDER_MODEL, "messages": list(messages), **params}
    if tools is not None:
        body["tools"] = list(tools)
    headers = _JSON + (
        encode_headers({"Authorization": f"Bearer {ctx.api_key}"}) if ctx.api_key else b""
    )
    data = json.dumps(body, separators=(",", ":")).encode()
    target = url.path + (f"?{url.query}" if url.query else "")
    started = time.perf_counter()
    reply = await _shared_client(f"{url.scheme}://{url.netloc}").request(
        "POST", target, body=data, headers=headers, timeout=POLICY_TIMEOUT_SEC
    )
    latency_ms = (time.perf_counter() - started) * 1000
    content = reply.body
    if reply.status >= 400:
        raise PolicyError(reply.status, _error_text(content))
    payload = json.loads(content)
    message = dict(payload["choices"][0]["message"])
    record_exchange(ctx, body, message, payload, latency_ms)
    return message


def openai_client(rollout: RolloutContext | None = None, **kwargs: Any) -> AsyncOpenAI:
    """An `openai.AsyncOpenAI` pointed at the rollout's policy, recording each exchange
    (`osmosis.rollout.policy_openai`, which imports httpx: ~60 ms a rollout that only uses
    `chat` should not pay on its first call)."""
    from osmosis.rollout.policy_openai import openai_client as recorded_openai_client

    return recorded_openai_client(rollout, **kwargs)


def _completions_url(ctx: RolloutContext) -> str:
    if not ctx.chat_completions_url:
        raise RuntimeError("this rollout has no chat_completions_url")
    return ctx.chat_completions_url.rstrip("/") + "/chat/completions"


def _error_text(content: bytes) -> str:
    try:
        error = json.loads(content).get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
    except (ValueError, AttributeError):
        pass
    return content[:500].decode("utf-8", errors="replace")
