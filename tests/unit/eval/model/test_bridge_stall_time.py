"""`ProviderWatch.stall_time`: how long a rollout's calls waited inside a stall that a silent
probe confirmed. The engine uses it for attempts whose calls were answered once the stall
ended, too late for their deadline: those are the provider's, not a `timeout`."""

from __future__ import annotations

import asyncio
import time

from osmosis.eval.model.bridge_outage import OutagePolicy, ProviderWatch

POLICY = OutagePolicy(stall_after_s=30, probe_timeout_s=0.05)


class Provider:
    """A provider whose every call, probes included, waits until it answers again."""

    def __init__(self) -> None:
        self.answering = asyncio.Event()
        self.answering.set()

    async def call(self) -> str:
        await self.answering.wait()
        return "ok"


async def test_a_call_sent_during_a_confirmed_stall_counts_the_time_until_the_stall_ended() -> None:
    provider = Provider()
    watch = ProviderWatch(POLICY, probe=provider.call)
    provider.answering.clear()
    first = watch.enter("first")
    first_call = asyncio.create_task(watch.through(first, provider.call()))
    await asyncio.sleep(0.1)
    assert await watch.stalled("first")  # the probe got no answer: a stall, confirmed
    late = watch.enter("late")
    sent = time.monotonic()
    late_call = asyncio.create_task(watch.through(late, provider.call()))
    await asyncio.sleep(0.2)
    assert 0.2 <= watch.stall_time("late") <= time.monotonic() - sent  # waiting: so far
    provider.answering.set()  # the stall ends: both calls are answered
    ended = time.monotonic() - sent
    await asyncio.gather(first_call, late_call)
    watch.leave(first)
    watch.leave(late)
    kept = watch.stall_time("late")
    assert 0.2 <= kept <= ended + 0.05  # kept once answered
    await asyncio.sleep(0.05)
    assert watch.stall_time("late") == kept  # and no longer growing
    assert watch.stall_time("first") > watch.stall_time("late")  # it waited longer in it
    after = watch.enter("after")
    await watch.through(after, provider.call())
    assert watch.stall_time("after") == 0.0  # sent once the stall was over
    watch.release("late")
    assert watch.stall_time("late") == 0.0  # forgotten with the rollout


async def test_a_slow_call_whose_probe_is_answered_counts_no_stall() -> None:
    provider = Provider()
    watch = ProviderWatch(POLICY, probe=provider.call)
    slow_answer = asyncio.Event()
    slow = watch.enter("slow")

    async def long_generation() -> str:
        await slow_answer.wait()
        return "ok"

    slow_call = asyncio.create_task(watch.through(slow, long_generation()))
    await asyncio.sleep(0.1)
    assert not await watch.stalled("slow")  # the probe is answered: slow, not a stall
    slow_answer.set()
    await slow_call
    assert watch.stall_time("slow") == 0.0


async def test_an_unconfirmed_silence_counts_no_stall() -> None:
    # No verdict, no probe: a silence nobody confirmed is not charged to the provider.
    provider = Provider()
    watch = ProviderWatch(POLICY, probe=provider.call)
    provider.answering.clear()
    call = watch.enter("quiet")
    pending = asyncio.create_task(watch.through(call, provider.call()))
    await asyncio.sleep(0.1)
    provider.answering.set()
    await pending
    assert watch.stall_time("quiet") == 0.0
