"""The bridge with a budget, over real HTTP in front of the scripted model (issue 28): calls
are forwarded until a limit is reached; the next is held, not answered, until its attempt is
given up, and nothing of it reaches the provider or any record."""

from __future__ import annotations

import asyncio

from osmosis.eval.model.bridge import Budget, ModelBridge, Spend
from osmosis.eval.model.pricing import Price
from osmosis.testing import FakeModelServer
from tests.integration.test_bridge import QUESTION, bridged, openai_target, post


async def test_the_call_past_the_limit_is_held_until_its_rollout_is_forgotten() -> None:
    async with (
        FakeModelServer() as fake,
        bridged(fake, budget=Budget(max_model_calls=2)) as bridge,
    ):
        for _ in range(2):
            assert (await post(bridge, {"messages": QUESTION})).status_code == 200
        held = asyncio.ensure_future(post(bridge, {"messages": QUESTION}, rollout_id="r2"))
        await asyncio.wait_for(bridge.budget_exhausted.wait(), 5)
        assert bridge.budget_reason == "budget: max_model_calls 2 reached (2 made)"
        await asyncio.sleep(0.1)
        assert not held.done()  # no answer a rollout could fail on
        bridge.forget("r2")  # the engine halted and gave the attempt up
        response = await asyncio.wait_for(held, 5)
    assert response.status_code == 503
    assert len(fake.requests) == 2
    assert bridge.take_calls("r2") == []
    assert bridge.spent().calls == 2


async def test_tokens_and_cost_count_every_answer_and_earlier_invocations() -> None:
    price = Price(input_per_token=1.0, output_per_token=1.0)  # a model in no price table
    async with FakeModelServer() as fake, bridged(fake, price=price) as bridge:
        assert (await post(bridge, {"messages": QUESTION})).status_code == 200
        one_call = bridge.spent()
    assert one_call.calls == 1 and one_call.tokens > 0
    assert one_call.cost_usd == one_call.tokens

    earlier = Spend(calls=1, tokens=one_call.tokens, cost_usd=one_call.cost_usd)
    budget = Budget(max_tokens_total=one_call.tokens + 1)
    async with (
        FakeModelServer() as fake,
        bridged(fake, budget=budget, spent_before=earlier, price=price) as bridge,
    ):
        assert not bridge.budget_exhausted.is_set()
        assert (await post(bridge, {"messages": QUESTION})).status_code == 200
        held = asyncio.ensure_future(post(bridge, {"messages": QUESTION}))
        await asyncio.wait_for(bridge.budget_exhausted.wait(), 5)
        assert bridge.budget_reason is not None
        assert bridge.budget_reason.startswith("budget: max_tokens_total")
        bridge.forget("r1")
        assert (await asyncio.wait_for(held, 5)).status_code == 503
    assert len(fake.requests) == 1


async def test_a_budget_spent_by_earlier_invocations_is_exhausted_at_start() -> None:
    async with FakeModelServer() as fake:
        bridge = ModelBridge(
            target=openai_target(fake),
            budget=Budget(max_cost_usd=1.0),
            spent_before=Spend(cost_usd=1.5),
            price=Price(input_per_token=1.0, output_per_token=1.0),
        )
        async with bridge:
            assert bridge.budget_exhausted.is_set()
            assert bridge.budget_reason == "budget: max_cost_usd 1 reached ($1.500000 spent)"
