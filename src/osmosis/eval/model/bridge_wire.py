"""The OpenAI JSON the bridge writes itself (error bodies, emulated streams), and the
bridge route's HTTP helpers (rollout ids from paths, refusals, whole answers).

The bridge calls providers without streaming and, when a rollout asked for `stream=true`,
replays the finished completion as server-sent events: one `chat.completion.chunk` carrying
the whole message (content and/or tool calls) with its `finish_reason`, a usage chunk when
`stream_options.include_usage` is set, then `data: [DONE]`. The openai client, LiteLLM's
proxy client and agent frameworks assemble that exactly as a token-by-token stream.

    sse_stream(completion, include_usage=True)  # b'data: {chunk}\\n\\n…data: [DONE]\\n\\n'
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from osmosis.eval.model.bridge_http import Refusal

__all__ = [
    "HEARTBEAT",
    "JSON_HEADERS",
    "ROUTE_PREFIX",
    "ROUTE_SUFFIX",
    "declared_length",
    "error_body",
    "error_object",
    "openai_error",
    "read_body",
    "refuse",
    "rollout_of",
    "send_bytes",
    "send_error",
    "sse_error",
    "sse_stream",
    "too_large",
]

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

ROUTE_PREFIX = "/v1/rollouts/"
ROUTE_SUFFIX = "/chat/completions"
JSON_HEADERS = [(b"content-type", b"application/json")]

HEARTBEAT = b": keep-alive\n\n"
"""An SSE comment: keeps a waiting stream's connection alive; clients skip it."""

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


def error_object(
    status: int, message: str, *, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """`{"message", "type", "param", "code"}` as OpenAI writes them, typed by status."""
    kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"message": message, "type": kind, "param": param, "code": code}


def error_body(
    status: int, message: str, *, code: str | None = None, param: str | None = None
) -> bytes:
    """An OpenAI-shaped error response body: `{"error": {...}}`."""
    return json.dumps({"error": error_object(status, message, code=code, param=param)}).encode()


def _event(data: Mapping[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return b"data: " + text.encode() + b"\n\n"


def sse_error(status: int, message: str, *, code: str | None = None) -> bytes:
    """An error inside a stream that has already answered 200: the openai client raises it."""
    return _event({"error": error_object(status, message, code=code)}) + _event("[DONE]")


def _delta(message: Mapping[str, Any]) -> dict[str, Any]:
    delta: dict[str, Any] = {"role": "assistant"}
    for key, value in message.items():
        if key == "role" or value is None:
            continue
        if key == "tool_calls" and isinstance(value, list):
            # Stream deltas address each tool call by its position.
            value = [
                {"index": index, **call} if isinstance(call, Mapping) else call
                for index, call in enumerate(value)
            ]
        delta[key] = value
    return delta


def sse_stream(completion: Mapping[str, Any], *, include_usage: bool) -> bytes:
    """A finished `chat.completion` as the complete body of an emulated stream."""
    choices = completion.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else {}
    message = choice.get("message") if isinstance(choice, Mapping) else None
    base: dict[str, Any] = {
        "id": completion.get("id") or "chatcmpl-osmosis",
        "object": "chat.completion.chunk",
        "created": completion.get("created") or int(time.time()),
        "model": completion.get("model") or "",
    }
    if completion.get("system_fingerprint"):
        base["system_fingerprint"] = completion["system_fingerprint"]
    chunk = {
        **base,
        "choices": [
            {
                "index": 0,
                "delta": _delta(message if isinstance(message, Mapping) else {}),
                "logprobs": choice.get("logprobs") if isinstance(choice, Mapping) else None,
                "finish_reason": (
                    choice.get("finish_reason") if isinstance(choice, Mapping) else None
                )
                or "stop",
            }
        ],
    }
    if not include_usage:
        return _event(chunk) + _event("[DONE]")
    # As OpenAI does: usage is null on content chunks and arrives in a final chunk of its own.
    usage_chunk = {**base, "choices": [], "usage": completion.get("usage")}
    return _event({**chunk, "usage": None}) + _event(usage_chunk) + _event("[DONE]")


def rollout_of(path: str) -> str | None:
    """The rollout id of `/v1/rollouts/{id}/chat/completions`; None for any other path."""
    if not path.startswith(ROUTE_PREFIX) or not path.endswith(ROUTE_SUFFIX):
        return None
    rollout_id = path[len(ROUTE_PREFIX) : -len(ROUTE_SUFFIX)]
    return rollout_id if rollout_id and "/" not in rollout_id else None


def declared_length(headers: list[tuple[bytes, bytes]]) -> int:
    """The request's `content-length`, 0 when it has none (chunked: checked as it arrives)."""
    for name, value in headers:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0  # the parser refuses it
    return 0


def too_large(limit: int) -> str:
    return f"the request body is too large: the limit is {limit} bytes"


def refuse(
    status: int,
    message: str,
    *,
    code: str | None = None,
    headers: tuple[tuple[bytes, bytes], ...] = (),
) -> Refusal:
    return Refusal(status, error_body(status, message, code=code), (*JSON_HEADERS, *headers))


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole request body; None when it exceeds `limit`."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(parts)
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


def openai_error(status: int, message: str) -> tuple[bytes, bytes]:
    """The bridge server's own refusals (400, 413, 431, 500) in the shape OpenAI clients read."""
    return b"application/json", error_body(status, message)


async def send_bytes(
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


async def send_error(
    send: Send,
    status: int,
    message: str,
    *,
    code: str | None = None,
    param: str | None = None,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    body = error_body(status, message, code=code, param=param)
    await send_bytes(send, status, body, [*JSON_HEADERS, *(headers or [])])
