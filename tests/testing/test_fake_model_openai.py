"""The official `openai` async client against the fake model, served on the test's own loop."""

from __future__ import annotations

import json

import openai
import pytest

from osmosis.testing import FakeModelServer

pytestmark = pytest.mark.anyio

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculate",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer"},
                    "op": {"type": "string", "enum": ["add", "subtract", "multiply", "divide"]},
                    "b": {"type": "integer"},
                },
            },
        },
    }
]


def client(server: FakeModelServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


async def test_completion_through_the_openai_client() -> None:
    async with FakeModelServer() as server, client(server) as llm:
        completion = await llm.chat.completions.create(
            model="gpt-fake", messages=[{"role": "user", "content": "What is 17 * 23?"}]
        )
    assert completion.choices[0].message.content == "391"
    assert completion.model == "gpt-fake"
    assert completion.usage is not None and completion.usage.total_tokens > 0


async def test_tool_call_through_the_openai_client() -> None:
    async with FakeModelServer() as server, client(server) as llm:
        completion = await llm.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "What is 12 - 5?"}],
            tools=TOOLS,  # type: ignore[arg-type]
        )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    function = choice.message.tool_calls[0].function  # type: ignore[union-attr]
    assert function.name == "calculate"
    assert json.loads(function.arguments) == {"a": 12, "op": "subtract", "b": 5}


async def test_streaming_through_the_openai_client() -> None:
    async with FakeModelServer() as server, client(server) as llm:
        stream = await llm.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "stream these four words"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces, usage = [], None
        async for chunk in stream:
            if chunk.choices:
                pieces.append(chunk.choices[0].delta.content or "")
            if chunk.usage is not None:
                usage = chunk.usage
    assert "".join(pieces) == "stream these four words"
    assert usage is not None and usage.completion_tokens == 4


async def test_rate_limit_surfaces_as_the_clients_error() -> None:
    async with FakeModelServer(error_rate=1.0, error_status=429) as server, client(server) as llm:
        with pytest.raises(openai.RateLimitError) as caught:
            await llm.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}]
            )
    assert caught.value.status_code == 429
    assert caught.value.code == "rate_limit_exceeded"


async def test_the_client_retries_through_injected_errors() -> None:
    async with (
        FakeModelServer(error_rate=0.5, error_status=429, seed=2, retry_after=0.01) as server,
        openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=8) as llm,
    ):
        for n in range(4):
            completion = await llm.chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"What is {n} + 1?"}]
            )
            assert completion.choices[0].message.content == str(n + 1)
    assert server.stats().chat_completions >= 4
