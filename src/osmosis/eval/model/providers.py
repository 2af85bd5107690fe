"""Where the run's model lives and how to call it: model resolution and provider transports.

`resolve_model` turns a `model_path` ("openai/gpt-4o-mini", "hosted_vllm/qwen3",
"anthropic/claude-sonnet-4-5") and an environment mapping into a `ModelTarget`: the model to
call, its endpoint and its credentials, read from the variables LiteLLM reads (`OPENAI_API_KEY`,
`OPENAI_BASE_URL`/`OPENAI_API_BASE`, `ANTHROPIC_API_KEY`, …). The mapping is passed in (the
process environment merged with the run's `[env]` and secrets); `os.environ` is never changed.

    target = resolve_model("openai/qwen3", {"OPENAI_API_BASE": "http://127.0.0.1:8000/v1"})
    transport = open_transport(target)
    completion = await transport.complete({"model": target.model, "messages": [...]})

Two transports sit behind a small registry, each imported only when used:

- `openai-compatible` (`osmosis.eval.model.provider_openai`): a pooled aiohttp session posting
  `/chat/completions` directly. For OpenAI-wire endpoints the run owns or can reach cheaply
  (`openai/…` with an api_base, `hosted_vllm/…`, `local/…`), where throughput matters: LiteLLM
  costs ~12 ms of CPU per call and tops out near 80-90 calls/s per process.
- `litellm` (`osmosis.eval.model.provider_litellm`): `litellm.acompletion` for every other provider,
  including the official OpenAI endpoint, where LiteLLM's per-model parameter translation
  (e.g. `max_tokens` → `max_completion_tokens` for reasoning models) is worth its cost.

Either raises `ProviderError` carrying the HTTP status (or the transport failure), so retries and
the pre-flight classify by cause, never by an exception class name.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

__all__ = [
    "Completion",
    "ModelResolutionError",
    "ModelTarget",
    "ProviderError",
    "Transport",
    "open_transport",
    "resolve_model",
]

TargetKind = Literal["openai-compatible", "litellm"]
ErrorCause = Literal["status", "connection", "timeout", "unknown"]

OFFICIAL_OPENAI_BASE = "https://api.openai.com/v1"
DEFAULT_TIMEOUT = 600.0
"""Seconds one provider call may take; long generations on slow providers take minutes."""

# Statuses a provider answers when trying again later may work: request timeout, conflict
# (OpenAI uses it for lock timeouts), too early, rate limited, and every server error.
_RETRYABLE_STATUSES = frozenset({408, 409, 425, 429})

# LiteLLM settings (passed as keyword arguments) that are credentials, so never shown.
_SECRET_PARAMS = frozenset(
    {"aws_access_key_id", "aws_secret_access_key", "aws_session_token", "vertex_credentials"}
)


class ProviderError(Exception):
    """A provider call failed: an error status, no connection, a timeout, or a broken answer.

    `status` is the provider's HTTP status (None when no answer came back); `retry_after` is
    the delay the provider asked for, in seconds.

        try:
            await transport.complete(body)
        except ProviderError as error:
            error.status, error.retryable  # 429, True
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        cause: ErrorCause = "status",
        retry_after: float | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.cause: ErrorCause = cause
        self.retry_after = retry_after
        self.code = code

    @property
    def retryable(self) -> bool:
        """Whether trying again may help: 408/409/425/429, any 5xx, no connection, a timeout."""
        if self.cause in ("connection", "timeout"):
            return True
        status = self.status
        return status is not None and (status in _RETRYABLE_STATUSES or status >= 500)

    def __repr__(self) -> str:
        return f"ProviderError({self.message!r}, status={self.status}, cause={self.cause!r})"


class ModelResolutionError(ValueError):
    """The model path cannot be called as configured (e.g. a server-hosted model with no URL)."""


@dataclass(frozen=True)
class ModelTarget:
    """The model a run calls: which transport, which model name, where, with which key.

    Build one with `resolve_model`, or directly for an OpenAI-wire server the run owns:

        ModelTarget(kind="openai-compatible", model="qwen3", api_base="http://127.0.0.1:8000/v1")
    """

    kind: TargetKind
    """"openai-compatible" (direct HTTP) or "litellm"."""
    model: str
    """The name sent to the provider: the bare name on the direct path, LiteLLM's id otherwise."""
    api_base: str | None = None
    """The endpoint (".../v1"); None lets LiteLLM use the provider's official one."""
    api_key: str | None = field(default=None, repr=False)
    """The provider key; never shown, logged or recorded."""
    model_path: str = ""
    """The configured model path, for prices and display (defaults to `model`)."""
    provider: str | None = None
    """LiteLLM's provider name ("openai", "anthropic", …), when known."""
    key_env: str | None = None
    """The variable the key is read from, named in error messages ("OPENAI_API_KEY")."""
    needs_key: bool = False
    """Whether calls cannot work without `api_key` (checked before the pre-flight calls)."""
    params: Mapping[str, Any] = field(default_factory=dict, repr=False)
    """Further provider settings passed to LiteLLM (api_version, aws_region_name, …)."""
    timeout: float = DEFAULT_TIMEOUT
    """Seconds one provider call may take."""

    def __post_init__(self) -> None:
        if not self.model:
            raise ModelResolutionError("the model name is empty")
        if self.kind == "openai-compatible" and not self.api_base:
            raise ModelResolutionError(
                f"model {self.model!r}: an openai-compatible target needs an api_base URL"
            )
        if not self.model_path:
            object.__setattr__(self, "model_path", self.model)

    def secrets(self) -> tuple[str, ...]:
        """Every credential value this target holds, for redaction."""
        values = [self.api_key] if self.api_key else []
        for name, value in self.params.items():
            if name in _SECRET_PARAMS and isinstance(value, str) and value:
                values.append(value)
        return tuple(values)


@dataclass(frozen=True)
class Completion:
    """A provider's successful answer in OpenAI's `chat.completion` shape."""

    payload: dict[str, Any]
    """The decoded `chat.completion` object."""
    raw: bytes | None = None
    """The body exactly as received, when it can be passed on without re-encoding."""


class Transport(Protocol):
    """Calls one model target. `complete` raises `ProviderError` on any failure."""

    async def complete(self, body: Mapping[str, Any]) -> Completion:
        """Send one non-streaming chat completion (`model` and `messages` included)."""
        ...

    async def aclose(self) -> None:
        """Release pooled connections."""
        ...


# -- the provider table ----------------------------------------------------------------------
@dataclass(frozen=True)
class _Provider:
    """How LiteLLM finds one provider's settings in the environment."""

    key_env: tuple[str, ...] = ()
    base_env: tuple[str, ...] = ()
    needs_key: bool = False
    """True when no call works without a key (and the key is the only credential)."""
    direct: Literal["never", "with-base", "always"] = "never"
    """When the direct OpenAI-wire transport serves it instead of LiteLLM."""
    params_env: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """LiteLLM keyword argument → the variables it is read from, first set wins."""


_PROVIDERS: dict[str, _Provider] = {
    "openai": _Provider(
        key_env=("OPENAI_API_KEY",),
        base_env=("OPENAI_BASE_URL", "OPENAI_API_BASE"),  # LiteLLM's precedence
        needs_key=True,
        direct="with-base",
    ),
    "hosted_vllm": _Provider(
        key_env=("HOSTED_VLLM_API_KEY",), base_env=("HOSTED_VLLM_API_BASE",), direct="always"
    ),
    # A model osmosis serves itself; its URL comes from whoever started it.
    "local": _Provider(direct="always"),
    "anthropic": _Provider(
        key_env=("ANTHROPIC_API_KEY",),
        base_env=("ANTHROPIC_API_BASE", "ANTHROPIC_BASE_URL"),
        needs_key=True,
    ),
    "azure": _Provider(
        key_env=("AZURE_API_KEY", "AZURE_OPENAI_API_KEY"),
        base_env=("AZURE_API_BASE",),
        params_env={"api_version": ("AZURE_API_VERSION",)},
    ),
    "gemini": _Provider(key_env=("GEMINI_API_KEY", "GOOGLE_API_KEY"), needs_key=True),
    "groq": _Provider(key_env=("GROQ_API_KEY",), needs_key=True),
    "mistral": _Provider(key_env=("MISTRAL_API_KEY",), needs_key=True),
    "deepseek": _Provider(key_env=("DEEPSEEK_API_KEY",), needs_key=True),
    "together_ai": _Provider(
        key_env=("TOGETHERAI_API_KEY", "TOGETHER_API_KEY", "TOGETHER_AI_API_KEY"), needs_key=True
    ),
    "fireworks_ai": _Provider(
        key_env=("FIREWORKS_API_KEY", "FIREWORKS_AI_API_KEY", "FIREWORKSAI_API_KEY"),
        needs_key=True,
    ),
    "openrouter": _Provider(key_env=("OPENROUTER_API_KEY", "OR_API_KEY"), needs_key=True),
    "xai": _Provider(key_env=("XAI_API_KEY",), needs_key=True),
    "cohere": _Provider(key_env=("COHERE_API_KEY", "CO_API_KEY"), needs_key=True),
    "perplexity": _Provider(key_env=("PERPLEXITYAI_API_KEY", "PERPLEXITY_API_KEY"), needs_key=True),
    "deepinfra": _Provider(key_env=("DEEPINFRA_API_KEY",), needs_key=True),
    "cerebras": _Provider(key_env=("CEREBRAS_API_KEY",), needs_key=True),
    "ollama": _Provider(key_env=("OLLAMA_API_KEY",), base_env=("OLLAMA_API_BASE",)),
    "ollama_chat": _Provider(key_env=("OLLAMA_API_KEY",), base_env=("OLLAMA_API_BASE",)),
    "bedrock": _Provider(
        params_env={
            "aws_access_key_id": ("AWS_ACCESS_KEY_ID",),
            "aws_secret_access_key": ("AWS_SECRET_ACCESS_KEY",),
            "aws_session_token": ("AWS_SESSION_TOKEN",),
            "aws_region_name": ("AWS_REGION_NAME", "AWS_REGION", "AWS_DEFAULT_REGION"),
        }
    ),
    "vertex_ai": _Provider(
        params_env={
            "vertex_project": ("VERTEXAI_PROJECT", "VERTEX_PROJECT"),
            "vertex_location": ("VERTEXAI_LOCATION", "VERTEX_LOCATION"),
            "vertex_credentials": ("VERTEXAI_CREDENTIALS",),
        }
    ),
}


def _first(env: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    for name in names:
        value = env.get(name)
        if value:
            return value
    return None


def _is_official_openai(api_base: str | None) -> bool:
    return api_base is None or api_base.rstrip("/") == OFFICIAL_OPENAI_BASE


def _bare_provider(model: str) -> str | None:
    # LiteLLM infers the provider of a bare name ("gpt-4o") from its model catalog.
    from osmosis.eval.model.pricing import load_price_map

    entry = load_price_map().get(model)
    provider = entry.get("litellm_provider") if entry is not None else None
    return provider if isinstance(provider, str) else None


def resolve_model(
    model_path: str,
    env: Mapping[str, str],
    *,
    api_base: str | None = None,
    api_key: str | None = None,
    force_litellm: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
) -> ModelTarget:
    """The `ModelTarget` for `model_path`, with settings read from `env` as LiteLLM reads them.

    `api_base`/`api_key` override the environment (e.g. for a model osmosis serves itself);
    `force_litellm` sends an OpenAI-wire model through LiteLLM anyway.

        resolve_model("openai/gpt-4o-mini", {"OPENAI_API_KEY": "sk-…"}).kind  # "litellm"
        resolve_model("hosted_vllm/qwen3", {"HOSTED_VLLM_API_BASE": url}).kind
        # "openai-compatible"

    Raises `ModelResolutionError` when the path cannot work as configured (an empty name, a
    server-hosted model with no URL). A missing key is not an error here: the pre-flight
    reports it, naming the variable (`ModelTarget.needs_key`, `key_env`).
    """
    model_path = model_path.strip()
    prefix, slash, name = model_path.partition("/")
    if slash and not name:
        raise ModelResolutionError(f"model_path {model_path!r} names no model after {prefix!r}/")
    if not model_path:
        raise ModelResolutionError("model_path is empty")
    provider = prefix if slash else _bare_provider(model_path)
    spec = _PROVIDERS.get(provider or "", _Provider())
    key_env = spec.key_env[0] if spec.key_env else None
    key = api_key or _first(env, spec.key_env)
    base = api_base or _first(env, spec.base_env)
    params = {
        param: value
        for param, names in spec.params_env.items()
        if (value := _first(env, names)) is not None
    }

    if spec.direct == "always" and not base:
        variable = spec.base_env[0] if spec.base_env else None
        where = f"set {variable}" if variable else "pass the server's URL as api_base"
        raise ModelResolutionError(
            f"model_path {model_path!r} is served by an OpenAI-compatible server with no "
            f"known URL: {where} (e.g. http://127.0.0.1:8000/v1)"
        )
    official = provider == "openai" and _is_official_openai(base)
    direct = spec.direct == "always" or (spec.direct == "with-base" and not official)
    if direct and not force_litellm and base is not None:
        return ModelTarget(
            kind="openai-compatible",
            model=name if slash else model_path,
            api_base=base,
            api_key=key,
            model_path=model_path,
            provider=provider,
            key_env=key_env,
            timeout=timeout,
        )
    if provider == "openai" and not official and key is None:
        # The openai SDK under LiteLLM refuses to run without a key, and would otherwise read
        # OPENAI_API_KEY from os.environ; a local server ignores the placeholder.
        key = "unused"
    return ModelTarget(
        kind="litellm",
        # A model osmosis serves itself is, to LiteLLM, an OpenAI-compatible server.
        model=f"openai/{name}" if provider == "local" else model_path,
        api_base=base,
        api_key=key,
        model_path=model_path,
        provider=provider,
        key_env=key_env,
        needs_key=spec.needs_key and (provider != "openai" or official),
        params=params,
        timeout=timeout,
    )


# -- the transport registry ------------------------------------------------------------------
_TRANSPORTS: dict[str, tuple[str, str]] = {
    "openai-compatible": ("osmosis.eval.model.provider_openai", "OpenAIWireTransport"),
    "litellm": ("osmosis.eval.model.provider_litellm", "LiteLLMTransport"),
}


def open_transport(target: ModelTarget) -> Transport:
    """A transport for `target`, importing its module on first use (LiteLLM's takes seconds).

    transport = open_transport(target)
    try:
        completion = await transport.complete(body)
    finally:
        await transport.aclose()
    """
    module_name, class_name = _TRANSPORTS[target.kind]
    factory = getattr(importlib.import_module(module_name), class_name)
    transport: Transport = factory(target)
    return transport
