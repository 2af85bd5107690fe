"""What a rollout may ask of the bridge: the request rules of the reference's bridge (§3.11).

A chat completion body is an envelope (`model`, `messages`, `stream`, `stream_options`, `n`)
plus inference parameters. The bridge owns the envelope (the model is pinned, streaming is
emulated, only `n=1` exists) and forwards inference parameters (`temperature`, `tools`,
`tool_choice`, `response_format`, `max_tokens`, `metadata`, …). A parameter that would steer
LiteLLM or the transport instead of the model — a credential, an endpoint, headers,
callbacks, retries, timeouts, prices, another provider — is refused with a 400 naming it,
never executed and never silently dropped.

    params = inference_params({"model": "x", "messages": msgs, "temperature": 0})
    # {"temperature": 0}
    inference_params({"messages": msgs, "api_base": "http://evil"})
    # RequestRejected: ... cannot override the bridge's configuration: api_base
    inference_params({"messages": msgs, "max_tokens": 10**6}, max_tokens=131072)
    # RequestRejected: max_tokens 1000000 is above this run's cap of 131072 tokens

A cap on tokens is a refusal, not a quiet clamp: a clamped call would come back cut short
(`finish_reason="length"`) and look like the model's own doing.

The names below cover every LiteLLM control parameter of LiteLLM 1.110 (`all_litellm_params`,
`GenericLiteLLMParams`, `common_cloud_provider_auth_params`); a slow test re-derives that
set from the installed LiteLLM, so an upgrade that adds one fails the test suite instead of
opening a hole. Kept as a static list because the bridge must not import LiteLLM to check.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ENVELOPE_FIELDS", "RequestRejected", "inference_params", "is_control_param"]

ENVELOPE_FIELDS = frozenset({"model", "messages", "stream", "stream_options", "n"})

# Families of LiteLLM settings, integrations and provider credentials.
_CONTROL_PREFIXES = (
    "_",
    "adaptive_router",
    "allm_",
    "anthropic_",
    "arize_",
    "auto_router",
    "aws_",
    "azure",
    "bedrock_",
    "braintrust_",
    "cache",
    "caching",
    "chatgpt_",
    "client",
    "complexity_router",
    "context_window_fallback",
    "dd_",
    "default_api_key",
    "fallback",
    "gcs_",
    "github_copilot",
    "humanloop_",
    "input_cost",
    "langfuse_",
    "langsmith_",
    "litellm_",
    "lunary_",
    "max_budget",
    "milvus_",
    "mock_",
    "model_",
    "newrelic_",
    "oci_",
    "openai_",
    "output_cost",
    "posthog_",
    "prompt_",
    "quality_router",
    "s3_",
    "sagemaker_",
    "signoz_",
    "slack_",
    "stream_timeout",
    "switchyard_",
    "token_exchange",
    "use_",
    "valkey_",
    "vertex_",
    "wandb_",
    "watsonx_",
    "weave_",
    "wx_",
)
# Words that only credentials, endpoints, transport settings and prices contain.
_CONTROL_WORDS = (
    "api_base",
    "api_key",
    "apikey",
    "base_url",
    "cost_per",
    "credential",
    "endpoint",
    "header",
    "password",
    "secret",
    "timeout",
    "url",
)
# The rest, one by one: LiteLLM's routing, budgets, logging and provider selection.
_CONTROL_NAMES = frozenset(
    {
        "account_id",
        "acompletion",
        "additional_drop_params",
        "aembedding",
        "aimg_generation",
        "allow_client_keepalive_override",
        "allow_legacy_cloud_file_ids",
        "allowed_model_region",
        "allowed_openai_params",
        "annotation_cost_per_page",
        "annotation_cost_per_page_batches",
        "api_type",
        "api_version",
        "assistant_continue_message",
        "async_call",
        "atext_completion",
        "attempted_targets",
        "base_model",
        "bos_token",
        "bucket_name",
        "budget_duration",
        "callbacks",
        "citation_cost_per_token",
        "complete_response",
        "completion_call_id",
        "config",
        "configurable_clientside_auth_params",
        "contents",
        "cooldown_time",
        "custom_llm_provider",
        "custom_prompt_dict",
        "daily_reset_time",
        "data_residency",
        "databricks_user_agent",
        "deployment_id",
        "disable_add_transform_inline_image_block",
        "drop_params",
        "enable_json_schema_validation",
        "enable_prompt_caching",
        "enable_tag_filtering",
        "engine",
        "ensure_alternating_roles",
        "eos_token",
        "explicit_cache_read_input_token_cost",
        "extra_query",
        "failure_callback",
        "fastest_response",
        "fedramp_uplift_multiplier",
        "final_prompt_value",
        "fireworks_forward_user_id",
        "force_timeout",
        "google_maps_grounding_cost_per_query",
        "guardrails",
        "hf_model_name",
        "http_client",
        "id",
        "initial_prompt_value",
        "input",
        "inputText",
        "itpm",
        "keepalive_seconds",
        "kubernetes_pod_discovery",
        "log_client_error_tracebacks",
        "logger_fn",
        "max_agentic_loops",
        "max_fallbacks",
        "max_file_size_mb",
        "max_parallel_requests",
        "max_retries",
        "merge_reasoning_content_in_choices",
        "method",
        "models",
        "no-log",
        "num_retries",
        "ocr_cost_per_credit",
        "ocr_cost_per_page",
        "ocr_cost_per_page_batches",
        "order",
        "organization",
        "original_function",
        "otpm",
        "output_vector_size",
        "predibase_tenant_id",
        "preset",
        "preset_cache_key",
        "project",
        "project_id",
        "prompt",
        "provider_affinity_header",
        "provider_specific_header",
        "proxy_server_request",
        "region",
        "region_name",
        "regional_endpoint_uplift_multiplier",
        "regional_processing_uplift_multiplier_eu",
        "regional_processing_uplift_multiplier_us",
        "responses_api_version",
        "retry_policy",
        "retry_strategy",
        "roles",
        "routing_strategy",
        "rpd",
        "rpm",
        "rust",
        "search_context_cost_per_query",
        "search_queries_cost_per_query",
        "search_tool_name",
        "self",
        "shared_session",
        "silent_model",
        "space_id",
        "ssl_verify",
        "stream_chunk_size",
        "stream_response",
        "success_callback",
        "supports_system_message",
        "system",
        "systemInstruction",
        "system_instruction",
        "tag_regex",
        "tags",
        "tenant_id",
        "text_completion",
        "thought_signature_in_tool_call_id",
        "tiered_pricing",
        "token",
        "tpd",
        "tpm",
        "ttl",
        "turn_off_message_logging",
        "usage",
        "user_agent",
        "user_api_key_end_user_id",
        "user_config",
        "user_continue_message",
        "vector_store_id",
        "verbose",
        "weight",
        "workspace_id",
    }
)
# Inference parameters that a prefix or word above would otherwise catch.
_INFERENCE_NAMES = frozenset({"metadata", "prompt_cache_key", "prompt_cache_retention"})
# What a call asks for as its most output tokens, in OpenAI's old and new spelling.
_TOKEN_LIMITS = ("max_tokens", "max_completion_tokens")


class RequestRejected(ValueError):
    """The request breaks a bridge rule; answered with 400 and this message.

    `param` names the offending field when there is one (OpenAI's error `param`).
    """

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def is_control_param(name: str) -> bool:
    """Whether `name` would steer LiteLLM or the transport rather than the model.

    is_control_param("api_base")     # True
    is_control_param("temperature")  # False
    """
    if name in _INFERENCE_NAMES:
        return False
    if name in _CONTROL_NAMES or name.startswith(_CONTROL_PREFIXES):
        return True
    lowered = name.lower()
    return any(word in lowered for word in _CONTROL_WORDS)


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        previous = base.get(key)
        if isinstance(previous, dict) and isinstance(value, Mapping):
            base[key] = _merge(dict(previous), value)
        else:
            base[key] = value
    return base


def inference_params(body: Mapping[str, Any], *, max_tokens: int | None = None) -> dict[str, Any]:
    """The inference parameters of a chat completion body, after checking the bridge rules.

    A literal `extra_body` object (sent by clients that do not merge it themselves) is merged
    in first, as the openai client would have. Raises `RequestRejected` for: no `messages`
    list, `n` other than 1, a malformed `stream`/`stream_options`, any control parameter
    (all of them named, sorted), or `max_tokens` / `max_completion_tokens` above
    `max_tokens` (the cap named).

        inference_params({"messages": [...], "n": 2})  # RequestRejected: only n=1 …
    """
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestRejected("'messages' must be a non-empty list", param="messages")
    if not all(isinstance(message, Mapping) for message in messages):
        raise RequestRejected("every message must be a JSON object", param="messages")
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise RequestRejected(
            f"the evaluation bridge supports only n=1 (got n={n!r}); make n calls instead",
            param="n",
        )
    if body.get("stream") not in (None, True, False):
        raise RequestRejected("'stream' must be true or false", param="stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, Mapping):
        raise RequestRejected("'stream_options' must be an object", param="stream_options")

    params = {key: value for key, value in body.items() if key not in ENVELOPE_FIELDS}
    extra = params.pop("extra_body", None)
    if extra is not None:
        if not isinstance(extra, Mapping):
            raise RequestRejected("'extra_body' must be an object", param="extra_body")
        if "extra_body" in extra:
            raise RequestRejected("'extra_body' cannot contain another extra_body")
        nested_envelope = sorted(ENVELOPE_FIELDS.intersection(extra))
        if nested_envelope:
            raise RequestRejected(
                "'extra_body' cannot set envelope fields: " + ", ".join(nested_envelope),
                param=nested_envelope[0],
            )
        params = _merge(params, extra)
    blocked = sorted(key for key in params if is_control_param(key))
    if blocked:
        raise RequestRejected(
            "these parameters cannot override the evaluation bridge's configuration "
            "(the run's model, endpoint and credentials are fixed): " + ", ".join(blocked),
            param=blocked[0],
        )
    if max_tokens is not None:
        for name in _TOKEN_LIMITS:
            asked = params.get(name)
            if (
                isinstance(asked, (int, float))
                and not isinstance(asked, bool)
                and asked > max_tokens
            ):
                raise RequestRejected(
                    f"{name} {asked} is above this run's cap of {max_tokens} tokens; "
                    f"ask for {max_tokens} or fewer",
                    param=name,
                )
    return params
