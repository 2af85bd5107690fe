"""OpenAI's JSON shapes: completions, stream chunks, usage, model lists and error bodies.

Only this module knows what the wire looks like; the rest of the fake model works with
`Reply` and `Fail`.

    body = completion(request, Reply("391"), completion_id="chatcmpl-1", created=0)
    body["choices"][0]["message"]["content"]  # "391"
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from osmosis.testing.script import ChatRequest, Fail, Reply, message_text

_ERROR_KINDS = {
    400: ("invalid_request_error", "invalid_request"),
    401: ("authentication_error", "invalid_api_key"),
    403: ("permission_error", "permission_denied"),
    404: ("not_found_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    408: ("timeout_error", "timeout"),
    429: ("requests", "rate_limit_exceeded"),
    500: ("server_error", "server_error"),
    502: ("server_error", "bad_gateway"),
    503: ("server_error", "service_unavailable"),
    504: ("timeout_error", "gateway_timeout"),
}
_WORD = re.compile(r"\S+\s*")


def count_tokens(text: str) -> int:
    """Tokens, counted as whitespace-separated words: crude, but deterministic and cheap."""
    return len(text.split())


@dataclass(frozen=True)
class Usage:
    """Token counts of one completion."""

    prompt_tokens: int
    completion_tokens: int

    def as_dict(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }


def usage(request: ChatRequest, reply: Reply) -> Usage:
    """Words in every prompt message; words in the reply's text and tool calls."""
    prompt = sum(count_tokens(message_text(m)) for m in request.messages)
    completion = count_tokens(reply.content or "")
    for call in reply.tool_calls:
        completion += 1 + count_tokens(_arguments(call.arguments))
    return Usage(prompt, completion)


def _arguments(arguments: Mapping[str, Any] | str) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def _tool_calls(request: ChatRequest, reply: Reply) -> list[dict[str, Any]]:
    calls = []
    for index, call in enumerate(reply.tool_calls):
        # Deterministic ids: the same conversation gets the same ids, a longer one new ones.
        key = f"{request.text}\0{len(request.messages)}\0{index}\0{call.name}".encode()
        call_id = "call_" + hashlib.blake2b(key, digest_size=12).hexdigest()
        calls.append(
            {
                "id": call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": _arguments(call.arguments)},
            }
        )
    return calls


def finish_reason(reply: Reply) -> str:
    if reply.finish_reason is not None:
        return reply.finish_reason
    return "tool_calls" if reply.tool_calls else "stop"


def completion(
    request: ChatRequest, reply: Reply, *, completion_id: str, created: int, tokens: Usage
) -> dict[str, Any]:
    """A `chat.completion` object."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content, "refusal": None}
    if reply.tool_calls:
        message["tool_calls"] = _tool_calls(request, reply)
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": request.model,
        "system_fingerprint": "fp_osmosis_fake",
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason(reply),
            }
        ],
        "usage": tokens.as_dict(),
    }


def chunks(
    request: ChatRequest, reply: Reply, *, completion_id: str, created: int, tokens: Usage
) -> Iterator[dict[str, Any]]:
    """The `chat.completion.chunk` objects of a streamed reply, word by word.

    As OpenAI does, usage arrives in one extra chunk with no choices, and only when the
    client asked for it with `stream_options.include_usage`.
    """
    options = request.body.get("stream_options")
    include_usage = isinstance(options, Mapping) and bool(options.get("include_usage"))
    base: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": request.model,
        "system_fingerprint": "fp_osmosis_fake",
    }
    if include_usage:
        base["usage"] = None

    def chunk(delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        return {**base, "choices": [choice]}

    yield chunk({"role": "assistant", "content": "" if reply.content is not None else None})
    for word in _WORD.findall(reply.content or ""):
        yield chunk({"content": word})
    for index, call in enumerate(_tool_calls(request, reply)):
        yield chunk({"tool_calls": [{"index": index, **call}]})
    yield chunk({}, finish_reason(reply))
    if include_usage:
        yield {**base, "choices": [], "usage": tokens.as_dict()}


def sse(event: Mapping[str, Any] | str) -> bytes:
    """One server-sent event: `data: {...}` and a blank line."""
    data = event if isinstance(event, str) else json.dumps(event)
    return f"data: {data}\n\n".encode()


def error_body(status: int, message: str) -> bytes:
    """`{"error": {"message", "type", "param", "code"}}`, typed and coded by status."""
    kind, code = _ERROR_KINDS.get(
        status, ("server_error" if status >= 500 else "invalid_request_error", "error")
    )
    error = {"message": message, "type": kind, "param": None, "code": code}
    return json.dumps({"error": error}).encode()


def fail_headers(fail: Fail, default_retry_after: float) -> list[tuple[str, str]]:
    """Retry-After (whole seconds, as HTTP requires) and retry-after-ms (which OpenAI's clients
    prefer, so tests can ask for sub-second back-off)."""
    seconds = fail.retry_after
    if seconds is None and fail.status in (429, 503):
        seconds = default_retry_after
    if seconds is None:
        return []
    return [
        ("Retry-After", str(math.ceil(seconds))),
        ("retry-after-ms", str(round(seconds * 1000))),
    ]


def model_list(model: str, created: int) -> dict[str, Any]:
    """`GET /v1/models`: the one model this server pretends to be."""
    entry = {"id": model, "object": "model", "created": created, "owned_by": "osmosis"}
    return {"object": "list", "data": [entry]}
