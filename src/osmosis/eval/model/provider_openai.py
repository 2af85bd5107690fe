"""The direct transport: OpenAI-wire chat completions over pooled keep-alive connections.

The bridge's fast path. It posts the request body as given to `{api_base}/chat/completions`
and hands back the provider's JSON unchanged, so a local vLLM, llama.cpp or osmosis-served
model is called with no translation and about a millisecond of CPU per call (LiteLLM spends
~12 ms).

    transport = OpenAIWireTransport(target)
    completion = await transport.complete({"model": "qwen3", "messages": messages})
    await transport.aclose()

It speaks through `osmosis.rollout.http1`'s lean client (aiohttp's request path was ~16 % of
the engine's event-loop samples at zero model latency), and through aiohttp only where a
proxy from the environment applies to the provider: the lean client has no proxy support.
"""

from __future__ import annotations

import email.utils
import json
import time
import urllib.request
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pydantic_core

from osmosis.eval.model.providers import Completion, ModelTarget, ProviderError
from osmosis.loopback import is_loopback_url
from osmosis.rollout import jsonbytes
from osmosis.rollout.http1 import ConnectFailed, Http1Client, TransportFailed, encode_headers

if TYPE_CHECKING:
    import aiohttp

__all__ = ["OpenAIWireTransport", "error_from_response", "retry_after_seconds"]

_CONNECT_TIMEOUT = 10.0
_KEEPALIVE = 30.0


def retry_after_seconds(headers: Mapping[str, str] | None) -> float | None:
    """The delay a provider asked for: `retry-after-ms` (OpenAI's, precise) or `Retry-After`
    (seconds or an HTTP date); None when it did not say.

        retry_after_seconds({"retry-after": "2"})  # 2.0
    """
    if not headers:
        return None
    milliseconds = headers.get("retry-after-ms")
    if milliseconds:
        try:
            return max(float(milliseconds) / 1000, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def _error_fields(body: bytes) -> tuple[str | None, str | None]:
    """The message and code of an OpenAI-shaped error body, if it is one."""
    try:
        decoded = json.loads(body)
    except ValueError:
        return None, None
    error = decoded.get("error") if isinstance(decoded, dict) else None
    if isinstance(error, dict):
        message, code = error.get("message"), error.get("code")
        return (
            message if isinstance(message, str) else None,
            code if isinstance(code, str) else None,
        )
    if isinstance(error, str):  # some servers (vLLM, Ollama) answer {"error": "text"}
        return error, None
    detail = decoded.get("detail") if isinstance(decoded, dict) else None
    return (detail if isinstance(detail, str) else None), None


def error_from_response(
    status: int, body: bytes, headers: Mapping[str, str] | None = None
) -> ProviderError:
    """A `ProviderError` for an error answer, with the provider's own message when it gave one."""
    message, code = _error_fields(body)
    if message is None:
        text = body[:300].decode("utf-8", "replace").strip()
        message = text or f"the provider answered HTTP {status}"
    return ProviderError(
        message, status=status, retry_after=retry_after_seconds(headers), code=code
    )


class OpenAIWireTransport:
    """Posts chat completions to an OpenAI-compatible endpoint over keep-alive connections.

    OpenAIWireTransport(ModelTarget(kind="openai-compatible", model="m", api_base=url))

    Why aiohttp rather than httpx (the project's usual client): at the engine's concurrency
    httpx's connection pool collapses. Against the fake model with 64 calls in flight, one
    httpx 0.28 client made ~55 calls/s and aiohttp ~890 (`bench/bridge.py`); LiteLLM already
    depends on aiohttp, so it costs no new install.
    """

    def __init__(self, target: ModelTarget) -> None:
        if target.api_base is None:
            raise ValueError("the direct transport needs target.api_base")
        self._base = target.api_base.rstrip("/")
        self._url = self._base + "/chat/completions"
        headers = {"content-type": "application/json", "accept": "application/json"}
        if target.api_key:
            headers["authorization"] = f"Bearer {target.api_key}"
        self._headers = headers
        self._total_timeout = target.timeout
        # Proxy variables are for reaching the internet; a loopback server is reached directly.
        self._trust_env = not is_loopback_url(self._base)
        self._session: aiohttp.ClientSession | None = None
        # The lean client, unless a proxy applies; made on first use, like the session.
        self._direct = not (self._trust_env and _proxied(self._base))
        self._lean: Http1Client | None = None
        self._lean_headers = encode_headers(headers)

    def _client(self) -> aiohttp.ClientSession:
        # Made on first use: aiohttp wants its session created inside the running loop. And
        # imported only then: its import (~0.15 s, CA certificates loaded) is a quarter of a
        # short run's start, and only a provider behind a proxy needs it.
        import aiohttp

        session = self._session
        if session is None or session.closed:
            connector = aiohttp.TCPConnector(
                # The engine bounds concurrency; the pool must not add a second, lower bound,
                # and every connection it opens is kept for the next call.
                limit=0,
                keepalive_timeout=_KEEPALIVE,
            )
            session = aiohttp.ClientSession(
                connector=connector,
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(
                    total=self._total_timeout,
                    sock_connect=min(_CONNECT_TIMEOUT, self._total_timeout),
                ),
                trust_env=self._trust_env,
                auto_decompress=True,
            )
            self._session = session
        return session

    async def complete(self, body: Mapping[str, Any]) -> Completion:
        """Send one chat completion; raises `ProviderError` on any failure."""
        content = jsonbytes.dumps(body)  # a sixth of json.dumps's time; UTF-8, not \u escapes
        if self._direct:
            if self._lean is None:
                self._lean = Http1Client(
                    self._base, connect_timeout=min(_CONNECT_TIMEOUT, self._total_timeout)
                )
            status, raw, headers = await self._post_lean(self._lean, content)
        else:
            status, raw, headers = await self._post_aiohttp(content)
        if status >= 400:
            raise error_from_response(status, raw, headers)
        payload = _parsed(raw)
        if not isinstance(payload, dict) or not isinstance(payload.get("choices"), list):
            # A 2xx that is not a completion comes from something in between (a proxy, a
            # wrong URL serving HTML): a bad gateway, worth another try.
            raise ProviderError(
                f"{self._url} answered HTTP {status} with no chat completion", status=502
            )
        return Completion(payload, raw)

    async def _post_lean(
        self, client: Http1Client, content: bytes
    ) -> tuple[int, bytes, Mapping[str, str]]:
        try:
            reply = await client.request(
                "POST",
                "/chat/completions",
                body=content,
                headers=self._lean_headers,
                timeout=self._total_timeout,
            )
        except TimeoutError as error:
            raise ProviderError(
                f"{self._base} did not answer in time ({type(error).__name__})", cause="timeout"
            ) from error
        except (ConnectFailed, TransportFailed) as error:
            # Refused, reset, or a kept-alive connection the server had closed: all worth
            # another try on a fresh connection.
            detail = str(error) or type(error).__name__
            raise ProviderError(
                f"cannot connect to {self._base}: {detail}", cause="connection"
            ) from error
        return reply.status, reply.body, reply.headers

    async def _post_aiohttp(self, content: bytes) -> tuple[int, bytes, Mapping[str, str]]:
        import aiohttp  # imported by `_client` already

        try:
            async with self._client().post(self._url, data=content) as response:
                raw = await response.read()
                status = response.status
                headers = response.headers
        except TimeoutError as error:  # aiohttp's timeouts subclass it
            raise ProviderError(
                f"{self._base} did not answer in time ({type(error).__name__})", cause="timeout"
            ) from error
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as error:
            # Refused, reset, or a kept-alive connection the server had closed: all worth
            # another try on a fresh connection.
            detail = str(error) or type(error).__name__
            raise ProviderError(
                f"cannot connect to {self._base}: {detail}", cause="connection"
            ) from error
        except aiohttp.ClientError as error:  # e.g. an invalid URL: trying again cannot help
            raise ProviderError(
                f"cannot call {self._url}: {error or type(error).__name__}", cause="unknown"
            ) from error
        return status, raw, headers

    async def aclose(self) -> None:
        """Close the pooled connections."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()
        lean, self._lean = self._lean, None
        if lean is not None:
            await lean.aclose()


def _parsed(raw: bytes) -> Any:
    """The answer's JSON; None when it is not JSON."""
    try:
        return pydantic_core.from_json(raw)  # a third of json.loads's time
    except ValueError:
        pass
    try:  # what pydantic_core refuses and json takes: an escaped lone surrogate in a text
        return json.loads(raw)
    except ValueError:
        return None


def _proxied(url: str) -> bool:
    """Whether the environment's proxy settings (`HTTPS_PROXY`, `NO_PROXY`...) apply to `url`,
    as aiohttp's `trust_env` reads them."""
    parts = urlsplit(url)
    return parts.scheme in urllib.request.getproxies() and not urllib.request.proxy_bypass(
        parts.hostname or ""
    )
