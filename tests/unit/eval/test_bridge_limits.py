"""The bridge's adaptive (AIMD) limit on provider calls in flight, driven directly: what grows
it, what cuts it, who gets the next free slot, and which bridges share one.

End to end against a rate-limited scripted model: tests/integration/test_bridge_limits.py."""

from __future__ import annotations

import asyncio

import pytest

from osmosis.eval.model.bridge_limits import (
    DECREASE,
    INITIAL_LIMIT,
    AdaptiveLimit,
    limit_key,
    shared_limit,
)
from osmosis.eval.model.providers import ModelTarget, ProviderError

KEY = ("openai-compatible", "http://127.0.0.1:1/v1", "m", "")


async def ok() -> str:
    return "answer"


async def throttled() -> str:
    raise ProviderError("rate limited", status=429)


async def refused() -> str:
    raise ProviderError("bad request", status=400)


def test_a_named_max_in_flight_is_the_limit_until_the_provider_refuses() -> None:
    assert AdaptiveLimit(KEY, ceiling=64).limit == 64
    unnamed = AdaptiveLimit(KEY)  # nobody said what the provider takes: slow start
    assert unnamed.limit == INITIAL_LIMIT
    unnamed.raise_ceiling(48)  # a run naming its max_in_flight joins before any refusal
    assert unnamed.limit == 48


async def test_successes_grow_the_limit_only_while_every_slot_is_taken() -> None:
    limit = AdaptiveLimit(KEY)  # no max_in_flight named: it starts low and grows
    for _ in range(20):  # one call at a time: the limit is never what holds calls back
        await limit.call(ok, owner="run")
    assert limit.limit == INITIAL_LIMIT

    gate = asyncio.Event()

    async def held() -> str:
        await gate.wait()
        return "answer"

    calls = [asyncio.create_task(limit.call(held, owner="run")) for _ in range(30)]
    await asyncio.sleep(0)
    assert limit.in_flight == INITIAL_LIMIT  # the rest wait for a slot
    gate.set()
    await asyncio.gather(*calls)
    assert limit.limit > INITIAL_LIMIT  # slow start: one more per answer while binding
    assert limit.in_flight == 0


async def test_a_burst_of_429s_cuts_the_limit_once_and_never_below_one() -> None:
    limit = AdaptiveLimit(KEY, ceiling=64)
    gate = asyncio.Event()

    async def held_then_429() -> str:
        await gate.wait()
        raise ProviderError("rate limited", status=429)

    burst = [asyncio.create_task(limit.call(held_then_429, owner="run")) for _ in range(8)]
    await asyncio.sleep(0)
    gate.set()
    results = await asyncio.gather(*burst, return_exceptions=True)
    assert all(isinstance(r, ProviderError) for r in results)
    # Eight 429s to calls sent together are one signal: one cut.
    assert limit.limit == int(INITIAL_LIMIT * DECREASE)
    assert limit.throttled == 8
    for _ in range(40):  # sent one after another, each after the last cut
        with pytest.raises(ProviderError):
            await limit.call(throttled, owner="run")
    assert limit.limit == 1

    with pytest.raises(ProviderError):  # another error says nothing about the rate
        await limit.call(refused, owner="run")
    assert limit.throttled == 48 and limit.in_flight == 0


async def test_the_limit_never_grows_past_the_ceiling() -> None:
    limit = AdaptiveLimit(KEY, ceiling=3)
    assert limit.limit == 3
    calls = [asyncio.create_task(limit.call(ok, owner="run")) for _ in range(50)]
    await asyncio.gather(*calls)
    assert limit.limit == 3
    with pytest.raises(ValueError, match="max_in_flight must be at least 1, got 0"):
        AdaptiveLimit(KEY, ceiling=0)


async def test_free_slots_go_to_owners_in_turn_whoever_queued_first() -> None:
    limit = AdaptiveLimit(KEY, ceiling=1)  # one call at a time: the order is the turn order
    order: list[str] = []
    gate = asyncio.Event()

    def call(owner: str) -> asyncio.Task[str]:
        async def attempt() -> str:
            await gate.wait()
            order.append(owner)
            return owner

        return asyncio.create_task(limit.call(attempt, owner=owner))

    first = [call("first") for _ in range(4)]  # takes the slot, then queues three
    await asyncio.sleep(0)
    second = [call("second") for _ in range(3)]
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(*first, *second)
    assert order == ["first", "first", "second", "first", "second", "first", "second"]


async def test_a_waiter_cancelled_gives_its_place_and_its_slot_back() -> None:
    limit = AdaptiveLimit(KEY, ceiling=1)
    gate = asyncio.Event()

    async def held() -> str:
        await gate.wait()
        return "answer"

    running = asyncio.create_task(limit.call(held, owner="a"))
    waiting = asyncio.create_task(limit.call(ok, owner="b"))
    await asyncio.sleep(0)
    waiting.cancel()  # the engine forgot its rollout
    with pytest.raises(asyncio.CancelledError):
        await waiting
    gate.set()
    assert await running == "answer"
    assert limit.in_flight == 0
    assert await limit.call(ok, owner="c") == "answer"  # no slot was lost


def test_one_limit_per_provider_key_shared_by_every_bridge_of_the_process() -> None:
    def target(key: str, model: str = "m") -> ModelTarget:
        return ModelTarget(
            kind="openai-compatible", model=model, api_base="http://127.0.0.1:9/v1", api_key=key
        )

    key = limit_key(target("sk-one"))
    assert "sk-one" not in repr(key)  # only a hash of the key
    assert shared_limit(key) is shared_limit(limit_key(target("sk-one")), ceiling=4)
    assert shared_limit(key) is not shared_limit(limit_key(target("sk-two")))
    assert shared_limit(key) is not shared_limit(limit_key(target("sk-one", model="other")))
    assert shared_limit(key, ceiling=512).ceiling == 512  # a larger max_in_flight raises it


async def test_a_429_cuts_from_the_calls_really_in_flight_not_from_an_unreached_limit() -> None:
    limit = AdaptiveLimit(KEY, ceiling=64)
    gate = asyncio.Event()

    async def held_then_429() -> str:
        await gate.wait()
        raise ProviderError("rate limited", status=429)

    # Three calls in flight under a limit of 8: the provider takes fewer than three.
    calls = [asyncio.create_task(limit.call(held_then_429, owner="run")) for _ in range(3)]
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(*calls, return_exceptions=True)
    assert limit.limit == int(3 * DECREASE)


async def test_an_attempt_under_way_is_served_before_new_attempts_start() -> None:
    limit = AdaptiveLimit(KEY, ceiling=1)
    order: list[str] = []
    gate = asyncio.Event()

    def call(name: str, began: float) -> asyncio.Task[None]:
        async def attempt() -> None:
            await gate.wait()
            order.append(name)

        return asyncio.create_task(limit.call(attempt, owner="run", priority=began))

    calls = [call("new 1", 5.0), call("new 2", 6.0), call("old, its second call", 1.0)]
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(*calls)
    # "new 1" took the free slot at once; then the oldest attempt, though it came last.
    assert order == ["new 1", "old, its second call", "new 2"]


async def test_the_slot_of_a_429_stays_taken_for_the_retry_after_asked() -> None:
    limit = AdaptiveLimit(KEY, ceiling=2)

    async def throttled_for_a_while() -> str:
        raise ProviderError("rate limited", status=429, retry_after=0.3)

    with pytest.raises(ProviderError):
        await limit.call(throttled_for_a_while, owner="run")
    assert limit.limit == 1  # cut from 1 in flight
    began = asyncio.get_running_loop().time()
    # Not handed on at once to a waiting call, which would meet the same refusal.
    assert await limit.call(ok, owner="run") == "answer"
    assert asyncio.get_running_loop().time() - began >= 0.25
    assert limit.in_flight == 0
