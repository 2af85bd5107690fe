"""The retry policy: what is retried, how long it waits, and when it gives up."""

from __future__ import annotations

from collections.abc import Awaitable

import pytest

from osmosis.eval.model.providers import ProviderError
from osmosis.eval.model.retry import RetriesExhausted, RetryPolicy, call_with_retries


class Script:
    """A call that raises the given errors in turn, then returns "ok"; and a fake clock."""

    def __init__(self, *errors: ProviderError) -> None:
        self.errors = list(errors)
        self.calls = 0
        self.waits: list[float] = []

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)

    def run(self, policy: RetryPolicy) -> Awaitable[str]:
        return call_with_retries(self, policy, sleep=self.sleep)


def status(code: int, retry_after: float | None = None) -> ProviderError:
    return ProviderError(f"HTTP {code}", status=code, retry_after=retry_after)


NO_JITTER = RetryPolicy(jitter=0, initial_backoff=0.5, max_backoff=4)


async def test_retryable_faults_are_retried_until_success() -> None:
    script = Script(status(429), status(503), ProviderError("refused", cause="connection"))
    assert await script.run(NO_JITTER) == "ok"
    assert script.calls == 4
    assert script.waits == [0.5, 1.0, 2.0]


async def test_back_off_is_capped() -> None:
    script = Script(*[status(500)] * 5)
    await script.run(RetryPolicy(jitter=0, initial_backoff=1, max_backoff=3, max_elapsed=600))
    assert script.waits == [1, 2, 3, 3, 3]


async def test_jitter_spreads_waits_within_the_back_off() -> None:
    script = Script(*[status(500)] * 5)
    await script.run(RetryPolicy(jitter=0.5, initial_backoff=2, max_backoff=2, max_elapsed=600))
    assert all(1.0 <= wait <= 2.0 for wait in script.waits)


async def test_retry_after_wins_over_the_back_off() -> None:
    script = Script(status(429, retry_after=7))
    await script.run(NO_JITTER)
    assert 7 <= script.waits[0] <= 7.7  # a sliver of jitter on top


@pytest.mark.parametrize("code", [400, 401, 403, 404, 422])
async def test_non_retryable_errors_propagate_at_once(code: int) -> None:
    script = Script(status(code))
    with pytest.raises(ProviderError) as caught:
        await script.run(NO_JITTER)
    assert caught.value.status == code
    assert (script.calls, script.waits) == (1, [])


async def test_other_exceptions_propagate_at_once() -> None:
    async def broken() -> str:
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError):
        await call_with_retries(broken, NO_JITTER)


async def test_attempts_are_bounded() -> None:
    script = Script(*[status(500)] * 10)
    with pytest.raises(RetriesExhausted) as caught:
        await script.run(RetryPolicy(max_attempts=3, initial_backoff=0))
    assert (script.calls, caught.value.attempts, caught.value.last.status) == (3, 3, 500)
    assert "3 attempts" in str(caught.value)


async def test_a_wait_that_would_overrun_the_time_budget_is_not_taken() -> None:
    script = Script(status(429, retry_after=30))
    with pytest.raises(RetriesExhausted) as caught:
        await script.run(RetryPolicy(max_elapsed=10))
    assert (script.calls, script.waits, caught.value.attempts) == (1, [], 1)


async def test_on_retry_hears_each_wait() -> None:
    heard: list[tuple[int | None, int, float]] = []

    def on_retry(error: ProviderError, attempt: int, wait: float) -> None:
        heard.append((error.status, attempt, wait))

    script = Script(status(429), status(500))
    await call_with_retries(script, NO_JITTER, sleep=script.sleep, on_retry=on_retry)
    assert heard == [(429, 1, 0.5), (500, 2, 1.0)]


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_elapsed": 0}, "max_elapsed"),
        ({"initial_backoff": -1}, "back-off"),
        ({"jitter": 2}, "jitter"),
    ],
)
def test_invalid_policies_are_refused(options: dict[str, float], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        RetryPolicy(**options)  # type: ignore[arg-type]
