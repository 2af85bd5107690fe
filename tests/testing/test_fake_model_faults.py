"""Latency, wrong answers and injected errors: honoured, and reproducible for a seed."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from osmosis.testing import FakeModelServer

QUESTIONS = [f"What is {n} * 7?" for n in range(1, 41)]


def ask(text: str, **body: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], **body}


def answers(client: httpx.Client, server: FakeModelServer, questions: list[str]) -> list[str]:
    url = server.base_url + "/chat/completions"
    return [
        client.post(url, json=ask(q)).json()["choices"][0]["message"]["content"] for q in questions
    ]


def statuses(
    client: httpx.Client, server: FakeModelServer, questions: list[str], attempts: int
) -> dict[str, list[int]]:
    """Each question's statuses over `attempts` tries."""
    url = server.base_url + "/chat/completions"
    return {
        q: [client.post(url, json=ask(q)).status_code for _ in range(attempts)] for q in questions
    }


@pytest.mark.anyio
async def test_latency_delays_each_answer_without_blocking_others() -> None:
    async with (
        FakeModelServer(latency=0.2) as server,
        httpx.AsyncClient(base_url=server.base_url) as http,
    ):
        started = time.perf_counter()
        responses = await asyncio.gather(
            *(http.post("/chat/completions", json=ask("hi")) for _ in range(5))
        )
        elapsed = time.perf_counter() - started
    assert [r.status_code for r in responses] == [200] * 5
    assert 0.2 <= elapsed < 0.9  # concurrent: about one latency, not five (1.0 s)


def test_wrong_rate_is_deterministic_per_prompt_and_seed(client: httpx.Client) -> None:
    correct = [str(n * 7) for n in range(1, 41)]
    with FakeModelServer(wrong_rate=0.5, seed=3) as server:
        first = answers(client, server, QUESTIONS)
        again = answers(client, server, QUESTIONS)
    with FakeModelServer(wrong_rate=0.5, seed=3) as server:
        restarted = answers(client, server, list(reversed(QUESTIONS)))[::-1]
    with FakeModelServer(wrong_rate=0.5, seed=4) as server:
        other_seed = answers(client, server, QUESTIONS)

    assert first == again == restarted
    wrong = [i for i, (got, want) in enumerate(zip(first, correct, strict=True)) if got != want]
    assert 5 < len(wrong) < 35  # about half
    assert all(first[i].lstrip("-").isdigit() for i in wrong)  # wrong is still a number
    assert other_seed != first


@pytest.mark.parametrize(("rate", "expected"), [(0.0, 0), (1.0, 40)])
def test_wrong_rate_extremes(client: httpx.Client, rate: float, expected: int) -> None:
    with FakeModelServer(wrong_rate=rate) as server:
        got = answers(client, server, QUESTIONS)
    assert sum(a != str(n * 7) for n, a in zip(range(1, 41), got, strict=True)) == expected


def test_rate_limit_errors_carry_retry_after(client: httpx.Client) -> None:
    with FakeModelServer(error_rate=1.0, error_status=429, retry_after=0.25) as server:
        response = client.post(server.base_url + "/chat/completions", json=ask("hi"))
        assert server.stats().errors == 1
    assert response.status_code == 429
    assert response.headers["retry-after"] == "1"  # whole seconds, rounded up
    assert response.headers["retry-after-ms"] == "250"
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code"}
    assert error["code"] == "rate_limit_exceeded"


def test_server_errors(client: httpx.Client) -> None:
    with FakeModelServer(error_rate=1.0, error_status=500) as server:
        response = client.post(server.base_url + "/chat/completions", json=ask("hi"))
    assert response.status_code == 500
    assert "retry-after" not in response.headers
    assert response.json()["error"]["type"] == "server_error"


def test_error_rate_is_deterministic_per_conversation_and_attempt(client: httpx.Client) -> None:
    with FakeModelServer(error_rate=0.5, seed=1, error_status=500) as server:
        first = statuses(client, server, QUESTIONS[:8], 6)
        server.reset()  # restarts the attempt count
        after_reset = statuses(client, server, QUESTIONS[7::-1], 6)
    with FakeModelServer(error_rate=0.5, seed=1, error_status=500) as server:
        restarted = statuses(client, server, QUESTIONS[:8], 6)

    assert first == after_reset == restarted
    outcomes = [status for sequence in first.values() for status in sequence]
    assert set(outcomes) == {200, 500}  # retries of a failed attempt can succeed
