"""The model pre-flight: one small completion before any rollout is dispatched.

A run whose model cannot answer should stop before it starts, with a message that names the
cause and the fix, instead of turning every attempt into the same failure. The probe sends
"hi" with a small `max_tokens` through the same transport the bridge will use, under a short
retry policy, and sorts what goes wrong:

| code | when |
|---|---|
| `MISSING_CREDENTIALS` | the provider needs a key and none is configured (found before any call) |
| `AUTH_FAILED` | the provider answered 401 or 403 |
| `MODEL_NOT_FOUND` | 404, or a "model … does not exist / not found" answer |
| `RATE_LIMITED` | still 429 after the short retry |
| `PROVIDER_UNREACHABLE` | no connection, or no answer in time |
| `PROVIDER_ERROR` | anything else (other 4xx, persistent 5xx, a broken answer) |

    result = await preflight(resolve_model(config.model_path, env))
    # or: ModelPreflightError: [AUTH_FAILED] openai/gpt-4o-mini: the provider rejected ...
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from osmosis.eval.model.providers import Completion, ModelTarget, ProviderError, open_transport
from osmosis.eval.model.retry import RetriesExhausted, RetryPolicy, call_with_retries

__all__ = [
    "PREFLIGHT_RETRY",
    "ModelPreflightError",
    "PreflightCode",
    "PreflightResult",
    "preflight",
]

PreflightCode = Literal[
    "MISSING_CREDENTIALS",
    "AUTH_FAILED",
    "MODEL_NOT_FOUND",
    "RATE_LIMITED",
    "PROVIDER_UNREACHABLE",
    "PROVIDER_ERROR",
]

PREFLIGHT_RETRY = RetryPolicy(max_attempts=3, max_elapsed=10.0, initial_backoff=0.5)
"""Short and bounded: a pre-flight that waits a minute for a rate limit helps nobody."""

_PROBE_MESSAGES = [{"role": "user", "content": "hi"}]
_PROBE_MAX_TOKENS = 32
_NOT_FOUND = re.compile(
    r"model.{0,120}(not[ _]found|does not exist|unknown|not supported|invalid model)"
    r"|(no such|unknown|invalid) model|model_not_found",
    re.IGNORECASE | re.DOTALL,
)


class ModelPreflightError(Exception):
    """The run's model cannot be called; `code` says why and the message says how to fix it.

    except ModelPreflightError as error:
        print(error.code, error.message)  # AUTH_FAILED, "openai/gpt-4o-mini: ..."
    """

    def __init__(self, code: PreflightCode, message: str) -> None:
        super().__init__(f"[{code}] {message}")
        self.code: PreflightCode = code
        self.message = message


@dataclass(frozen=True)
class PreflightResult:
    """The probe's answer: the model works.

    PreflightResult(model_path="openai/gpt-4o-mini", model="gpt-4o-mini-2024-07-18", ...)
    """

    model_path: str
    """The configured model path."""
    model: str
    """The model that answered, as the provider names it."""
    latency_ms: float
    attempts: int
    reply: str
    """The start of the probe's reply text (for a log line)."""


def _where(target: ModelTarget) -> str:
    return target.api_base or f"the {target.provider or 'provider'}'s default endpoint"


def _key_hint(target: ModelTarget) -> str:
    variable = target.key_env or "the provider's API key variable"
    # Keys are secrets: the docs keep them out of [env], whose literal values sit in git.
    return (
        f"check {variable}: export it, or name it in [secrets].required and pass its value "
        "with --secrets-file (platform runs: `osmosis secret set`)"
    )


def _classify(target: ModelTarget, error: ProviderError, attempts: int) -> ModelPreflightError:
    name = target.model_path
    where = _where(target)
    status = error.status
    text = f"{error.message} (HTTP {status})" if status is not None else error.message
    if error.cause == "connection":
        return ModelPreflightError(
            "PROVIDER_UNREACHABLE",
            f"{name}: cannot connect to {where} after {attempts} attempt(s): {error.message}. "
            "Is the server running, and is its URL right? Check the api_base "
            "(OPENAI_BASE_URL / OPENAI_API_BASE / HOSTED_VLLM_API_BASE).",
        )
    if error.cause == "timeout":
        return ModelPreflightError(
            "PROVIDER_UNREACHABLE",
            f"{name}: {where} did not answer in time after {attempts} attempt(s). "
            "Check that the server is up and not overloaded.",
        )
    if status in (401, 403):
        return ModelPreflightError(
            "AUTH_FAILED",
            f"{name}: the provider rejected the credentials: {text}. {_key_hint(target)}.",
        )
    if status == 404 or (status is not None and status < 500 and _NOT_FOUND.search(error.message)):
        return ModelPreflightError(
            "MODEL_NOT_FOUND",
            f"{name}: the provider does not know this model: {text}. Check model_path "
            f"(the model id as {where} lists it, with its provider prefix).",
        )
    if status == 429:
        return ModelPreflightError(
            "RATE_LIMITED",
            f"{name}: the provider kept rate-limiting after {attempts} attempt(s): {text}. "
            "Wait, raise the provider's limits, or lower the run's concurrency.",
        )
    return ModelPreflightError(
        "PROVIDER_ERROR",
        f"{name}: the probe completion failed after {attempts} attempt(s): {text}.",
    )


def _reply_text(completion: Completion) -> str:
    choices = completion.payload.get("choices")
    first: Any = choices[0] if isinstance(choices, list) and choices else {}
    message = first.get("message") if isinstance(first, dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    return content[:80] if isinstance(content, str) else ""


async def preflight(
    target: ModelTarget,
    *,
    retry: RetryPolicy = PREFLIGHT_RETRY,
    redact: Callable[[str], str] | None = None,
) -> PreflightResult:
    """Send one probe completion to `target`; raise `ModelPreflightError` if it cannot answer.

        result = await preflight(target)
        result.model, result.latency_ms

    Error messages have the target's credentials blanked, then pass through `redact`.
    """
    if target.needs_key and not target.api_key:
        variable = target.key_env or "the provider's API key"
        raise ModelPreflightError(
            "MISSING_CREDENTIALS",
            f"{target.model_path}: no API key is configured; export {variable}, or name it "
            "in the config's [secrets].required and pass its value with --secrets-file "
            f"(platform runs: `osmosis secret set {target.key_env or 'NAME'}`).",
        )
    body = {"model": target.model, "messages": _PROBE_MESSAGES, "max_tokens": _PROBE_MAX_TOKENS}
    attempts = 0
    began = time.perf_counter()
    try:
        # Off the event loop: LiteLLM's import, for targets that need it, takes seconds.
        transport = await asyncio.to_thread(open_transport, target)
    except ProviderError as error:  # LiteLLM is not installed
        raise _scrubbed(
            ModelPreflightError("PROVIDER_ERROR", error.message), target, redact
        ) from error

    async def attempt() -> Completion:
        nonlocal attempts
        attempts += 1
        return await transport.complete(body)

    try:
        completion = await call_with_retries(attempt, retry)
    except RetriesExhausted as exhausted:
        raise _scrubbed(_classify(target, exhausted.last, attempts), target, redact) from exhausted
    except ProviderError as error:
        raise _scrubbed(_classify(target, error, attempts), target, redact) from error
    finally:
        await transport.aclose()
    model = completion.payload.get("model")
    return PreflightResult(
        model_path=target.model_path,
        model=model if isinstance(model, str) and model else target.model,
        latency_ms=(time.perf_counter() - began) * 1000,
        attempts=attempts,
        reply=_reply_text(completion),
    )


def _scrubbed(
    error: ModelPreflightError, target: ModelTarget, redact: Callable[[str], str] | None
) -> ModelPreflightError:
    message = error.message
    for secret in target.secrets():
        message = message.replace(secret, "[REDACTED]")
    if redact is not None:
        message = redact(message)
    return ModelPreflightError(error.code, message)
