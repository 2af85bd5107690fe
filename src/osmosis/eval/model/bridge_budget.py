"""A run's spending limits at the bridge: tokens, dollars and model calls across invocations.

    guard = BudgetGuard(Budget(max_tokens_total=100_000), earlier=Spend(tokens=40_000))
    if not guard.admit(spent):            # before a call is forwarded
        await guard.hold(rollout_id)      # the call waits until its attempt is given up
    guard.exhausted.is_set(), guard.reason  # "budget: max_tokens_total 100,000 reached (…)"

The check is made before a call is forwarded, against what every call that reached the
provider spent so far (this invocation and the run's earlier ones). Once a limit is reached,
no call is forwarded again: the refused call is *held*, not answered, and `exhausted` is set;
the host halts the run on it, which cancels the attempts in flight and leaves them pending
(resumable, never failed). Calls already forwarded finish and count, so the tokens and cost
can pass their limit by at most one call per attempt in flight; model calls never pass theirs
(they are counted as they are forwarded).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

__all__ = ["BUDGET_HALT_PREFIX", "Budget", "BudgetGuard", "Spend"]

BUDGET_HALT_PREFIX = "budget: "
"""How a halt for a budget begins: `budget: max_model_calls 40 reached (40 made)`."""


@dataclass(frozen=True)
class Budget:
    """A run's limits; None: no limit of that kind.

    Budget(max_tokens_total=200_000, max_cost_usd=5.0)
    """

    max_tokens_total: int | None = None
    """Prompt and completion tokens of every call that reached the provider."""
    max_cost_usd: float | None = None
    """USD of those calls, priced from LiteLLM's table or the run's price override."""
    max_model_calls: int | None = None
    """Calls forwarded to the provider (a call's own retries are not counted apart)."""

    @property
    def limited(self) -> bool:
        """Whether any limit is set."""
        return any(
            limit is not None
            for limit in (self.max_tokens_total, self.max_cost_usd, self.max_model_calls)
        )

    def describe(self) -> str:
        """`max_tokens_total 200,000, max_cost_usd 5`; `no budget` when none is set."""
        limits = [
            f"{name} {value:,}"
            for name, value in (
                ("max_tokens_total", self.max_tokens_total),
                ("max_model_calls", self.max_model_calls),
            )
            if value is not None
        ]
        if self.max_cost_usd is not None:
            limits.append(f"max_cost_usd {self.max_cost_usd:g}")
        return ", ".join(limits) or "no budget"


@dataclass(frozen=True)
class Spend:
    """What a run spent at the provider: `Spend(calls=12, tokens=3400, cost_usd=0.0021)`."""

    calls: int = 0
    tokens: int = 0
    cost_usd: float = 0.0

    def __add__(self, other: Spend) -> Spend:
        return Spend(
            calls=self.calls + other.calls,
            tokens=self.tokens + other.tokens,
            cost_usd=self.cost_usd + other.cost_usd,
        )


class BudgetGuard:
    """Admits or holds each call against a `Budget`; the bridge's event loop is its only user."""

    def __init__(self, budget: Budget, earlier: Spend = Spend()) -> None:
        self.budget = budget
        self.earlier = earlier
        """What the run's earlier invocations spent (their metrics.json)."""
        self.exhausted = asyncio.Event()
        """Set once a call was refused because a limit is reached: halt the run."""
        self.reason: str | None = None
        """`budget: <limit> <value> reached (<used>)` once `exhausted` is set."""
        self._held: dict[str, set[asyncio.Future[None]]] = {}

    def admit(self, spent: Spend) -> bool:
        """True when a call may be forwarded, given what this invocation `spent` so far
        (`spent.calls` excludes the call asking). False sets `exhausted` and `reason`."""
        if self.reason is not None:
            return False
        total = self.earlier + spent
        budget = self.budget
        if budget.max_model_calls is not None and total.calls >= budget.max_model_calls:
            self._exhaust(
                f"max_model_calls {budget.max_model_calls:,} reached ({total.calls:,} made)"
            )
        elif budget.max_tokens_total is not None and total.tokens >= budget.max_tokens_total:
            self._exhaust(
                f"max_tokens_total {budget.max_tokens_total:,} reached ({total.tokens:,} used)"
            )
        elif budget.max_cost_usd is not None and total.cost_usd >= budget.max_cost_usd:
            self._exhaust(
                f"max_cost_usd {budget.max_cost_usd:g} reached (${total.cost_usd:.6f} spent)"
            )
        return self.reason is None

    def _exhaust(self, what: str) -> None:
        self.reason = BUDGET_HALT_PREFIX + what
        self.exhausted.set()

    async def hold(self, rollout_id: str) -> None:
        """Wait until `release(rollout_id)` (its attempt was given up) or `release_all`."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._held.setdefault(rollout_id, set()).add(future)
        try:
            await future
        finally:
            held = self._held.get(rollout_id)
            if held is not None:
                held.discard(future)
                if not held:
                    del self._held[rollout_id]

    def release(self, rollout_id: str) -> None:
        """Let the calls held for `rollout_id` go (the bridge answers them 503)."""
        for future in self._held.get(rollout_id, ()):
            if not future.done():
                future.set_result(None)

    def release_all(self) -> None:
        """Let every held call go (the bridge is stopping)."""
        for rollout_id in list(self._held):
            self.release(rollout_id)
