"""The fake model over real HTTP on loopback: routes, built-in answers, usage and stats."""

from __future__ import annotations

import json
import socket
import threading
from typing import Any

import httpx
import pytest

from osmosis.testing import FakeModelServer


def ask(text: str, **body: Any) -> dict[str, Any]:
    return {"model": "test-model", "messages": [{"role": "user", "content": text}], **body}


MULTIPLY = {
    "type": "function",
    "function": {
        "name": "multiply",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
    },
}


def test_base_url_points_at_v1(fake_model: FakeModelServer) -> None:
    assert fake_model.base_url == f"http://127.0.0.1:{fake_model.port}/v1"
    assert fake_model.url == f"http://127.0.0.1:{fake_model.port}"


@pytest.mark.parametrize(
    "path",
    [
        "/v1/chat/completions",
        "/v1/rollouts/abc123/chat/completions",
        "/x/y/chat/completions",
        "/chat/completions",
        "/v1/chat/completions/",
    ],
)
def test_any_prefix_ending_in_chat_completions(http: httpx.Client, path: str) -> None:
    response = http.post(path, json=ask("What is 17 * 23?"))
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "391"


def test_completion_shape(http: httpx.Client) -> None:
    body = http.post("/v1/chat/completions", json=ask("What is 6 * 7?")).json()
    assert body["id"].startswith("chatcmpl-")
    assert body["object"] == "chat.completion"
    assert body["model"] == "test-model"  # echoes the request's model
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == "42"
    assert choice["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}


def test_echoes_the_last_message(http: httpx.Client) -> None:
    body = ask("ignored")
    body["messages"].append({"role": "user", "content": [{"type": "text", "text": "echo me"}]})
    response = http.post("/v1/chat/completions", json=body).json()
    assert response["choices"][0]["message"]["content"] == "echo me"
    assert response["usage"]["prompt_tokens"] == 3
    assert response["usage"]["completion_tokens"] == 2


def test_calls_the_first_tool_with_arguments_from_the_question(http: httpx.Client) -> None:
    body = http.post("/v1/chat/completions", json=ask("What is 17 * 23?", tools=[MULTIPLY, SEARCH]))
    choice = body.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["id"].startswith("call_")
    assert call["type"] == "function"
    assert call["function"]["name"] == "multiply"
    assert json.loads(call["function"]["arguments"]) == {"a": 17, "b": 23}


def test_tool_choice_names_the_tool(http: httpx.Client) -> None:
    choice = {"type": "function", "function": {"name": "search"}}
    body = ask("Find osmosis", tools=[MULTIPLY, SEARCH], tool_choice=choice)
    [call] = http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"][
        "tool_calls"
    ]
    assert call["function"]["name"] == "search"
    assert json.loads(call["function"]["arguments"]) == {"query": "Find osmosis"}


def test_after_a_tool_result_it_answers(http: httpx.Client) -> None:
    first = http.post("/v1/chat/completions", json=ask("What is 17 * 23?", tools=[MULTIPLY]))
    message = first.json()["choices"][0]["message"]
    call_id = message["tool_calls"][0]["id"]
    body = ask("What is 17 * 23?", tools=[MULTIPLY])
    body["messages"] += [message, {"role": "tool", "tool_call_id": call_id, "content": "391"}]
    second = http.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert second["finish_reason"] == "stop"
    assert second["message"]["content"] == "391"


def test_lists_one_model(http: httpx.Client) -> None:
    body = http.get("/v1/models").json()
    assert body["object"] == "list"
    assert [model["id"] for model in body["data"]] == ["fake-model"]


@pytest.mark.parametrize(
    ("method", "path", "content", "status", "code"),
    [
        ("POST", "/v1/chat/completions", b"{not json", 400, "invalid_request"),
        ("POST", "/v1/chat/completions", b'{"model": "m"}', 400, "invalid_request"),
        ("GET", "/v1/chat/completions", b"", 405, "method_not_allowed"),
        ("GET", "/v1/nothing", b"", 404, "not_found"),
    ],
)
def test_bad_requests_get_openai_shaped_errors(
    http: httpx.Client, method: str, path: str, content: bytes, status: int, code: str
) -> None:
    response = http.request(method, path, content=content)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code
    assert error["message"]
    assert error["type"]


def test_stats_count_and_reset() -> None:
    with FakeModelServer() as server, httpx.Client(base_url=server.url) as http:
        for _ in range(3):
            http.post("/v1/chat/completions", json=ask("hi there"))
        http.post("/v1/chat/completions", json=ask("What is 1 + 1?", tools=[MULTIPLY]))
        http.get("/v1/models")
        stats = http.get("/stats").json()
        assert stats == {
            "requests": 5,
            "chat_completions": 4,
            "streams": 0,
            "tool_calls": 1,
            "errors": 0,
            "rate_limited": 0,
            "prompt_tokens": 3 * 2 + 5,  # whitespace-separated words of every message
            "completion_tokens": 3 * 2 + 1 + 4,  # echoes; one call plus '{"a": 1, "b": 1}'
        }
        assert server.stats().as_dict() == stats
        assert len(server.requests) == 4
        assert http.post("/stats/reset").json()["requests"] == 0
        assert server.stats().chat_completions == 0
        assert server.requests == []


def test_streaming_sse(http: httpx.Client) -> None:
    body = ask("What is 2 + 2?", stream=True, stream_options={"include_usage": True})
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.headers["content-type"] == "text/event-stream"
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
    assert len({chunk["id"] for chunk in chunks}) == 1
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "4"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}


def test_streaming_without_usage_has_no_usage_chunk(http: httpx.Client) -> None:
    with http.stream("POST", "/v1/chat/completions", json=ask("a b c", stream=True)) as response:
        lines = [line for line in response.iter_lines() if line]
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert all(chunk["choices"] for chunk in chunks)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "a b c"


# -- HTTP/1.1 details other clients rely on ---------------------------------------------------
def _raw(port: int, data: bytes, responses: int) -> bytes:
    """Send raw bytes and read until `responses` complete responses arrived (or EOF)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        received = b""
        while received.count(b"HTTP/1.1 ") < responses or not received.endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
        return received


def _post(body: bytes, *extra: str) -> bytes:
    head = ["POST /v1/chat/completions HTTP/1.1", "Host: x", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def test_pipelined_requests_are_answered_in_order(fake_model: FakeModelServer) -> None:
    first = _post(json.dumps(ask("What is 1 + 1?")).encode())
    second = _post(json.dumps(ask("What is 2 + 2?")).encode())
    received = _raw(fake_model.port, first + second, responses=2)
    assert received.index(b'"content": "2"') < received.index(b'"content": "4"')


def test_connection_close_is_honoured(fake_model: FakeModelServer) -> None:
    received = _raw(fake_model.port, _post(b'{"messages": []}', "Connection: close"), 1)
    assert b"Connection: close" in received


def test_chunked_request_body(http: httpx.Client) -> None:
    def parts() -> Any:
        yield b'{"model": "m", "messages": [{"role": "user", '
        yield b'"content": "What is 9 * 9?"}]}'

    response = http.post("/v1/chat/completions", content=parts())
    assert response.json()["choices"][0]["message"]["content"] == "81"


def test_stops_cleanly_without_leaking_threads() -> None:
    before = set(threading.enumerate())
    server = FakeModelServer().start()
    with httpx.Client() as http:
        http.get(server.url + "/stats")
        server.stop()
        with pytest.raises(httpx.ConnectError):
            http.get(server.url + "/stats")
    server.stop()  # idempotent
    assert set(threading.enumerate()) == before


def test_port_in_use_raises() -> None:
    with FakeModelServer() as first, pytest.raises(OSError):
        FakeModelServer(port=first.port).start()
