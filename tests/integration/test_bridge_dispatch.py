"""The bridge serves only what the engine dispatched (issue 25, points 5 and 8), over real HTTP on
loopback in front of the scripted fake model.

A rollout id is served from `open_rollout` until `close_rollout`/`forget`; any other id is
refused 403 from the request's head, its body dropped unread, and counted. The caps: a call's
`max_tokens` and the request body's size.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from osmosis import (
    AgentWorkflow,
    Grader,
    LocalBackend,
    create_rollout_server,
    get_rollout_context,
)
from osmosis.eval.engine import Engine, EngineSettings
from osmosis.eval.host.run_dir import RunDirectory, Slots
from osmosis.eval.model.bridge import ModelBridge
from osmosis.eval.model.providers import ModelTarget
from osmosis.eval.results.metrics import summarize
from osmosis.eval.results.records import WorkItem
from osmosis.testing import FakeModelServer
from tests.integration.conftest import serving
from tests.integration.test_bridge import PLAIN, QUESTION, bridged, post
from tests.integration.test_engine_faults import ServedEndpoint, ServedSite
from tests.integration.test_rollout_process import eventually

MiB = 1024 * 1024


def target_for(fake: FakeModelServer) -> ModelTarget:
    return ModelTarget(kind="openai-compatible", model="fake", api_base=fake.base_url)


async def call(client: httpx.AsyncClient, url: str, token: str, **body: object) -> httpx.Response:
    return await client.post(
        url + "/chat/completions",
        json={"messages": QUESTION, **body},
        headers={"authorization": f"Bearer {token}"},
    )


# -- who is served ---------------------------------------------------------------------------------
async def test_calls_under_invented_ids_are_refused_403_counted_and_reach_no_provider() -> None:
    async with (
        FakeModelServer() as fake,
        bridged(fake) as bridge,
        httpx.AsyncClient(timeout=10, **PLAIN) as client,
    ):
        answers = await asyncio.gather(
            *(call(client, bridge.rollout_url(f"made-up-{i}"), bridge.token) for i in range(50))
        )
        assert {answer.status_code for answer in answers} == {403}
        error = answers[0].json()["error"]  # the OpenAI error shape every refusal has
        assert error["code"] == "rollout_not_dispatched"
        assert "made-up-0 is not one this run dispatched" in error["message"]
        assert bridge.stats().refused_calls == 50
        assert fake.stats().chat_completions == 0  # the provider saw none of them
        assert bridge.usage("made-up-0").calls == 0 and bridge.take_calls("made-up-0") == []
        # A wrong token is still 401, not 403: the id is only looked at for the run's token.
        wrong = await call(client, bridge.rollout_url("made-up-0"), "not-the-token")
        assert wrong.status_code == 401 and bridge.stats().refused_calls == 50


async def test_a_finished_rollout_is_refused_and_what_it_recorded_stays() -> None:
    async with (
        FakeModelServer() as fake,
        bridged(fake) as bridge,
        httpx.AsyncClient(timeout=10, **PLAIN) as client,
    ):
        url = bridge.open_rollout("r1")
        assert (await call(client, url, bridge.token)).status_code == 200
        bridge.close_rollout("r1")
        late = await call(client, url, bridge.token)
        assert late.status_code == 403
        assert late.json()["error"]["code"] == "rollout_not_dispatched"
        assert [record.status_code for record in bridge.take_calls("r1")] == [200]
        bridge.open_rollout("r2")
        bridge.forget("r2")  # requeued or recorded: forgotten, and refused from then on
        assert (await call(client, bridge.rollout_url("r2"), bridge.token)).status_code == 403
    assert bridge.stats().refused_calls == 2
    assert fake.stats().chat_completions == 1


async def test_a_call_answered_after_its_rollout_closed_is_counted_late_not_lost() -> None:
    async with (
        FakeModelServer(latency=0.3) as fake,
        bridged(fake) as bridge,
        httpx.AsyncClient(timeout=10, **PLAIN) as client,
    ):
        url = bridge.open_rollout("r1")
        waiting = asyncio.ensure_future(call(client, url, bridge.token))
        await eventually(lambda: fake.stats().chat_completions == 1)  # with the provider
        bridge.close_rollout("r1")
        assert (await waiting).status_code == 200
    stats = bridge.stats()
    served = fake.stats()
    assert bridge.take_calls("r1") == []  # its attempt was over: no record takes it
    assert (stats.late_calls, stats.late_tokens) == (
        1,
        served.prompt_tokens + served.completion_tokens,
    )


# -- memory ----------------------------------------------------------------------------------------
BRIDGE_PROCESS = textwrap.dedent(
    """
    import asyncio, sys
    from osmosis.eval.model.bridge import ModelBridge
    from osmosis.eval.model.providers import ModelTarget

    async def main():
        target = ModelTarget(kind="openai-compatible", model="fake", api_base=sys.argv[1])
        async with ModelBridge(target=target) as bridge:
            print(bridge.open_rollout("real"), bridge.token, flush=True)
            await asyncio.Event().wait()

    asyncio.run(main())
    """
)


def memory_of(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (the peak) of a process, in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) * 1024
    return fields


@pytest.mark.skipif(
    not Path("/proc/self/status").exists(),
    reason="measures the bridge process's memory through /proc, which only Linux has",
)
async def test_64_bodies_of_16_mib_under_invented_ids_are_refused_and_memory_stays_flat() -> None:
    async with FakeModelServer() as fake:
        bridge = await asyncio.create_subprocess_exec(
            sys.executable, "-c", BRIDGE_PROCESS, fake.base_url, stdout=subprocess.PIPE
        )
        try:
            assert bridge.stdout is not None
            line = await asyncio.wait_for(bridge.stdout.readline(), 60)
            real_url, token = line.decode().split()
            invented = real_url.rsplit("/", 1)[0] + "/invented-{}/chat/completions"
            headers = {"authorization": f"Bearer {token}"}
            # A request the provider would take, if the id were one the run dispatched.
            body = b'{"messages": [{"role": "user", "content": "' + b"x" * (16 * MiB) + b'"}]}'
            async with httpx.AsyncClient(timeout=60, **PLAIN) as client:
                warm = await call(client, real_url, token)  # its first call is behind it
                assert warm.status_code == 200
                before = memory_of(bridge.pid)
                statuses: list[int] = []
                for batch in range(8):  # 8 at a time, 64 in all
                    answers = await asyncio.gather(
                        *(
                            client.post(
                                invented.format(batch * 8 + i), content=body, headers=headers
                            )
                            for i in range(8)
                        )
                    )
                    statuses += [answer.status_code for answer in answers]
                after = memory_of(bridge.pid)
        finally:
            bridge.kill()
            await bridge.wait()
        served = fake.stats().chat_completions
    grown = after["VmRSS"] - before["VmRSS"]
    peak = after["VmHWM"] - before["VmRSS"]
    assert grown < 50 * MiB and peak < 50 * MiB, (before, after)
    assert statuses == [403] * 64
    assert served == 1  # the warm-up call only


# -- caps ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["max_tokens", "max_completion_tokens"])
async def test_a_call_asking_more_tokens_than_the_cap_is_refused_400_naming_it(name: str) -> None:
    async with FakeModelServer() as fake, bridged(fake, max_tokens=100) as bridge:
        over = await post(bridge, {"messages": QUESTION, name: 101})
        at_cap = await post(bridge, {"messages": QUESTION, name: 100})
    error = over.json()["error"]
    assert over.status_code == 400 and error["param"] == name
    assert error["message"] == (
        f"{name} 101 is above this run's cap of 100 tokens; ask for 100 or fewer"
    )
    assert at_cap.status_code == 200
    assert fake.stats().chat_completions == 1
    assert [r.status_code for r in bridge.take_calls("r1")] == [400, 200]


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_body_over_the_request_limit_is_refused_413_naming_it(chunked: bool) -> None:
    async with FakeModelServer() as fake, bridged(fake, max_request_bytes=64 * 1024) as bridge:
        body = b'{"messages": [{"role": "user", "content": "' + b"x" * (100 * 1024) + b'"}]}'
        url = bridge.open_rollout("r1") + "/chat/completions"
        headers = {"authorization": f"Bearer {bridge.token}"}

        async def pieces() -> AsyncIterator[bytes]:
            for start in range(0, len(body), 16 * 1024):
                yield body[start : start + 16 * 1024]

        async with httpx.AsyncClient(timeout=10, **PLAIN) as client:
            try:
                answer = await client.post(
                    url, content=pieces() if chunked else body, headers=headers
                )
            except httpx.TransportError:
                # Chunked: the size shows only as the body arrives, and the server stops
                # reading there; a client still writing may see the reset instead.
                assert chunked
                answer = None
    if answer is not None:
        assert answer.status_code == 413
        message = answer.json()["error"]["message"]
        assert message == "the request body is too large: the limit is 65536 bytes"
    assert fake.stats().chat_completions == 0


# -- a run's totals -------------------------------------------------------------------------------
stray_answers: list[int] = []  # what the bridge answered each stray call


class AskThenStray(AgentWorkflow):
    """Asks once through its own URL, then five times under ids the engine never gave out."""

    async def run(self, ctx):
        reply = await ctx.chat(ctx.prompt)
        rollout = get_rollout_context()
        base = rollout.chat_completions_url.rstrip("/").rsplit("/", 1)[0]
        async with httpx.AsyncClient(timeout=10) as client:
            for index in range(5):
                stray = await client.post(
                    f"{base}/stray-{rollout.rollout_id}-{index}/chat/completions",
                    json={"messages": ctx.prompt},
                    headers={"authorization": f"Bearer {rollout.api_key}"},
                )
                stray_answers.append(stray.status_code)
        return [*ctx.prompt, reply]


class Always(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0)


async def test_a_runs_token_total_is_what_the_provider_served_and_strays_are_refused(tmp_path):
    rows = 10
    stray_answers.clear()
    trials = tmp_path / "trials"
    run = RunDirectory.open(tmp_path / "run", slots=Slots(rows=rows, n=1), inputs={}, provenance={})
    backend = LocalBackend(workflow=AskThenStray, grader=Always, artifact_root=trials)
    app = create_rollout_server(backend=backend, configure_logging=False)
    items = [
        WorkItem(
            row_index=r,
            run_index=0,
            source_row_index=r,
            messages=[{"role": "user", "content": f"row {r}: " + "word " * r}],
            label="x",
            metadata=None,
        )
        for r in range(rows)
    ]
    with run, FakeModelServer() as fake, serving(app) as url:
        async with ModelBridge(target=target_for(fake)) as bridge:
            endpoint = ServedEndpoint(url, trials)
            engine = Engine(
                site=ServedSite(endpoint),
                bridge=bridge,
                sink=run,
                settings=EngineSettings(concurrency=4, agent_timeout_sec=30, grader_timeout_sec=30),
            )
            try:
                outcome = await engine.run(items)
            finally:
                await endpoint.api.aclose()
        served = fake.stats()
        records = list(run.records())
    assert outcome.halted is None and [r.status for r in records] == ["success"] * rows
    assert summarize(records, 1.0)["tokens_used"] == served.prompt_tokens + served.completion_tokens
    assert served.chat_completions == rows  # the strays never reached it
    assert stray_answers == [403] * 5 * rows and bridge.stats().refused_calls == 5 * rows
