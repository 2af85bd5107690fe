"""The model pre-flight against the scripted fake model: each way a model can be unusable
fails with its code and a message that names the cause and the fix."""

from __future__ import annotations

import socket
import time

import pytest

from osmosis.eval.model import preflight as model_preflight
from osmosis.eval.model.preflight import ModelPreflightError, preflight
from osmosis.eval.model.providers import ModelTarget, resolve_model
from osmosis.eval.model.retry import RetryPolicy
from osmosis.testing import ChatRequest, Fail, FakeModelServer, Rule

KEY = "sk-good-0123456789"
QUICK = RetryPolicy(max_attempts=3, max_elapsed=5, initial_backoff=0.01)


def wrong_model(request: ChatRequest) -> bool:
    return request.model != "fake-model"


def wrong_key(request: ChatRequest) -> bool:
    return request.headers.get("authorization") != f"Bearer {KEY}"


def strict_provider() -> FakeModelServer:
    """A fake provider that knows one model and one key, as a real one does."""
    return FakeModelServer(
        script=[
            Rule(when=wrong_key, respond=Fail(401, "Incorrect API key provided.")),
            Rule(when=wrong_model, respond=Fail(404, "The model does not exist.")),
        ]
    )


def target(fake: FakeModelServer, model: str = "fake-model", key: str = KEY) -> ModelTarget:
    env = {"OPENAI_API_BASE": fake.base_url, "OPENAI_API_KEY": key}
    return resolve_model(f"openai/{model}", env)


async def test_a_working_model_passes() -> None:
    async with strict_provider() as fake:
        result = await preflight(target(fake))
    assert (result.model_path, result.model, result.attempts) == (
        "openai/fake-model",
        "fake-model",
        1,
    )
    assert result.reply == "hi"
    (probe,) = fake.requests
    assert probe.messages == [{"role": "user", "content": "hi"}]
    assert 0 < probe.body["max_tokens"] <= 256


async def test_a_wrong_model_name_is_model_not_found() -> None:
    async with strict_provider() as fake:
        with pytest.raises(ModelPreflightError) as caught:
            await preflight(target(fake, model="fake-modle"))
    assert caught.value.code == "MODEL_NOT_FOUND"
    assert "openai/fake-modle" in caught.value.message
    assert "model_path" in caught.value.message  # the fix
    assert fake.stats().chat_completions == 1  # not retried


async def test_a_model_not_found_in_a_400_body_is_model_not_found() -> None:
    script = [Rule(respond=Fail(400, "Invalid model 'x': model_not_found"))]
    async with FakeModelServer(script=script) as fake:
        with pytest.raises(ModelPreflightError) as caught:
            await preflight(target(fake))
    assert caught.value.code == "MODEL_NOT_FOUND"


@pytest.mark.parametrize("status", [401, 403])
async def test_a_rejected_key_is_auth_failed_and_never_echoed(status: int) -> None:
    bad_key = "sk-bad-9876543210"
    script = [Rule(respond=Fail(status, f"Incorrect API key provided: {bad_key}"))]
    async with FakeModelServer(script=script) as fake:
        with pytest.raises(ModelPreflightError) as caught:
            await preflight(target(fake, key=bad_key))
    assert caught.value.code == "AUTH_FAILED"
    assert "OPENAI_API_KEY" in caught.value.message
    assert bad_key not in str(caught.value)
    assert fake.stats().chat_completions == 1


async def test_a_provider_that_keeps_rate_limiting_is_rate_limited_quickly() -> None:
    script = [Rule(respond=Fail(429, "Rate limit reached", retry_after=0.05))]
    async with FakeModelServer(script=script) as fake:
        began = time.perf_counter()
        with pytest.raises(ModelPreflightError) as caught:
            await preflight(target(fake))  # the default, short pre-flight policy
        elapsed = time.perf_counter() - began
    assert caught.value.code == "RATE_LIMITED"
    assert "3 attempt" in caught.value.message
    assert fake.stats().chat_completions == 3
    assert elapsed < 10


async def test_a_rate_limit_that_clears_within_the_retries_passes() -> None:
    script = [Rule(respond=Fail(429, retry_after=0.05), times=1)]
    async with FakeModelServer(script=script) as fake:
        result = await preflight(target(fake), retry=QUICK)
    assert result.attempts == 2


async def test_persistent_server_errors_are_provider_error() -> None:
    async with FakeModelServer(script=[Rule(respond=Fail(500, "boom"))]) as fake:
        with pytest.raises(ModelPreflightError) as caught:
            await preflight(target(fake), retry=QUICK)
    assert caught.value.code == "PROVIDER_ERROR"
    assert "boom" in caught.value.message


async def test_a_refused_connection_is_provider_unreachable_naming_the_api_base() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        base = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    unreachable = ModelTarget(kind="openai-compatible", model="m", api_base=base)
    with pytest.raises(ModelPreflightError) as caught:
        await preflight(unreachable, retry=QUICK)
    assert caught.value.code == "PROVIDER_UNREACHABLE"
    assert base in caught.value.message


async def test_a_missing_openai_key_is_reported_without_any_network_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_transport(_: ModelTarget) -> None:
        raise AssertionError("the pre-flight must not call anything")

    monkeypatch.setattr(model_preflight, "open_transport", no_transport)
    official = resolve_model("openai/gpt-4o-mini", {"PATH": "/usr/bin"})
    with pytest.raises(ModelPreflightError) as caught:
        await preflight(official)
    assert caught.value.code == "MISSING_CREDENTIALS"
    assert "OPENAI_API_KEY" in caught.value.message


async def test_a_missing_key_for_another_provider_names_its_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(model_preflight, "open_transport", None)
    with pytest.raises(ModelPreflightError, match="ANTHROPIC_API_KEY") as caught:
        await preflight(resolve_model("anthropic/claude-sonnet-4-5", {}))
    assert caught.value.code == "MISSING_CREDENTIALS"


async def test_the_callers_redaction_applies_to_preflight_messages() -> None:
    script = [Rule(respond=Fail(400, "tenant acme-corp is suspended"))]
    async with FakeModelServer(script=script) as fake:
        with pytest.raises(ModelPreflightError) as caught:
            await preflight(target(fake), redact=lambda text: text.replace("acme-corp", "***"))
    assert caught.value.code == "PROVIDER_ERROR"
    assert "acme-corp" not in str(caught.value) and "***" in caught.value.message
