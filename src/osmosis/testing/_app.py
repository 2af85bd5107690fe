"""The fake model's HTTP routes: chat completions under any prefix, models, and stats.

POST  .../chat/completions   any path ending so: /v1/..., /v1/rollouts/abc/..., /x/y/...
GET   .../models             the one model this server pretends to be
GET   /stats                 counters since start (or the last reset), as JSON
POST  /stats/reset           zero the counters and forget injected-error attempts
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from osmosis.testing import _wire
from osmosis.testing._http import Request, Response, StreamResponse
from osmosis.testing._model import FakeModel
from osmosis.testing.script import ChatRequest, Fail

HISTORY_SIZE = 1000


@dataclass(frozen=True)
class Stats:
    """What the server has done since it started or was last reset.

    server.stats().chat_completions  # 3
    """

    requests: int = 0
    """Every HTTP request except those to /stats."""
    chat_completions: int = 0
    """Requests to .../chat/completions, answered or failed."""
    streams: int = 0
    """Chat completions answered as server-sent events."""
    tool_calls: int = 0
    """Chat completions answered with tool calls."""
    errors: int = 0
    """Chat completions answered with an error status (injected, scripted or a bad request)."""
    rate_limited: int = 0
    """Chat completions answered 429 because they came above `rate_limit` (among `errors`)."""
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class _Counters:
    """Mutable twins of `Stats`' fields, bumped by the event loop only."""

    def __init__(self) -> None:
        self.requests = self.chat_completions = self.streams = self.tool_calls = 0
        self.errors = self.prompt_tokens = self.completion_tokens = self.rate_limited = 0

    def snapshot(self) -> Stats:
        return Stats(**vars(self))


def _json(status: int, payload: Any, headers: Iterable[tuple[str, str]] = ()) -> Response:
    return Response(status, json.dumps(payload).encode(), headers=tuple(headers))


def _error(status: int, message: str, headers: Iterable[tuple[str, str]] = ()) -> Response:
    return Response(status, _wire.error_body(status, message), headers=tuple(headers))


class FakeModelApp:
    """Routes HTTP requests to the fake model and keeps count."""

    def __init__(self, model: FakeModel) -> None:
        self.model = model
        self.history: deque[ChatRequest] = deque(maxlen=HISTORY_SIZE)
        self._counters = _Counters()
        self._created = int(time.time())
        self._accepted: deque[float] = deque()  # when the last second's calls were accepted

    def stats(self) -> Stats:
        return self._counters.snapshot()

    def reset(self) -> None:
        """Zero the counters, clear the history and restart the injected-error sequence."""
        self._counters = _Counters()
        self._accepted.clear()
        self.history.clear()
        self.model.faults.reset()

    async def __call__(self, request: Request) -> Response | StreamResponse:
        path = request.path.rstrip("/")
        if path == "/stats":
            return _json(200, self.stats().as_dict())
        if path == "/stats/reset":
            if request.method != "POST":
                return _error(405, "use POST /stats/reset")
            self.reset()
            return _json(200, self.stats().as_dict())
        self._counters.requests += 1
        if path.endswith("/chat/completions"):
            if request.method != "POST":
                return _error(405, f"use POST {request.path}")
            return await self._chat(request)
        if path.endswith("/models") and request.method == "GET":
            return _json(200, _wire.model_list(self.model.options.model, self._created))
        return _error(404, f"no route for {request.method} {request.path}")

    def _over_rate(self) -> bool:
        """Whether a call now would exceed `rate_limit` calls in the last second (else it
        counts as accepted)."""
        limit = self.model.options.rate_limit
        if limit <= 0:
            return False
        now = time.monotonic()
        accepted = self._accepted
        while accepted and accepted[0] <= now - 1.0:
            accepted.popleft()
        if len(accepted) >= limit:
            return True
        accepted.append(now)
        return False

    async def _chat(self, http: Request) -> Response | StreamResponse:
        counters = self._counters
        counters.chat_completions += 1
        try:
            body = json.loads(http.body)
        except ValueError:
            counters.errors += 1
            return _error(400, "the request body is not valid JSON")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            counters.errors += 1
            return _error(400, "the request body must be a JSON object with a 'messages' list")

        request = ChatRequest(body, http.path, http.headers)
        self.history.append(request)
        if self._over_rate():
            counters.errors += 1
            counters.rate_limited += 1
            limit = self.model.options.rate_limit
            headers = _wire.fail_headers(Fail(429), self.model.options.retry_after)
            return _error(429, f"rate limit reached: {limit:g} requests per second", headers)
        decision = self.model.answer(request)
        delay = self.model.options.latency + decision.delay
        if delay > 0:
            await asyncio.sleep(delay)

        answer = decision.answer
        if isinstance(answer, Fail):
            counters.errors += 1
            message = answer.message or f"injected {answer.status} error from the fake model"
            headers = _wire.fail_headers(answer, self.model.options.retry_after)
            return _error(answer.status, message, headers)

        tokens = _wire.usage(request, answer)
        counters.prompt_tokens += tokens.prompt_tokens
        counters.completion_tokens += tokens.completion_tokens
        if answer.tool_calls:
            counters.tool_calls += 1
        completion_id = "chatcmpl-" + secrets.token_hex(12)
        created = int(time.time())
        if request.stream:
            counters.streams += 1
            events = _wire.chunks(
                request, answer, completion_id=completion_id, created=created, tokens=tokens
            )
            return StreamResponse(200, _sse(events))
        payload = _wire.completion(
            request, answer, completion_id=completion_id, created=created, tokens=tokens
        )
        return _json(200, payload)


async def _sse(events: Iterable[dict[str, Any]]) -> AsyncIterator[bytes]:
    for event in events:
        yield _wire.sse(event)
    yield _wire.sse("[DONE]")
