"""Retrying provider faults: exponential back-off with jitter, honouring `Retry-After`, bounded.

A provider's 429s, 5xx answers, refused connections and timeouts are retried; every other
error is returned at once. Two bounds hold together: a number of attempts, and a time budget
measured from the first attempt that no planned wait may overrun. When a provider asks for a
longer wait than the budget has left, retrying stops at once rather than sleeping in vain.

    policy = RetryPolicy(max_attempts=3, max_elapsed=10)
    completion = await call_with_retries(lambda: transport.complete(body), policy)

Built on tenacity's `AsyncRetrying`; this module supplies the wait (back-off or the provider's
`Retry-After`) and the bounds, and turns "gave up" into `RetriesExhausted`.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from osmosis.eval.model.providers import ProviderError

if TYPE_CHECKING:
    from tenacity import RetryCallState

__all__ = ["RetriesExhausted", "RetryPolicy", "call_with_retries"]

_T = TypeVar("_T")


@dataclass(frozen=True)
class RetryPolicy:
    """How often, and for how long, a retryable provider fault is tried again.

    The n-th retry waits `initial_backoff * 2**(n-1)` seconds, capped at `max_backoff`, of
    which a `jitter` share is random (so concurrent callers spread out), unless the provider
    sent `Retry-After`, which wins. No wait may end past `max_elapsed` seconds after the first
    attempt started.

        RetryPolicy()                                    # up to 6 attempts within 60 s
        RetryPolicy(max_attempts=3, max_elapsed=10)      # the model pre-flight's
    """

    max_attempts: int = 6
    max_elapsed: float = 60.0
    initial_backoff: float = 0.5
    max_backoff: float = 20.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        problems = []
        if self.max_attempts < 1:
            problems.append(f"max_attempts must be at least 1, got {self.max_attempts}")
        if self.max_elapsed <= 0:
            problems.append(f"max_elapsed must be positive, got {self.max_elapsed}")
        if self.initial_backoff < 0 or self.max_backoff < 0:
            problems.append("back-off times must be >= 0")
        if not 0 <= self.jitter <= 1:
            problems.append(f"jitter must be between 0 and 1, got {self.jitter}")
        if problems:
            raise ValueError("; ".join(problems))

    def backoff(self, retry: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number `retry` (1 for the first retry).

        RetryPolicy(jitter=0).backoff(3)  # 2.0
        """
        if retry_after is not None:
            # The provider knows when capacity returns; a sliver of jitter keeps callers that
            # were told the same instant from arriving together.
            return retry_after + random.uniform(0, min(retry_after * 0.1, 1.0))
        base = min(self.initial_backoff * 2.0 ** max(retry - 1, 0), self.max_backoff)
        return base * (1 - self.jitter) + random.uniform(0, base * self.jitter)


class RetriesExhausted(Exception):
    """A retryable fault persisted past the policy's bounds; `last` is the final error.

    The bridge treats this as a provider outage (`osmosis.eval.model.bridge_outage`).
    """

    def __init__(self, last: ProviderError, *, attempts: int, elapsed: float) -> None:
        super().__init__(
            f"gave up after {attempts} attempt{'s' if attempts != 1 else ''} "
            f"in {elapsed:.1f} s: {last.message}"
        )
        self.last = last
        self.attempts = attempts
        self.elapsed = elapsed


def _retryable(error: BaseException) -> bool:
    return isinstance(error, ProviderError) and error.retryable


async def call_with_retries(
    call: Callable[[], Awaitable[_T]],
    policy: RetryPolicy,
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    on_retry: Callable[[ProviderError, int, float], None] | None = None,
) -> _T:
    """Await `call()` until it succeeds, fails for good, or the policy's bounds are reached.

    Non-retryable `ProviderError`s (and any other exception) propagate at once; a retryable
    fault that outlasts the policy raises `RetriesExhausted`. `on_retry(error, attempt, wait)`
    is told before each wait (for logs).

        await call_with_retries(lambda: transport.complete(body), RetryPolicy(max_attempts=2))
    """
    began = time.monotonic()
    # The first attempt runs bare: nearly every call succeeds at once, and building tenacity's
    # state for it would cost more CPU than the bridge spends on the rest of the request.
    try:
        return await call()
    except ProviderError as error:
        if not error.retryable:
            raise
        first: ProviderError | None = error
    # Imported on the first retryable fault: most runs never see one.
    from tenacity import AsyncRetrying, retry_if_exception

    async def attempt() -> _T:
        nonlocal first
        if first is not None:
            # Replays the first attempt's failure, so that tenacity plans the first retry.
            failure, first = first, None
            raise failure
        return await call()

    def stop(state: RetryCallState) -> bool:
        # Bounded by attempts, and by time counted from the first attempt: no planned wait
        # may end past the budget.
        elapsed = time.monotonic() - began
        return (
            state.attempt_number >= policy.max_attempts
            or elapsed + state.upcoming_sleep >= policy.max_elapsed
        )

    def wait(state: RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome is not None else None
        retry_after = error.retry_after if isinstance(error, ProviderError) else None
        return policy.backoff(state.attempt_number, retry_after)

    def before_sleep(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        if on_retry is not None and isinstance(error, ProviderError):
            on_retry(error, state.attempt_number, state.upcoming_sleep)

    def give_up(state: RetryCallState) -> _T:
        error = state.outcome.exception() if state.outcome is not None else None
        assert isinstance(error, ProviderError)  # only retryable ProviderErrors get here
        raise RetriesExhausted(
            error, attempts=state.attempt_number, elapsed=time.monotonic() - began
        ) from error

    retrying = AsyncRetrying(
        sleep=sleep,
        stop=stop,
        wait=wait,
        retry=retry_if_exception(_retryable),
        before_sleep=before_sleep,
        retry_error_callback=give_up,
    )
    return await retrying(attempt)
