"""Scripted answers: rules that answer before the built-in behaviour (judge tests use them)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from osmosis.testing import ChatRequest, Fail, FakeModelServer, Reply, Rule, ToolCall


def ask(text: str, **body: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], **body}


Post = Callable[..., httpx.Response]


@pytest.fixture
def post(client: httpx.Client) -> Callable[..., httpx.Response]:
    def post(server: FakeModelServer, text: str, **body: Any) -> httpx.Response:
        return client.post(server.base_url + "/chat/completions", json=ask(text, **body))

    return post


def content(response: httpx.Response) -> Any:
    return response.json()["choices"][0]["message"]["content"]


def test_mapping_shorthand_answers_by_substring(post: Post) -> None:
    with FakeModelServer(script={"Grade the answer": '{"score": 0.5}'}) as server:
        assert content(post(server, "Grade the answer: 42")) == '{"score": 0.5}'
        assert content(post(server, "What is 6 * 7?")) == "42"  # unscripted: built-in


def test_first_matching_rule_wins_and_conditions_combine(post: Post) -> None:
    script = [
        Rule(contains="judge", when=lambda r: r.model == "strict", respond="0"),
        Rule(pattern=r"judge #\d+", respond="1"),
        Rule(contains="judge", respond="2"),
    ]
    with FakeModelServer(script=script) as server:
        assert content(post(server, "judge #7", model="strict")) == "0"
        assert content(post(server, "judge #7")) == "1"
        assert content(post(server, "judge this")) == "2"


def test_contains_searches_every_message(client: httpx.Client) -> None:
    body = ask("the answer is 4")
    body["messages"].insert(0, {"role": "system", "content": "You are a strict judge."})
    with FakeModelServer(script={"strict judge": "PASS"}) as server:
        response = client.post(server.base_url + "/chat/completions", json=body)
    assert content(response) == "PASS"


def test_fail_for_a_limited_number_of_times(post: Post) -> None:
    flaky = Rule(contains="flaky", respond=Fail(503, "try later", retry_after=0.1), times=2)
    with FakeModelServer(script=[flaky]) as server:
        failures = [post(server, "flaky question") for _ in range(2)]
        assert content(post(server, "flaky question")) == "flaky question"
    assert [r.status_code for r in failures] == [503, 503]
    assert failures[0].json()["error"]["message"] == "try later"
    assert failures[0].headers["retry-after-ms"] == "100"


def test_responder_callable_sees_the_request_and_may_decline(post: Post) -> None:
    def grade(request: ChatRequest) -> Reply | None:
        if "skip" in request.last_user_text:
            return None  # the next rule, or the built-in behaviour, answers
        return Reply(json.dumps({"score": len(request.messages)}))

    with FakeModelServer(script=[Rule(respond=grade)]) as server:
        assert json.loads(content(post(server, "grade me"))) == {"score": 1}
        assert content(post(server, "skip me")) == "skip me"


def test_scripted_tool_calls_and_finish_reason(post: Post) -> None:
    reply = Reply(tool_calls=[ToolCall("lookup", {"id": 7}), ToolCall("broken", "{not json")])
    truncated = Reply("cut of", finish_reason="length")
    with FakeModelServer(script={"tools please": reply, "long": truncated}) as server:
        choice = post(server, "tools please").json()["choices"][0]
        short = post(server, "long story").json()["choices"][0]
    calls = choice["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["lookup", "broken"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"id": 7}
    assert calls[1]["function"]["arguments"] == "{not json"  # strings are sent verbatim
    assert len({c["id"] for c in calls}) == 2
    assert choice["finish_reason"] == "tool_calls"
    assert short["finish_reason"] == "length"


def test_rule_delay(post: Post) -> None:
    with FakeModelServer(script=[Rule(contains="slow", respond="ok", delay=0.15)]) as server:
        started = time.perf_counter()
        assert content(post(server, "slow one")) == "ok"
        assert time.perf_counter() - started >= 0.15


def test_rules_can_be_added_and_cleared_while_running(post: Post) -> None:
    with FakeModelServer() as server:
        assert content(post(server, "hello")) == "hello"
        server.add_rule(Rule(contains="hello", respond="scripted"))
        assert content(post(server, "hello")) == "scripted"
        server.clear_rules()
        assert content(post(server, "hello")) == "hello"


def test_requests_are_recorded_with_headers(client: httpx.Client) -> None:
    with FakeModelServer() as server:
        client.post(
            server.base_url + "/rollouts/r1/chat/completions",
            json=ask("hi"),
            headers={"Authorization": "Bearer run-token"},
        )
        [request] = server.requests
    assert request.path == "/v1/rollouts/r1/chat/completions"
    assert request.headers["authorization"] == "Bearer run-token"
    assert request.last_user_text == "hi"
    assert request.model == "m"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"wrong_rate": 1.5}, "wrong_rate"),
        ({"error_rate": -0.1}, "error_rate"),
        ({"latency": -1}, "latency"),
        ({"error_status": 200}, "error_status"),
    ],
)
def test_invalid_options_are_named(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FakeModelServer(**options)
