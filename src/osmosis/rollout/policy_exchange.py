"""What both ways of calling the policy share: how long a call may take, and how one
exchange is recorded on the rollout's conversation.

    record_exchange(ctx, body, reply_message, payload, latency_ms=812.0)
    ctx.recorder.calls[-1].prompt_tokens  # from the reply's `usage`

`osmosis.rollout.policy` (`ctx.chat`, the lean client) and `osmosis.rollout.policy_openai`
(`ctx.openai_client()`, httpx) both import this; neither imports the other at import time.
"""

from __future__ import annotations

from typing import Any

from osmosis.rollout.context import PolicyCall, RolloutContext
from osmosis.rollout.types import Message, Messages

POLICY_TIMEOUT_SEC = 600.0
"""How long one policy call may take, either way it is made."""


def record_exchange(
    ctx: RolloutContext, body: dict[str, Any], message: Message, payload: Any, latency_ms: float
) -> None:
    """Record one chat completion (request `body`, reply `message`, the reply's `payload`
    for its model and usage) on the rollout's conversation."""
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


__all__ = ["POLICY_TIMEOUT_SEC", "record_exchange"]
