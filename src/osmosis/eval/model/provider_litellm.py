"""The LiteLLM transport: every provider that is not plain OpenAI wire (and the official OpenAI
endpoint, whose per-model parameter rules LiteLLM knows).

LiteLLM is imported on first use, offline: its import would otherwise fetch a price map from
the internet, and it takes seconds, which `osmosis --help` and unit tests must not pay.
LiteLLM's own retries and the openai SDK's are switched off (`num_retries=0`,
`max_retries=0`): the bridge's `RetryPolicy` is the only one, so failures surface at once and
are retried by the same rules on every path.

    transport = LiteLLMTransport(resolve_model("anthropic/claude-sonnet-4-5", env))
    completion = await transport.complete({"model": "…", "messages": messages})
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import json
import os
import re
import threading
import warnings
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from osmosis.eval.model.provider_openai import retry_after_seconds
from osmosis.eval.model.providers import Completion, ModelTarget, ProviderError

__all__ = ["LiteLLMTransport", "import_litellm", "provider_error"]

_import_lock = threading.Lock()
# Modules LiteLLM imports lazily inside every call; their import warns (pydantic UserWarnings
# about ReadOnly TypedDict items), so they are imported where those warnings are silenced.
_LAZY_MODULES = ("litellm.llms.github_copilot.per_user_auth",)
_litellm: ModuleType | None = None
# "litellm.RateLimitError: RateLimitError: OpenAIException - <the provider's message>"
_LITELLM_PREFIX = re.compile(r"^(?:litellm\.\w+:\s*)?(?:\w+Error:\s*)?(?:\w+Exception\s*-\s*)?")


def import_litellm() -> ModuleType:
    """Import LiteLLM with nothing but the configured provider reachable.

    Its catalog flags must be set before the first import, or it downloads its price map
    and model catalogs; its banners on stdout are switched off. LiteLLM and its dependencies
    warn while importing and while building pydantic schemas on the first call (deprecations,
    ReadOnly TypedDict items): that is their business, so the import and one mocked call
    (`mock_response`: no network) run with warnings silenced here, and only here.

        litellm = import_litellm()
    """
    global _litellm
    if _litellm is not None:
        return _litellm
    with _import_lock:
        if _litellm is not None:
            return _litellm
        # Process-wide by necessity: LiteLLM reads only os.environ at import time.
        os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
        os.environ["LITELLM_OFFLINE_MODE"] = "true"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                import litellm

                litellm.suppress_debug_info = True
                for name in _LAZY_MODULES:
                    with contextlib.suppress(ImportError):
                        importlib.import_module(name)
                litellm.completion(
                    model="openai/osmosis-warm-up",
                    messages=[{"role": "user", "content": "hi"}],
                    mock_response="ok",
                    api_key="unused",
                    api_base="http://127.0.0.1:9/v1",
                    num_retries=0,
                    max_retries=0,
                    drop_params=True,
                ).model_dump_json()
        except ImportError as error:
            raise ProviderError(
                "calling this model needs LiteLLM: install it with `pip install litellm`",
                cause="unknown",
            ) from error
        _litellm = litellm
        return litellm


def _causes(error: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in chain and len(chain) < 16:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def provider_error(error: Exception) -> ProviderError:
    """Classify a LiteLLM exception by status and cause, not by class name alone.

    A refused connection surfaces as `InternalServerError` ("Connection error", status 500)
    whose cause chain holds the `ConnectionRefusedError`; that is a connection failure.
    """
    chain = _causes(error)
    names = {type(link).__name__ for link in chain}
    message = _LITELLM_PREFIX.sub("", str(getattr(error, "message", None) or error)).strip()
    if any(isinstance(link, TimeoutError) for link in chain) or any(
        "Timeout" in name for name in names
    ):
        return ProviderError(message or "the provider timed out", cause="timeout", status=None)
    if any(isinstance(link, ConnectionError) for link in chain) or any(
        "Connect" in name for name in names
    ):
        return ProviderError(message or "cannot connect", cause="connection")
    status = getattr(error, "status_code", None)
    headers = getattr(error, "litellm_response_headers", None)
    if headers is None:
        headers = getattr(getattr(error, "response", None), "headers", None)
    if not isinstance(status, int):
        return ProviderError(message or type(error).__name__, cause="unknown")
    code = getattr(error, "code", None)
    return ProviderError(
        message or f"the provider answered HTTP {status}",
        status=status,
        retry_after=retry_after_seconds(headers if isinstance(headers, Mapping) else None),
        code=code if isinstance(code, str) else None,
    )


class LiteLLMTransport:
    """Calls `litellm.acompletion` with the target's credentials passed explicitly.

    LiteLLMTransport(ModelTarget(kind="litellm", model="anthropic/claude-sonnet-4-5", api_key=k))
    """

    def __init__(self, target: ModelTarget) -> None:
        self._target = target
        self._litellm = import_litellm()
        settings: dict[str, Any] = dict(target.params)
        if target.api_base is not None:
            settings["api_base"] = target.api_base
        if target.api_key is not None:
            settings["api_key"] = target.api_key
        self._settings = settings

    async def complete(self, body: Mapping[str, Any]) -> Completion:
        """Send one chat completion through LiteLLM; raises `ProviderError` on any failure."""
        params = {key: value for key, value in body.items() if key not in ("model", "messages")}
        # LiteLLM may rewrite messages in place while translating them for a provider; the
        # bridge records the caller's messages, so LiteLLM gets its own copy.
        messages = copy.deepcopy(body["messages"])
        try:
            response = await self._litellm.acompletion(
                model=self._target.model,
                messages=messages,
                **params,
                **self._settings,
                timeout=self._target.timeout,
                num_retries=0,
                max_retries=0,
                drop_params=True,
            )
        except Exception as error:  # LiteLLM raises many families; all are classified
            raise provider_error(error) from error
        # model_dump_json then loads: the plain-JSON view of LiteLLM's pydantic response,
        # the same shape the direct transport returns.
        payload = json.loads(response.model_dump_json())
        if not isinstance(payload, dict):
            raise ProviderError("LiteLLM returned no chat completion", status=502)
        return Completion(payload)

    async def aclose(self) -> None:
        """LiteLLM pools its clients process-wide; there is nothing of ours to close."""
