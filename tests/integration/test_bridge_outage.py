"""Provider outages at the bridge: declared on a stall, on timeouts in a row or on exhausted
retries; new calls refused at once; stuck calls released when the engine forgets them; and the
end noticed by the bridge's own probe, never by a stuck call that finally returns.

The stall is real: `osmosis dev fake-model` runs in its own process and is SIGSTOPped while
calls wait on it. The other cases script the in-process fake model.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from osmosis.eval.model.bridge import ModelBridge, OutagePolicy
from osmosis.eval.model.providers import ModelTarget
from osmosis.eval.model.retry import RetryPolicy
from osmosis.testing import Fail, FakeModelServer, Rule
from osmosis.testing.script import ChatRequest
from tests.integration.test_rollout_process import eventually

QUESTION = [{"role": "user", "content": "What is 17 * 23?"}]
FAST_RETRY = RetryPolicy(max_attempts=4, max_elapsed=5, initial_backoff=0.01, max_backoff=0.05)
QUICK = OutagePolicy(stall_after_s=2, probe_timeout_s=1.5, probe_first_s=0.1, probe_max_s=0.5)
PLAIN: dict[str, Any] = {"trust_env": False, "verify": False}
COMMAND = [sys.executable, "-c", "from osmosis.cli.main import run; run()"]


def target_for(base_url: str, *, timeout: float = 600.0) -> ModelTarget:
    return ModelTarget(
        kind="openai-compatible", model="fake-model", api_base=base_url, timeout=timeout
    )


async def chat(
    client: httpx.AsyncClient, bridge: ModelBridge, rollout_id: str, text: str = ""
) -> httpx.Response:
    messages = [{"role": "user", "content": text}] if text else QUESTION
    return await client.post(
        bridge.open_rollout(rollout_id) + "/chat/completions",
        json={"messages": messages},
        headers={"authorization": f"Bearer {bridge.token}"},
    )


def is_probe(request: ChatRequest) -> bool:
    return request.body.get("max_tokens") == 1


def received(fake: FakeModelServer, text: str) -> bool:
    """Whether the scripted model has been sent a call whose last user message is `text`."""
    return any(request.last_user_text == text for request in fake.requests)


@pytest.fixture
def model_process() -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`osmosis dev fake-model` in its own process, answering after 0.5 s."""
    process = subprocess.Popen(
        [*COMMAND, "dev", "fake-model", "--port", "0", "--latency", "0.5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        yield process, process.stdout.readline().strip()
    finally:
        process.send_signal(signal.SIGCONT)  # a stopped process cannot act on SIGKILL's exit
        process.kill()
        process.communicate(timeout=10)


@pytest.mark.slow
async def test_a_sigstopped_provider_is_declared_down_and_its_return_found_by_the_probe(
    model_process: tuple[subprocess.Popen[str], str],
) -> None:
    process, base_url = model_process
    assert base_url.startswith("http://127.0.0.1:")
    bridge = ModelBridge(target=target_for(base_url), retry=FAST_RETRY, outage_policy=QUICK)
    async with bridge, httpx.AsyncClient(timeout=60, **PLAIN) as client:
        assert (await chat(client, bridge, "warm-up")).status_code == 200
        sent = time.monotonic()
        calls = {rid: asyncio.create_task(chat(client, bridge, rid)) for rid in ("r1", "r2", "r3")}
        await asyncio.sleep(0.2)  # inside the model's 0.5 s latency: all three are waiting
        process.send_signal(signal.SIGSTOP)

        await asyncio.wait_for(bridge.outage.wait(), timeout=15)
        declared_after = time.monotonic() - sent
        # Not before the quiet window, and within it plus the confirming probe (and slack).
        assert QUICK.stall_after_s <= declared_after <= QUICK.stall_after_s + 1.5 + 3
        assert bridge.outage_reason is not None
        assert "stopped answering: 3 calls waiting" in bridge.outage_reason
        assert bridge.stuck_rollouts() == {"r1", "r2", "r3"}
        assert not any(call.done() for call in calls.values())

        # While declared, a new call is refused at once rather than joining the queue.
        began = time.monotonic()
        refused = await chat(client, bridge, "r4")
        assert time.monotonic() - began < 1
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "provider_unavailable"

        # The provider is still stopped: the outage holds for as long as asked, then False.
        began = time.monotonic()
        assert await bridge.wait_recovered(0.5) is False
        assert time.monotonic() - began >= 0.45

        # The engine gives r1 up: its stuck call is released, and nothing is kept for it.
        bridge.forget("r1")
        released = await asyncio.wait_for(calls["r1"], timeout=5)
        assert released.status_code == 503
        assert released.json()["error"]["code"] == "provider_unavailable"
        assert bridge.take_calls("r1") == []
        assert bridge.stuck_rollouts() == {"r2", "r3"}

        process.send_signal(signal.SIGCONT)
        assert await bridge.wait_recovered(15) is True  # no clear_outage(): the probe did it
        assert not bridge.outage.is_set() and bridge.outage_reason is None
        survivors = await asyncio.gather(calls["r2"], calls["r3"])
        assert [r.status_code for r in survivors] == [200, 200]
        assert [r.json()["choices"][0]["message"]["content"] for r in survivors] == ["391"] * 2
        assert (await chat(client, bridge, "r5")).status_code == 200
        assert bridge.stuck_rollouts() == set()


async def test_a_provider_that_never_recovers_keeps_the_outage_and_is_probed_with_backoff() -> None:
    policy = OutagePolicy(probe_first_s=0.1, probe_max_s=0.4)
    retry = RetryPolicy(max_attempts=2, max_elapsed=5, initial_backoff=0.01)
    script = [Rule(respond=Fail(503, "still down", retry_after=0))]
    async with (
        FakeModelServer(script=script) as fake,
        ModelBridge(target=target_for(fake.base_url), retry=retry, outage_policy=policy) as bridge,
        httpx.AsyncClient(timeout=10, **PLAIN) as client,
    ):
        assert (await chat(client, bridge, "r1")).status_code == 503
        reason = bridge.outage_reason
        began = time.monotonic()
        recovered = await bridge.wait_recovered(1.2)
        waited = time.monotonic() - began
    assert recovered is False
    assert 1.15 <= waited < 2.5
    assert bridge.outage.is_set() and bridge.outage_reason == reason
    probes = [request for request in fake.requests if is_probe(request)]
    # Waits of 0.1, 0.2, 0.4, 0.4 s: three or four probes in 1.2 s, not one per loop turn.
    assert 3 <= len(probes) <= 4
    assert {request.model for request in probes} == {"fake-model"}
    assert bridge.take_calls("r1")[0].attempts == 2  # probes are not the rollout's calls


async def test_a_stuck_call_that_succeeds_late_does_not_clear_the_outage_but_a_probe_does() -> None:
    probes_fail = True
    script = [
        Rule(when=lambda r: is_probe(r) and probes_fail, respond=Fail(503, retry_after=0)),
        Rule(contains="slow", delay=0.8, respond="late but fine"),
        Rule(contains="broken", respond=Fail(500, "upstream exploded")),
    ]
    policy = OutagePolicy(probe_first_s=0.1, probe_max_s=0.2)
    async with (
        FakeModelServer(script=script) as fake,
        ModelBridge(
            target=target_for(fake.base_url), retry=FAST_RETRY, outage_policy=policy
        ) as bridge,
        httpx.AsyncClient(timeout=10, **PLAIN) as client,
    ):
        slow = asyncio.create_task(chat(client, bridge, "slow-1", "slow please"))
        await eventually(lambda: received(fake, "slow please"))  # it is with the provider
        broken = await chat(client, bridge, "broken-1", "broken please")
        assert broken.status_code == 503
        assert bridge.outage.is_set()
        assert "gave up after 4 attempts" in (bridge.outage_reason or "")
        assert bridge.stuck_rollouts() == {"slow-1"}

        late = await slow
        assert late.status_code == 200
        assert late.json()["choices"][0]["message"]["content"] == "late but fine"
        await asyncio.sleep(0.3)  # probes go on failing meanwhile
        assert bridge.outage.is_set()  # one lucky call says nothing about the provider

        probes_fail = False
        assert await bridge.wait_recovered(5) is True
        assert bridge.outage_reason is None
        assert (await chat(client, bridge, "after")).status_code == 200


async def test_one_long_generation_on_a_quiet_bridge_is_not_an_outage() -> None:
    # No answer for longer than stall_after_s, but the confirming probe is answered: the
    # provider is slow on this call, not gone.
    script = [Rule(contains="long", delay=2.5, respond="a long essay")]
    policy = OutagePolicy(stall_after_s=0.8, probe_timeout_s=1)
    async with (
        FakeModelServer(script=script) as fake,
        ModelBridge(target=target_for(fake.base_url), outage_policy=policy) as bridge,
        httpx.AsyncClient(timeout=10, **PLAIN) as client,
    ):
        declared = asyncio.create_task(bridge.outage.wait())
        response = await chat(client, bridge, "r1", "write something long")
        assert not declared.done()
        declared.cancel()
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "a long essay"
    assert len([request for request in fake.requests if is_probe(request)]) >= 2


async def test_timeouts_in_a_row_declare_an_outage_and_an_answer_between_resets_the_count() -> None:
    script = [
        Rule(contains="twice", delay=5, respond="too late", times=2),
        Rule(contains="always", delay=5, respond="too late"),
    ]
    retry = RetryPolicy(max_attempts=10, max_elapsed=30, initial_backoff=0.01, max_backoff=0.02)
    policy = OutagePolicy(stall_after_s=60, timeouts_in_a_row=3, probe_first_s=60)
    async with FakeModelServer(script=script) as fake:
        bridge = ModelBridge(
            target=target_for(fake.base_url, timeout=0.25), retry=retry, outage_policy=policy
        )
        async with bridge, httpx.AsyncClient(timeout=10, **PLAIN) as client:
            # Two timeouts, then an answer: the count starts again.
            recovered = await chat(client, bridge, "r1", "time out twice")
            assert recovered.status_code == 200
            assert not bridge.outage.is_set()
            began = time.monotonic()
            gave_up = await chat(client, bridge, "r2", "time out always")
            took = time.monotonic() - began
    assert gave_up.status_code == 503
    assert gave_up.json()["error"]["code"] == "provider_unavailable"
    assert bridge.outage.is_set()
    assert "3 calls in a row timed out" in (bridge.outage_reason or "")
    assert took < 3  # the third timeout ends it, not the retry budget of 30 s
    assert [r.attempts for r in bridge.take_calls("r1")] == [3]
    assert [r.attempts for r in bridge.take_calls("r2")] == [3]


async def test_a_call_waiting_between_retries_is_answered_503_when_an_outage_is_declared() -> None:
    script = [
        Rule(contains="limited", respond=Fail(429, retry_after=20)),
        Rule(contains="broken", respond=Fail(500)),
    ]
    retry = RetryPolicy(max_attempts=4, max_elapsed=60, initial_backoff=0.01, max_backoff=0.05)
    policy = OutagePolicy(probe_first_s=60)
    # Without the adaptive limit: it would rightly hold r1's 429'd slot for the Retry-After,
    # and r2 would wait for it instead of meeting the outage.
    async with (
        FakeModelServer(script=script) as fake,
        ModelBridge(
            target=target_for(fake.base_url), retry=retry, outage_policy=policy, adaptive=False
        ) as bridge,
        httpx.AsyncClient(timeout=30, **PLAIN) as client,
    ):
        began = time.monotonic()
        waiting = asyncio.create_task(chat(client, bridge, "r1", "limited"))
        await eventually(lambda: received(fake, "limited"))  # answered 429: r1 now sleeps it out
        assert (await chat(client, bridge, "r2", "broken")).status_code == 503
        released = await asyncio.wait_for(waiting, timeout=5)
        took = time.monotonic() - began
    assert released.status_code == 503
    assert released.json()["error"]["code"] == "provider_unavailable"
    assert took < 5
    assert [r.attempts for r in bridge.take_calls("r1")] == [1]


async def test_forget_releases_a_stuck_streaming_call_with_an_error_event() -> None:
    script = [Rule(contains="hang", delay=30, respond="never seen")]
    async with (
        FakeModelServer(script=script) as fake,
        ModelBridge(target=target_for(fake.base_url), heartbeat=0.1) as bridge,
        httpx.AsyncClient(timeout=10, **PLAIN) as client,
    ):
        body = {"messages": [{"role": "user", "content": "hang"}], "stream": True}
        url = bridge.open_rollout("r1") + "/chat/completions"
        headers = {"authorization": f"Bearer {bridge.token}"}
        async with client.stream("POST", url, json=body, headers=headers) as response:
            chunks = response.aiter_bytes()
            first = await anext(chunks)  # a keep-alive: the stream is open, the call stuck
            assert bridge.stuck_rollouts() == {"r1"}
            bridge.forget("r1")
            rest = b"".join([chunk async for chunk in chunks])
    assert response.status_code == 200
    assert first.startswith(b": keep-alive")
    assert b'"provider_unavailable"' in rest and rest.endswith(b"data: [DONE]\n\n")
    assert bridge.stuck_rollouts() == set()
    assert bridge.take_calls("r1") == []
    assert bridge.usage("r1").calls == 0


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("stall_after_s", 0, "stall_after_s must be positive"),
        ("probe_timeout_s", -1, "probe_timeout_s must be positive"),
        ("timeouts_in_a_row", 0, "timeouts_in_a_row must be at least 1"),
    ],
)
def test_an_outage_policy_names_what_is_wrong(field: str, value: float, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        OutagePolicy(**{field: value})
