"""The bridge's request rules: envelope, n=1, and no control or credential parameters."""

from __future__ import annotations

from typing import Any

import pytest

from osmosis.eval.model.bridge_rules import RequestRejected, inference_params, is_control_param
from osmosis.eval.model.provider_litellm import import_litellm

MESSAGES = [{"role": "user", "content": "hi"}]

# What OpenAI's chat completions API (and LiteLLM's acompletion) take as inference parameters.
INFERENCE = [
    "audio",
    "frequency_penalty",
    "function_call",
    "functions",
    "logit_bias",
    "logprobs",
    "max_completion_tokens",
    "max_tokens",
    "metadata",
    "modalities",
    "parallel_tool_calls",
    "prediction",
    "presence_penalty",
    "prompt_cache_key",
    "prompt_cache_retention",
    "reasoning_effort",
    "response_format",
    "safety_identifier",
    "seed",
    "service_tier",
    "stop",
    "store",
    "temperature",
    "thinking",
    "tool_choice",
    "tools",
    "top_k",
    "top_logprobs",
    "top_p",
    "user",
    "verbosity",
    "web_search_options",
]


@pytest.mark.parametrize("name", INFERENCE)
def test_inference_parameters_are_not_control_parameters(name: str) -> None:
    assert not is_control_param(name)


@pytest.mark.parametrize(
    "name",
    [
        "api_base",
        "api_key",
        "base_url",
        "api_version",
        "extra_headers",
        "headers",
        "default_headers",
        "callbacks",
        "litellm_params",
        "litellm_anything_new",
        "aws_profile_name",
        "vertex_location",
        "azure_ad_token",
        "watsonx_region_name",
        "timeout",
        "stream_timeout",
        "num_retries",
        "custom_llm_provider",
        "organization",
        "input_cost_per_token",
        "output_cost_per_token",
        "mock_response",
        "model_list",
        "fallbacks",
        "caching",
        "_private",
        "ssl_verify",
        "client",
    ],
)
def test_control_parameters(name: str) -> None:
    assert is_control_param(name)


def test_envelope_fields_are_removed_and_the_rest_forwarded() -> None:
    body = {
        "model": "x",
        "messages": MESSAGES,
        "stream": True,
        "stream_options": {"include_usage": True},
        "n": 1,
        "temperature": 0,
        "tools": [],
    }
    assert inference_params(body) == {"temperature": 0, "tools": []}


def test_extra_body_is_merged_as_the_openai_client_would() -> None:
    body = {
        "messages": MESSAGES,
        "metadata": {"a": 1, "b": {"c": 2}},
        "extra_body": {"top_k": 3, "metadata": {"b": {"d": 4}}},
    }
    assert inference_params(body) == {"metadata": {"a": 1, "b": {"c": 2, "d": 4}}, "top_k": 3}


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"messages": MESSAGES, "n": 2}, "n", "only n=1"),
        ({"messages": MESSAGES, "n": True}, "n", "only n=1"),
        ({}, "messages", "non-empty list"),
        ({"messages": []}, "messages", "non-empty list"),
        ({"messages": ["hi"]}, "messages", "JSON object"),
        ({"messages": MESSAGES, "stream": "yes"}, "stream", "true or false"),
        ({"messages": MESSAGES, "stream_options": []}, "stream_options", "object"),
        ({"messages": MESSAGES, "extra_body": []}, "extra_body", "object"),
        ({"messages": MESSAGES, "extra_body": {"model": "y"}}, "model", "envelope"),
        ({"messages": MESSAGES, "extra_body": {"api_key": "k"}}, "api_key", "api_key"),
        (
            {"messages": MESSAGES, "timeout": 1, "api_base": "x", "temperature": 0},
            "api_base",
            "api_base, timeout",
        ),
    ],
)
def test_rule_breaking_requests_are_rejected(
    body: dict[str, Any], param: str, message: str
) -> None:
    with pytest.raises(RequestRejected, match=message) as caught:
        inference_params(body)
    assert caught.value.param == param


@pytest.mark.slow
def test_every_litellm_control_parameter_is_refused() -> None:
    """Re-derive LiteLLM's control parameters from the installed version, as the reference's
    bridge does at run time: an upgrade that adds one must fail here, not open a hole."""
    litellm = import_litellm()
    from litellm.types.router import GenericLiteLLMParams
    from litellm.types.utils import all_litellm_params

    controls = (
        set(all_litellm_params)
        | set(GenericLiteLLMParams.model_fields)
        | set(litellm.common_cloud_provider_auth_params["params"])
    ) - {"metadata"}  # request data, even though LiteLLM also uses the name
    assert sorted(name for name in controls if not is_control_param(name)) == []
    assert [name for name in INFERENCE if name in controls] == []
