"""Model resolution, provider errors and their classification, and the transport registry."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from typing import Any

import pytest

from osmosis.eval.model.provider_litellm import provider_error
from osmosis.eval.model.provider_openai import (
    OpenAIWireTransport,
    error_from_response,
    retry_after_seconds,
)
from osmosis.eval.model.providers import (
    ModelResolutionError,
    ModelTarget,
    ProviderError,
    open_transport,
    resolve_model,
)
from osmosis.testing import FakeModelServer

LOCAL = "http://127.0.0.1:8000/v1"


# -- resolve_model -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("model_path", "env", "expected"),
    [
        # OpenAI wire with a base: the direct path, the bare model name.
        (
            "openai/qwen3",
            {"OPENAI_API_BASE": LOCAL},
            ("openai-compatible", "qwen3", LOCAL, None, False),
        ),
        (
            "openai/qwen3",
            {"OPENAI_BASE_URL": LOCAL, "OPENAI_API_BASE": "http://other/v1", "OPENAI_API_KEY": "k"},
            ("openai-compatible", "qwen3", LOCAL, "k", False),
        ),
        (
            "hosted_vllm/org/model-7b",
            {"HOSTED_VLLM_API_BASE": LOCAL, "HOSTED_VLLM_API_KEY": "v"},
            ("openai-compatible", "org/model-7b", LOCAL, "v", False),
        ),
        # The official OpenAI endpoint goes through LiteLLM and needs a key.
        (
            "openai/gpt-4o-mini",
            {"OPENAI_API_KEY": "sk"},
            ("litellm", "openai/gpt-4o-mini", None, "sk", True),
        ),
        (
            "openai/gpt-4o-mini",
            {"OPENAI_API_BASE": "https://api.openai.com/v1/"},
            ("litellm", "openai/gpt-4o-mini", "https://api.openai.com/v1/", None, True),
        ),
        (
            "anthropic/claude-sonnet-4-5",
            {"ANTHROPIC_API_KEY": "ak"},
            ("litellm", "anthropic/claude-sonnet-4-5", None, "ak", True),
        ),
        (
            "together_ai/meta-llama/Llama-3-8b",
            {"TOGETHER_API_KEY": "tk"},
            ("litellm", "together_ai/meta-llama/Llama-3-8b", None, "tk", True),
        ),
        # A bare name: LiteLLM's catalog says whose it is.
        ("gpt-4o", {}, ("litellm", "gpt-4o", None, None, True)),
        # A provider osmosis has no table entry for: LiteLLM decides, nothing is required.
        ("someprovider/x", {}, ("litellm", "someprovider/x", None, None, False)),
    ],
)
def test_resolve_model(model_path: str, env: dict[str, str], expected: tuple[Any, ...]) -> None:
    target = resolve_model(model_path, env)
    assert (target.kind, target.model, target.api_base, target.api_key, target.needs_key) == (
        expected
    )
    assert target.model_path == model_path


def test_bare_names_get_their_provider_from_the_catalog() -> None:
    target = resolve_model("gpt-4o", {"OPENAI_API_KEY": "sk"})
    assert (target.provider, target.key_env, target.api_key) == ("openai", "OPENAI_API_KEY", "sk")


def test_cloud_provider_settings_are_passed_as_litellm_parameters() -> None:
    env = {
        "AWS_ACCESS_KEY_ID": "AKIA",
        "AWS_SECRET_ACCESS_KEY": "s3cr3t",
        "AWS_REGION": "eu-west-1",
    }
    target = resolve_model("bedrock/anthropic.claude-sonnet-4-6", env)
    assert target.kind == "litellm"
    assert target.params == {
        "aws_access_key_id": "AKIA",
        "aws_secret_access_key": "s3cr3t",
        "aws_region_name": "eu-west-1",
    }
    assert set(target.secrets()) == {"AKIA", "s3cr3t"}
    assert "s3cr3t" not in repr(target)


def test_an_openai_compatible_server_without_a_key_gets_a_placeholder_through_litellm() -> None:
    target = resolve_model("openai/qwen3", {"OPENAI_API_BASE": LOCAL}, force_litellm=True)
    assert (target.kind, target.model, target.api_base, target.needs_key) == (
        "litellm",
        "openai/qwen3",
        LOCAL,
        False,
    )
    assert target.api_key == "unused"  # never the process's OPENAI_API_KEY


def test_explicit_overrides_beat_the_environment() -> None:
    target = resolve_model(
        "local/smollm2-135m", {"OPENAI_API_BASE": "http://ignored/v1"}, api_base=LOCAL, api_key="k"
    )
    assert (target.kind, target.model, target.api_base, target.api_key) == (
        "openai-compatible",
        "smollm2-135m",
        LOCAL,
        "k",
    )
    assert target.model_path == "local/smollm2-135m"
    through_litellm = resolve_model("local/smollm2-135m", {}, api_base=LOCAL, force_litellm=True)
    assert through_litellm.model == "openai/smollm2-135m"


@pytest.mark.parametrize(
    ("model_path", "env", "mentions"),
    [
        ("hosted_vllm/qwen3", {}, "HOSTED_VLLM_API_BASE"),
        ("local/smollm2-135m", {}, "api_base"),
        ("openai/", {}, "names no model"),
        ("  ", {}, "empty"),
    ],
)
def test_unusable_model_paths_are_refused(
    model_path: str, env: dict[str, str], mentions: str
) -> None:
    with pytest.raises(ModelResolutionError, match=mentions):
        resolve_model(model_path, env)


def test_the_environment_is_read_from_the_mapping_and_never_written() -> None:
    before = dict(os.environ)
    target = resolve_model("openai/qwen3", {"OPENAI_API_BASE": LOCAL, "OPENAI_API_KEY": "mine"})
    assert target.api_key == "mine"
    assert dict(os.environ) == before


def test_a_target_hides_its_key_and_lists_its_secrets() -> None:
    target = ModelTarget(kind="openai-compatible", model="m", api_base=LOCAL, api_key="sk-123")
    assert "sk-123" not in repr(target)
    assert target.secrets() == ("sk-123",)
    assert target.model_path == "m"
    with pytest.raises(ModelResolutionError, match="api_base"):
        ModelTarget(kind="openai-compatible", model="m")
    with pytest.raises(ModelResolutionError, match="empty"):
        ModelTarget(kind="litellm", model="")


# -- provider errors -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("status", "cause", "retryable"),
    [
        (429, "status", True),
        (500, "status", True),
        (502, "status", True),
        (503, "status", True),
        (408, "status", True),
        (409, "status", True),
        (400, "status", False),
        (401, "status", False),
        (403, "status", False),
        (404, "status", False),
        (422, "status", False),
        (None, "connection", True),
        (None, "timeout", True),
        (None, "unknown", False),
    ],
)
def test_which_provider_errors_are_retryable(
    status: int | None, cause: Any, retryable: bool
) -> None:
    assert ProviderError("x", status=status, cause=cause).retryable is retryable


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({}, None),
        (None, None),
        ({"retry-after": "3"}, 3.0),
        ({"retry-after": "1.5"}, 1.5),
        ({"retry-after": "3", "retry-after-ms": "250"}, 0.25),
        ({"retry-after": "-4"}, 0.0),
        ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.0),  # a date in the past
        ({"retry-after": "soon"}, None),
    ],
)
def test_retry_after_headers(headers: dict[str, str] | None, seconds: float | None) -> None:
    assert retry_after_seconds(headers) == seconds


@pytest.mark.parametrize(
    ("body", "message", "code"),
    [
        (
            b'{"error": {"message": "no", "type": "x", "code": "model_not_found"}}',
            "no",
            "model_not_found",
        ),
        (b'{"error": "The model `x` does not exist."}', "The model `x` does not exist.", None),
        (b'{"detail": "Not Found"}', "Not Found", None),
        (b"<html>bad gateway</html>", "<html>bad gateway</html>", None),
        (b"", "the provider answered HTTP 404", None),
    ],
)
def test_error_bodies_keep_the_providers_message(
    body: bytes, message: str, code: str | None
) -> None:
    error = error_from_response(404, body, {"retry-after": "2"})
    assert (error.message, error.code, error.status, error.retry_after) == (message, code, 404, 2.0)


# LiteLLM's exceptions, imitated: classification must not need LiteLLM (or its import time).
class InternalServerError(Exception):
    status_code = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class RateLimitError(InternalServerError):
    status_code = 429
    litellm_response_headers = {"retry-after-ms": "1500"}


class APIConnectionError(Exception):
    pass


def raised(error: Exception, cause: BaseException | None = None) -> Exception:
    try:
        try:
            if cause is not None:
                raise cause
        finally:
            raise error
    except Exception as caught:
        return caught


def test_litellm_errors_are_classified_by_status_and_cause() -> None:
    refused = provider_error(
        raised(
            InternalServerError(
                "litellm.InternalServerError: InternalServerError: Connection error."
            ),
            ConnectionRefusedError(111, "Connection refused"),
        )
    )
    assert (refused.cause, refused.retryable) == ("connection", True)
    assert refused.message == "Connection error."

    limited = provider_error(
        raised(
            RateLimitError("litellm.RateLimitError: RateLimitError: OpenAIException - slow down")
        )
    )
    assert (limited.status, limited.retry_after, limited.message) == (429, 1.5, "slow down")

    connection = provider_error(raised(APIConnectionError("boom")))
    assert connection.cause == "connection"

    timeout = provider_error(raised(InternalServerError("x"), TimeoutError()))
    assert timeout.cause == "timeout"

    unknown = provider_error(raised(ValueError("LLM Provider NOT provided")))
    assert (unknown.cause, unknown.status, unknown.retryable) == ("unknown", None, False)


# -- transports ----------------------------------------------------------------------------------
def test_the_registry_opens_the_direct_transport_for_openai_compatible_targets() -> None:
    transport = open_transport(ModelTarget(kind="openai-compatible", model="m", api_base=LOCAL))
    assert isinstance(transport, OpenAIWireTransport)


def test_importing_the_bridge_does_not_import_litellm() -> None:
    code = (
        "import sys, osmosis.eval.model.bridge, osmosis.eval.model.preflight;"
        "from osmosis.eval.model.providers import ModelTarget, open_transport;"
        "open_transport(ModelTarget(kind='openai-compatible', model='m', api_base='http://x/v1'));"
        "assert 'litellm' not in sys.modules, 'litellm was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


async def test_the_direct_transport_reports_a_refused_connection() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        base = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    transport = OpenAIWireTransport(ModelTarget(kind="openai-compatible", model="m", api_base=base))
    try:
        with pytest.raises(ProviderError) as caught:
            await transport.complete({"model": "m", "messages": []})
    finally:
        await transport.aclose()
    assert (caught.value.cause, caught.value.retryable) == ("connection", True)
    assert base in caught.value.message


async def test_the_direct_transport_answers_one_call_after_another() -> None:
    async with FakeModelServer() as model:
        transport = OpenAIWireTransport(
            ModelTarget(kind="openai-compatible", model="m", api_base=model.base_url)
        )
        try:
            for _ in range(3):
                completion = await transport.complete(
                    {"model": "m", "messages": [{"role": "user", "content": "What is 2 + 3?"}]}
                )
                assert completion.payload["choices"][0]["message"]["content"]
        finally:
            await transport.aclose()
        stats = model.stats()
    assert stats.chat_completions == 3


async def test_a_provider_behind_the_environments_proxy_is_called_through_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The lean client cannot use a proxy: with one set for the provider's address, calls
    go through aiohttp and the proxy (here the fake model answers the proxied request)."""
    async with FakeModelServer() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        # Not routable from here: only the proxy can answer for it.
        base = "http://10.255.255.1/v1"
        transport = OpenAIWireTransport(
            ModelTarget(kind="openai-compatible", model="m", api_base=base)
        )
        try:
            completion = await transport.complete(
                {"model": "m", "messages": [{"role": "user", "content": "What is 2 + 3?"}]}
            )
        finally:
            await transport.aclose()
        assert completion.payload["choices"][0]["message"]["content"]
        assert proxy.stats().chat_completions == 1


@pytest.mark.slow
async def test_litellm_reports_a_refused_connection_as_a_connection_failure() -> None:
    """The machine notes' trap: LiteLLM raises InternalServerError("Connection error")."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        base = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    target = resolve_model("openai/m", {"OPENAI_API_BASE": base}, force_litellm=True)
    transport = open_transport(target)
    with pytest.raises(ProviderError) as caught:
        await transport.complete({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    await transport.aclose()
    assert (caught.value.cause, caught.value.retryable) == ("connection", True)


async def test_the_direct_transport_sends_and_takes_any_json_text_unchanged() -> None:
    """Non-ASCII text goes out as the same JSON value, and an answer whose text holds an
    escaped lone surrogate (which the fast parser refuses) is still a completion."""
    received: list[Any] = []
    answer = (
        b'{"choices":[{"index":0,"message":{"role":"assistant","content":"caf\\u00e9 \\ud800"},'
        b'"finish_reason":"stop"}]}'
    )

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(
            next(
                line.split(b":")[1]
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
        )
        received.append(json.loads(await reader.readexactly(length)))
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(answer), answer)
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    transport = OpenAIWireTransport(ModelTarget(kind="openai-compatible", model="m", api_base=base))
    request = {"model": "m", "messages": [{"role": "user", "content": "naïve 日本 \u2028 ✓"}]}
    try:
        completion = await transport.complete(request)
    finally:
        await transport.aclose()
        server.close()
        await server.wait_closed()
    assert received == [request]
    assert completion.payload["choices"][0]["message"]["content"] == "café \ud800"
    assert completion.raw == answer  # handed back to the rollout byte for byte
