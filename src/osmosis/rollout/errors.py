"""Map an exception raised by user code to the protocol's error category."""

from __future__ import annotations

from osmosis.rollout.types import ErrorCategory

# Provider answers that mean "the policy endpoint refused", not "the agent is wrong".
_HTTP_STATUSES = {401, 402, 403, 429}


def categorize_exception(exc: BaseException) -> ErrorCategory:
    """`TimeoutError` → timeout; ValueError/TypeError/AssertionError → validation_error;
    provider HTTP 401/402/403/429/5xx → http_error; anything else → agent_error."""
    if isinstance(exc, TimeoutError):
        return ErrorCategory.TIMEOUT
    status = _status_code(exc)
    if status is not None and (status in _HTTP_STATUSES or status >= 500):
        return ErrorCategory.HTTP_ERROR
    if isinstance(exc, (ValueError, TypeError, AssertionError)):
        return ErrorCategory.VALIDATION_ERROR
    return ErrorCategory.AGENT_ERROR


def _status_code(exc: BaseException) -> int | None:
    # Duck-typed so no client library is imported: openai's APIStatusError and our
    # PolicyError carry .status_code; httpx.HTTPStatusError carries .response.status_code.
    status = getattr(exc, "status_code", None)
    if status is None:
        status = getattr(getattr(exc, "response", None), "status_code", None)
    return status if isinstance(status, int) else None
