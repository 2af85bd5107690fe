"""The budget guard: which call is admitted, what the halt reason says, and that a held call
waits until its attempt is given up (issue 28)."""

from __future__ import annotations

import asyncio

import pytest

from osmosis.eval.model.bridge_budget import BUDGET_HALT_PREFIX, Budget, BudgetGuard, Spend


@pytest.mark.parametrize(
    ("budget", "spent", "admitted", "reason"),
    [
        (Budget(), Spend(calls=10**6, tokens=10**9, cost_usd=10**6), True, None),
        (Budget(max_tokens_total=1000), Spend(tokens=999), True, None),
        (
            Budget(max_tokens_total=1000),
            Spend(tokens=1024),
            False,
            "max_tokens_total 1,000 reached (1,024 used)",
        ),
        (Budget(max_model_calls=3), Spend(calls=2), True, None),
        (Budget(max_model_calls=3), Spend(calls=3), False, "max_model_calls 3 reached (3 made)"),
        (
            Budget(max_cost_usd=0.5),
            Spend(cost_usd=0.51),
            False,
            "max_cost_usd 0.5 reached ($0.510000 spent)",
        ),
    ],
)
def test_a_call_is_admitted_until_a_limit_is_reached(
    budget: Budget, spent: Spend, admitted: bool, reason: str | None
) -> None:
    guard = BudgetGuard(budget)
    assert guard.admit(spent) is admitted
    assert guard.exhausted.is_set() is (not admitted)
    assert guard.reason == (None if reason is None else BUDGET_HALT_PREFIX + reason)


def test_earlier_invocations_count_and_once_refused_always_refused() -> None:
    guard = BudgetGuard(Budget(max_tokens_total=100), earlier=Spend(tokens=60))
    assert guard.admit(Spend(tokens=39))
    assert not guard.admit(Spend(tokens=40))
    assert guard.reason == "budget: max_tokens_total 100 reached (100 used)"
    assert not guard.admit(Spend())  # the run halts: nothing more is forwarded


def test_budget_limited() -> None:
    assert not Budget().limited
    assert Budget(max_cost_usd=1.0).limited


async def test_a_held_call_waits_until_its_rollout_is_released() -> None:
    guard = BudgetGuard(Budget(max_model_calls=1))
    assert not guard.admit(Spend(calls=1))
    held = asyncio.ensure_future(guard.hold("r1"))
    other = asyncio.ensure_future(guard.hold("r2"))
    await asyncio.sleep(0.01)
    assert not held.done()
    guard.release("r1")
    await asyncio.wait_for(held, 1)
    assert not other.done()
    guard.release_all()
    await asyncio.wait_for(other, 1)
    guard.release("r1")  # nothing held any more: a no-op


@pytest.mark.parametrize(
    ("budget", "shown"),
    [
        (Budget(), "no budget"),
        (
            Budget(max_tokens_total=200_000, max_cost_usd=5.0, max_model_calls=40),
            "max_tokens_total 200,000, max_model_calls 40, max_cost_usd 5",
        ),
    ],
)
def test_a_budget_describes_its_limits(budget: Budget, shown: str) -> None:
    assert budget.describe() == shown
