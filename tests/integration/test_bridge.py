"""The model bridge over real HTTP on loopback, in front of the scripted fake model.

Each test starts the fake model and a bridge on its own event loop; rollouts are played by
the official `openai` async client or by plain HTTP posts.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import openai
import pytest

from osmosis.eval.model.bridge import ModelBridge, OutagePolicy
from osmosis.eval.model.pricing import price_for
from osmosis.eval.model.providers import ModelTarget, resolve_model
from osmosis.eval.model.retry import RetryPolicy
from osmosis.testing import Fail, FakeModelServer, Rule

QUESTION = [{"role": "user", "content": "What is 17 * 23?"}]
MULTIPLY = {
    "type": "function",
    "function": {
        "name": "multiply",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        },
    },
}
FAST_RETRY = RetryPolicy(max_attempts=4, max_elapsed=5, initial_backoff=0.01, max_backoff=0.05)
SECRET_KEY = "sk-test-6f1d0c0ffee"
# Loopback HTTP only: building a CA-verifying SSL context costs ~75 ms per client.
PLAIN: dict[str, Any] = {"trust_env": False, "verify": False}


def openai_target(fake: FakeModelServer, model: str = "gpt-4o-mini") -> ModelTarget:
    return resolve_model(
        f"openai/{model}", {"OPENAI_API_BASE": fake.base_url, "OPENAI_API_KEY": SECRET_KEY}
    )


@asynccontextmanager
async def bridged(
    fake: FakeModelServer | None = None,
    *,
    target: ModelTarget | None = None,
    retry: RetryPolicy = FAST_RETRY,
    **options: Any,
) -> AsyncIterator[ModelBridge]:
    if target is None:
        assert fake is not None
        target = openai_target(fake)
    async with ModelBridge(target=target, retry=retry, **options) as bridge:
        yield bridge


def llm(bridge: ModelBridge, rollout_id: str = "r1") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=bridge.open_rollout(rollout_id), api_key=bridge.token, max_retries=0
    )


async def post(
    bridge: ModelBridge,
    body: dict[str, Any],
    *,
    rollout_id: str = "r1",
    authorization: str | None = "",
) -> httpx.Response:
    """POST a chat completion; `authorization` "" means the right token, None none at all."""
    if authorization == "":
        authorization = f"Bearer {bridge.token}"
    headers = {"authorization": authorization} if authorization is not None else {}
    async with httpx.AsyncClient(timeout=10, **PLAIN) as client:
        return await client.post(
            bridge.open_rollout(rollout_id) + "/chat/completions", json=body, headers=headers
        )


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- the route -----------------------------------------------------------------------------------
async def test_the_bridge_pins_the_runs_model_whatever_the_client_asks() -> None:
    async with FakeModelServer() as fake, bridged(fake) as bridge, llm(bridge) as client:
        reply = await client.chat.completions.create(model="x", messages=QUESTION)  # type: ignore[arg-type]
    assert reply.choices[0].message.content == "391"
    assert [request.model for request in fake.requests] == ["gpt-4o-mini"]
    assert bridge.base_url.startswith("http://127.0.0.1:")
    assert bridge.rollout_url("abc") == bridge.base_url + "/rollouts/abc"


async def test_the_provider_key_goes_to_the_provider_and_not_the_rollouts_token() -> None:
    async with FakeModelServer() as fake, bridged(fake) as bridge:
        response = await post(bridge, {"model": "x", "messages": QUESTION})
    assert response.status_code == 200
    assert fake.requests[0].headers["authorization"] == f"Bearer {SECRET_KEY}"
    assert bridge.token not in json.dumps(dict(fake.requests[0].headers))


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong", "Basic {token}", "Bearer {token}x", "Bearer {short}", "{token}"],
)
async def test_a_missing_or_wrong_token_is_401(authorization: str | None) -> None:
    async with FakeModelServer() as fake, bridged(fake) as bridge:
        if authorization is not None:
            authorization = authorization.format(token=bridge.token, short=bridge.token[:-1])
        response = await post(bridge, {"messages": QUESTION}, authorization=authorization)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json()["error"]["type"] == "authentication_error"
    assert fake.stats().chat_completions == 0
    assert bridge.usage("r1").calls == 0  # unauthenticated calls are not the rollout's


async def test_the_default_token_is_random_hex_and_a_given_one_is_used() -> None:
    first, second = (
        ModelBridge(target=ModelTarget("openai-compatible", "m", "http://x/v1")),
        (ModelBridge(target=ModelTarget("openai-compatible", "m", "http://x/v1"), token="t0k")),
    )
    assert len(first.token) == 32 and int(first.token, 16) >= 0
    assert second.token == "t0k"


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("POST", "/v1/chat/completions", 404),
        ("POST", "/v1/rollouts//chat/completions", 404),
        ("POST", "/v1/rollouts/a/b/chat/completions", 404),
        ("GET", "/v1/rollouts/r1/chat/completions", 405),
    ],
)
async def test_other_routes_and_methods(method: str, path: str, status: int) -> None:
    async with FakeModelServer() as fake, bridged(fake) as bridge:
        root = bridge.base_url.removesuffix("/v1")
        async with httpx.AsyncClient(**PLAIN) as client:
            response = await client.request(
                method, root + path, headers={"authorization": f"Bearer {bridge.token}"}
            )
    assert response.status_code == status
    assert "error" in response.json()


# -- bind and advertise ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("advertise_url", "expected"),
    [
        ("http://bridge.example:8321", "http://bridge.example:8321/v1"),
        ("https://proxy.example:443/osmosis/v1/", "https://proxy.example:443/osmosis/v1"),
        ("http://10.1.2.3", "http://10.1.2.3:{port}/v1"),  # no port: the bound one
        ("http://[fd00::5]:9000/", "http://[fd00::5]:9000/v1"),
    ],
)
async def test_rollouts_are_given_the_advertised_url_while_the_bridge_listens_locally(
    advertise_url: str, expected: str
) -> None:
    async with FakeModelServer() as fake, bridged(fake, advertise_url=advertise_url) as bridge:
        port = int(bridge.bound_url.rsplit(":", 1)[1])
        assert bridge.bound_url.startswith("http://127.0.0.1:")
        assert bridge.base_url == expected.format(port=port)
        assert bridge.open_rollout("r9") == expected.format(port=port) + "/rollouts/r9"
        # The same token and route, reached where it really listens.
        async with httpx.AsyncClient(timeout=10, **PLAIN) as client:
            response = await client.post(
                bridge.bound_url + "/v1/rollouts/r9/chat/completions",
                json={"messages": QUESTION},
                headers={"authorization": f"Bearer {bridge.token}"},
            )
    assert response.status_code == 200
    assert bridge.usage("r9").calls == 1


async def test_a_wildcard_bind_warns_and_gives_local_rollouts_loopback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with FakeModelServer() as fake:
        bridge = ModelBridge(target=openai_target(fake), retry=FAST_RETRY)
        with caplog.at_level("WARNING", logger="osmosis.eval.model.bridge"):
            await bridge.start(host="0.0.0.0")
        try:
            assert bridge.bound_url.startswith("http://0.0.0.0:")
            assert bridge.base_url == bridge.bound_url.replace("0.0.0.0", "127.0.0.1") + "/v1"
            response = await post(bridge, {"messages": QUESTION})
        finally:
            await bridge.stop()
    assert response.status_code == 200
    (warning,) = [r.getMessage() for r in caplog.records if "beyond loopback" in r.getMessage()]
    assert bridge.bound_url in warning and "bearer token" in warning
    assert bridge.token not in warning


async def test_a_loopback_bind_does_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="osmosis.eval.model.bridge"):
        async with FakeModelServer() as fake, bridged(fake) as bridge:
            assert (await post(bridge, {"messages": QUESTION})).status_code == 200
    assert bridge.base_url == bridge.bound_url + "/v1"
    assert not [r for r in caplog.records if "beyond loopback" in r.getMessage()]


@pytest.mark.parametrize(
    ("advertise_url", "problem"),
    [
        ("bridge.example:8321", "must start with http:// or https://"),
        ("ftp://bridge.example", "must start with http:// or https://"),
        ("http://:8321", "names no host"),
        ("http://bridge.example:99999", "port is not a number"),
        ("http://user:pw@bridge.example", "no user, password, query or fragment"),
        ("http://bridge.example/?x=1", "no user, password, query or fragment"),
    ],
)
def test_an_invalid_advertise_url_is_refused_naming_the_problem(
    advertise_url: str, problem: str
) -> None:
    target = ModelTarget("openai-compatible", "m", "http://127.0.0.1:9/v1")
    with pytest.raises(ValueError, match="invalid bridge advertise URL") as error:
        ModelBridge(target=target, advertise_url=advertise_url)
    assert problem in str(error.value)
    assert "e.g. http://10.0.0.5:8321" in str(error.value)


# -- the request rules (§3.11) -------------------------------------------------------------------
@pytest.mark.parametrize(
    "param",
    [
        "api_base",
        "api_key",
        "base_url",
        "api_version",
        "extra_headers",
        "headers",
        "callbacks",
        "success_callback",
        "litellm_logging_obj",
        "litellm_call_id",
        "aws_access_key_id",
        "aws_region_name",
        "vertex_project",
        "vertex_credentials",
        "azure_ad_token",
        "timeout",
        "request_timeout",
        "num_retries",
        "max_retries",
        "custom_llm_provider",
        "organization",
        "mock_response",
        "input_cost_per_token",
        "fallbacks",
        "drop_params",
        "model_list",
    ],
)
async def test_control_and_credential_parameters_are_refused_by_name(param: str) -> None:
    async with FakeModelServer() as fake, bridged(fake) as bridge:
        response = await post(bridge, {"model": "x", "messages": QUESTION, param: "x"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert param in error["message"]
    assert error["param"] == param
    assert fake.stats().chat_completions == 0
    (record,) = bridge.take_calls("r1")
    assert (record.status_code, record.attempts) == (400, 0)
    assert param in (record.error or "")


async def test_a_control_parameter_hidden_in_extra_body_is_refused() -> None:
    async with FakeModelServer() as fake, bridged(fake) as bridge:
        body = {"messages": QUESTION, "extra_body": {"api_key": "sk-mine", "temperature": 0}}
        response = await post(bridge, body)
    assert response.status_code == 400
    assert "api_key" in response.json()["error"]["message"]
    assert fake.stats().chat_completions == 0


@pytest.mark.parametrize("n", [2, 0, "1"])
async def test_only_n_equal_1_is_accepted(n: object) -> None:
    async with FakeModelServer() as fake, bridged(fake) as bridge:
        refused = await post(bridge, {"messages": QUESTION, "n": n})
        accepted = await post(bridge, {"messages": QUESTION, "n": 1})
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "n"
    assert accepted.status_code == 200
    assert "n" not in fake.requests[0].body  # an envelope field: not forwarded


@pytest.mark.parametrize("body", ["not json", "[1, 2]", '{"messages": []}', '{"messages": "hi"}'])
async def test_malformed_requests_are_400(body: str) -> None:
    async with (
        FakeModelServer() as fake,
        bridged(fake) as bridge,
        httpx.AsyncClient(**PLAIN) as client,
    ):
        response = await client.post(
            bridge.open_rollout("r1") + "/chat/completions",
            content=body,
            headers={"authorization": f"Bearer {bridge.token}"},
        )
    assert response.status_code == 400
    assert fake.stats().chat_completions == 0


async def test_inference_parameters_pass_through_unchanged() -> None:
    params = {
        "temperature": 0.2,
        "top_p": 0.9,
        "max_tokens": 64,
        "stop": ["\n\n"],
        "seed": 7,
        "response_format": {"type": "json_object"},
        "metadata": {"row": "3"},
        "user": "row-3",
        "presence_penalty": 0.1,
        "reasoning_effort": "low",
    }
    async with FakeModelServer() as fake, bridged(fake) as bridge:
        body = {"model": "x", "messages": QUESTION, "extra_body": {"top_k": 5}, **params}
        response = await post(bridge, body)
    assert response.status_code == 200
    sent = dict(fake.requests[0].body)
    assert sent == {**params, "top_k": 5, "model": "gpt-4o-mini", "messages": QUESTION}
    (record,) = bridge.take_calls("r1")
    assert record.request_params == {**params, "top_k": 5}


async def test_tools_pass_through_and_a_tool_call_comes_back() -> None:
    async with FakeModelServer() as fake, bridged(fake) as bridge, llm(bridge) as client:
        reply = await client.chat.completions.create(
            model="x",
            messages=QUESTION,  # type: ignore[arg-type]
            tools=[MULTIPLY],  # type: ignore[list-item]
            tool_choice="auto",
        )
    assert fake.requests[0].tools == [MULTIPLY]
    assert fake.requests[0].body["tool_choice"] == "auto"
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "multiply"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"a": 17, "b": 23}  # type: ignore[union-attr]
    (record,) = bridge.take_calls("r1")
    assert record.response_message is not None
    assert record.response_message["tool_calls"][0]["function"]["name"] == "multiply"


# -- streaming ----------------------------------------------------------------------------------
async def test_stream_true_through_the_openai_client() -> None:
    async with FakeModelServer() as fake, bridged(fake) as bridge, llm(bridge) as client:
        stream = await client.chat.completions.create(
            model="x",
            messages=QUESTION,  # type: ignore[arg-type]
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    assert "stream" not in fake.requests[0].body  # the provider is called without streaming
    assert "stream_options" not in fake.requests[0].body
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == "391"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes == ["stop"]
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(usage) == 1 and usage[0].total_tokens == bridge.usage("r1").total_tokens > 0


async def test_a_streamed_tool_call_assembles_in_the_openai_clients_stream_helper() -> None:
    async with (
        FakeModelServer() as fake,
        bridged(fake) as bridge,
        llm(bridge) as client,
        client.chat.completions.stream(
            model="x",
            messages=QUESTION,  # type: ignore[arg-type]
            tools=[MULTIPLY],  # type: ignore[list-item]
        ) as stream,
    ):
        final = await stream.get_final_completion()
    assert fake.stats().chat_completions == 1
    (call,) = final.choices[0].message.tool_calls or []
    assert call.function.name == "multiply"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"a": 17, "b": 23}  # type: ignore[union-attr]
    assert final.choices[0].finish_reason == "tool_calls"


async def test_a_slow_provider_gets_keep_alive_comments_then_the_answer() -> None:
    async with (
        FakeModelServer(latency=0.3) as fake,
        bridged(fake, heartbeat=0.05) as bridge,
        httpx.AsyncClient(**PLAIN) as http,
    ):
        url = bridge.open_rollout("r1") + "/chat/completions"
        body = {"messages": QUESTION, "stream": True}
        headers = {"authorization": f"Bearer {bridge.token}"}
        async with http.stream("POST", url, json=body, headers=headers) as response:
            text = (await response.aread()).decode()
        async with llm(bridge) as client:
            stream = await client.chat.completions.create(
                model="x",
                messages=QUESTION,  # type: ignore[arg-type]
                stream=True,
            )
            content = "".join([c.choices[0].delta.content or "" async for c in stream])
    assert response.status_code == 200
    assert text.startswith(": keep-alive\n\n")
    assert text.endswith("data: [DONE]\n\n")
    assert content == "391"


async def test_an_error_after_the_stream_started_reaches_the_client_as_an_error() -> None:
    script = [Rule(respond=Fail(400, "context too long"), delay=0.3)]
    async with (
        FakeModelServer(script=script) as fake,
        bridged(fake, heartbeat=0.05) as bridge,
        llm(bridge) as client,
    ):
        stream = await client.chat.completions.create(
            model="x",
            messages=QUESTION,  # type: ignore[arg-type]
            stream=True,
        )
        with pytest.raises(openai.APIError, match="context too long"):
            async for _ in stream:
                pass


async def test_an_early_stream_error_keeps_its_http_status() -> None:
    async with (
        FakeModelServer(script=[Rule(respond=Fail(400, "bad tool schema"))]) as fake,
        bridged(fake) as bridge,
        llm(bridge) as client,
    ):
        with pytest.raises(openai.BadRequestError, match="bad tool schema"):
            await client.chat.completions.create(
                model="x",
                messages=QUESTION,  # type: ignore[arg-type]
                stream=True,
            )


# -- accounting ---------------------------------------------------------------------------------
async def test_usage_and_cost_are_counted_per_rollout_and_interleaved_rollouts_stay_apart() -> None:
    async with FakeModelServer(latency=0.01) as fake, bridged(fake) as bridge:

        async def rollout(rollout_id: str, turns: int) -> None:
            async with llm(bridge, rollout_id) as client:
                for turn in range(turns):
                    question = [{"role": "user", "content": f"What is {turn} + {len(rollout_id)}?"}]
                    await client.chat.completions.create(model="x", messages=question)  # type: ignore[arg-type]

        await asyncio.gather(rollout("aa", 3), rollout("bbbb", 2), rollout("aa2", 1))
        words = fake.stats()
    price = price_for("openai/gpt-4o-mini")
    assert price is not None
    usages = {rid: bridge.usage(rid) for rid in ("aa", "bbbb", "aa2")}
    assert [usages[rid].calls for rid in ("aa", "bbbb", "aa2")] == [3, 2, 1]
    assert sum(u.prompt_tokens for u in usages.values()) == words.prompt_tokens
    assert sum(u.completion_tokens for u in usages.values()) == words.completion_tokens
    for usage in usages.values():
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
        expected = price.cost(
            prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens
        )
        assert usage.cost_usd == pytest.approx(expected)

    calls = bridge.take_calls("aa")
    assert [c.request_messages[-1]["content"] for c in calls] == [
        f"What is {turn} + 2?" for turn in range(3)
    ]
    assert [c.response_message["content"] for c in calls if c.response_message] == ["2", "3", "4"]
    for call in calls:
        assert call.rollout_id == "aa"
        assert call.status_code == 200 and call.error is None and call.attempts == 1
        assert call.model == "gpt-4o-mini"
        assert call.latency_ms >= 10
        assert call.started_at.tzinfo is not None
    assert bridge.take_calls("aa") == []  # taken
    assert bridge.usage("aa").calls == 3  # usage stays until forgotten
    bridge.forget("aa")
    assert bridge.usage("aa").calls == 0
    assert bridge.usage("never-seen") == type(bridge.usage("aa"))()


async def test_a_model_without_a_price_has_no_cost() -> None:
    async with FakeModelServer() as fake:
        target = ModelTarget(kind="openai-compatible", model="fake-model", api_base=fake.base_url)
        async with bridged(target=target) as bridge:
            await post(bridge, {"messages": QUESTION})
    usage = bridge.usage("r1")
    assert usage.total_tokens > 0
    assert usage.cost_usd is None
    assert bridge.take_calls("r1")[0].cost_usd is None


# -- provider faults ----------------------------------------------------------------------------
async def test_rate_limits_are_retried_honouring_retry_after() -> None:
    script = [Rule(respond=Fail(429, retry_after=0.15), times=2)]
    async with FakeModelServer(script=script) as fake, bridged(fake) as bridge:
        began = time.perf_counter()
        response = await post(bridge, {"messages": QUESTION})
        elapsed = time.perf_counter() - began
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "391"
    assert fake.stats().chat_completions == 3
    assert fake.stats().errors == 2
    assert elapsed >= 0.3  # two waits of the advertised 0.15 s, not the 0.01 s back-off
    (record,) = bridge.take_calls("r1")
    assert record.attempts == 3
    assert not bridge.outage.is_set()


async def test_injected_server_errors_are_retried_until_every_call_succeeds() -> None:
    retry = RetryPolicy(max_attempts=10, max_elapsed=10, initial_backoff=0.001, max_backoff=0.01)
    async with (
        FakeModelServer(error_rate=0.5, error_status=500, seed=3) as fake,
        bridged(fake, retry=retry) as bridge,
    ):
        questions = [[{"role": "user", "content": f"What is {i} * 3?"}] for i in range(12)]
        responses = await asyncio.gather(*(post(bridge, {"messages": q}) for q in questions))
    assert [r.status_code for r in responses] == [200] * 12
    stats = fake.stats()
    assert stats.errors > 0
    assert stats.chat_completions == 12 + stats.errors
    assert sum(record.attempts for record in bridge.take_calls("r1")) == stats.chat_completions


async def test_exhausted_retries_answer_503_and_declare_an_outage() -> None:
    script = [Rule(respond=Fail(500, f"upstream exploded near {SECRET_KEY}"))]
    retry = RetryPolicy(max_attempts=3, max_elapsed=5, initial_backoff=0.01)
    async with FakeModelServer(script=script) as fake, bridged(fake, retry=retry) as bridge:
        assert not bridge.outage.is_set() and bridge.outage_reason is None
        response = await post(bridge, {"messages": QUESTION})
    assert response.status_code == 503
    assert fake.stats().chat_completions == 3
    assert bridge.outage.is_set()
    assert bridge.outage_reason is not None
    assert "3 attempts" in bridge.outage_reason and "upstream exploded" in bridge.outage_reason
    assert SECRET_KEY not in bridge.outage_reason
    assert SECRET_KEY not in response.text
    (record,) = bridge.take_calls("r1")
    assert (record.status_code, record.attempts, record.response_message) == (503, 3, None)
    bridge.clear_outage()
    assert not bridge.outage.is_set() and bridge.outage_reason is None


async def test_during_an_outage_new_calls_get_503_at_once_and_reach_no_provider() -> None:
    script = [Rule(respond=Fail(503, retry_after=0), times=2)]
    retry = RetryPolicy(max_attempts=2, max_elapsed=5, initial_backoff=0.01)
    no_probe_yet = OutagePolicy(probe_first_s=60)
    async with (
        FakeModelServer(script=script) as fake,
        bridged(fake, retry=retry, outage_policy=no_probe_yet) as bridge,
    ):
        failed = await post(bridge, {"messages": QUESTION})
        refused = await post(bridge, {"messages": QUESTION})
    assert (failed.status_code, refused.status_code) == (503, 503)
    assert refused.json()["error"]["code"] == "provider_unavailable"
    assert refused.json()["error"]["message"] == bridge.outage_reason
    assert fake.stats().chat_completions == 2  # the provider that just failed is left alone
    assert bridge.outage.is_set()
    assert [(r.status_code, r.attempts) for r in bridge.take_calls("r1")] == [(503, 2), (503, 0)]


async def test_a_refused_connection_is_retried_then_declared_an_outage() -> None:
    base = f"http://127.0.0.1:{closed_port()}/v1"
    target = ModelTarget(kind="openai-compatible", model="m", api_base=base)
    retry = RetryPolicy(max_attempts=3, max_elapsed=5, initial_backoff=0.01)
    async with bridged(target=target, retry=retry) as bridge:
        response = await post(bridge, {"messages": QUESTION})
    assert response.status_code == 503
    assert bridge.outage.is_set()
    assert base in (bridge.outage_reason or "")


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_non_retryable_provider_errors_return_the_providers_status(status: int) -> None:
    message = f"provider says no (key {SECRET_KEY})"
    script = [Rule(respond=Fail(status, message))]
    async with FakeModelServer(script=script) as fake, bridged(fake) as bridge:
        response = await post(bridge, {"messages": QUESTION})
    assert response.status_code == status
    error = response.json()["error"]
    assert error["message"] == "provider says no (key [REDACTED])"
    assert fake.stats().chat_completions == 1  # not retried
    assert not bridge.outage.is_set()
    (record,) = bridge.take_calls("r1")
    assert record.status_code == status and SECRET_KEY not in (record.error or "")


async def test_the_callers_redaction_applies_to_every_error_text() -> None:
    redact: Callable[[str], str] = lambda text: text.replace("hunter2", "***")  # noqa: E731
    script = [Rule(respond=Fail(400, "password hunter2 rejected"))]
    async with FakeModelServer(script=script) as fake, bridged(fake, redact=redact) as bridge:
        response = await post(bridge, {"messages": QUESTION})
    assert response.json()["error"]["message"] == "password *** rejected"
    assert bridge.take_calls("r1")[0].error == "password *** rejected"


async def test_stop_leaves_records_readable_and_the_port_closed() -> None:
    async with FakeModelServer() as fake:
        bridge = await ModelBridge(target=openai_target(fake)).start()
        await post(bridge, {"messages": QUESTION})
        url = bridge.rollout_url("r1")
        await bridge.stop()
    assert bridge.usage("r1").calls == 1
    async with httpx.AsyncClient(**PLAIN) as client:
        with pytest.raises(httpx.ConnectError):
            await client.post(url + "/chat/completions", json={"messages": QUESTION})


# -- the LiteLLM path ---------------------------------------------------------------------------
@pytest.mark.slow
async def test_the_litellm_path_works_offline_against_the_fake_model() -> None:
    async with FakeModelServer(script=[Rule(respond=Fail(429, retry_after=0.05), times=1)]) as fake:
        target = resolve_model(
            "openai/gpt-4o-mini",
            {"OPENAI_API_BASE": fake.base_url, "OPENAI_API_KEY": SECRET_KEY},
            force_litellm=True,
        )
        assert target.kind == "litellm"
        async with bridged(target=target) as bridge, llm(bridge) as client:
            plain = await client.chat.completions.create(model="x", messages=QUESTION)  # type: ignore[arg-type]
            stream = await client.chat.completions.create(
                model="x",
                messages=QUESTION,  # type: ignore[arg-type]
                tools=[MULTIPLY],  # type: ignore[list-item]
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [chunk async for chunk in stream]
            refused = await post(bridge, {"messages": QUESTION, "api_base": "http://x"})
    assert plain.choices[0].message.content == "391"
    tool_calls = [c.choices[0].delta.tool_calls for c in chunks if c.choices]
    assert tool_calls[0] is not None and tool_calls[0][0].function.name == "multiply"  # type: ignore[union-attr]
    assert refused.status_code == 400
    assert {request.model for request in fake.requests} == {"gpt-4o-mini"}
    assert fake.requests[0].headers["authorization"] == f"Bearer {SECRET_KEY}"
    records = bridge.take_calls("r1")
    assert [r.attempts for r in records] == [2, 1, 0]  # the 429 was retried by our policy
    usage = bridge.usage("r1")
    assert usage.calls == 3 and usage.total_tokens > 0
    assert usage.cost_usd is not None and usage.cost_usd > 0
