"""The engine's protocol client against a real rollout server on loopback."""

import asyncio
import socket

import pytest

from osmosis import (
    AgentWorkflow,
    AgentWorkflowConfig,
    ConcurrencyConfig,
    Grader,
    LocalBackend,
    create_rollout_server,
)
from osmosis.eval.sites.rollout_client import (
    AdmissionRejected,
    AtCapacity,
    MalformedResponse,
    ResultDeadlineExceeded,
    RolloutClient,
    RolloutServerUnavailable,
)
from osmosis.rollout.protocol import RolloutInitRequest
from tests.integration.conftest import serving


class Sleepy(AgentWorkflow):
    async def run(self, ctx):
        await asyncio.sleep(float((ctx.metadata or {}).get("sleep", 0)))
        return [*ctx.prompt, {"role": "assistant", "content": "4"}]


class Exact(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0 if ctx.sample.messages[-1]["content"] == ctx.label else 0.0)


def init(rollout_id, sleep=0.0):
    return RolloutInitRequest(
        rollout_id=rollout_id,
        initial_messages=[{"role": "user", "content": "2+2"}],
        label="4",
        metadata={"sleep": sleep},
        chat_completions_url="http://127.0.0.1:9/unused",
    )


@pytest.fixture
def rollout_server(tmp_path):
    config = AgentWorkflowConfig(name="t", concurrency=ConcurrencyConfig(max_concurrent=1))
    backend = LocalBackend(
        workflow=Sleepy, workflow_config=config, grader=Exact, max_pending=1, artifact_root=tmp_path
    )
    app = create_rollout_server(
        backend=backend,
        configure_logging=False,
        result_wait_timeout_sec=0.5,
        polling_lease_timeout_sec=5,
    )
    with serving(app) as url:
        yield url


async def test_start_and_wait_returns_the_graded_result(rollout_server):
    async with RolloutClient(rollout_server) as client:
        assert (await client.health())["status"] == "ok"
        result = await client.wait(await client.start(init("a")))
    assert result.status == "success"
    assert result.sample.reward == 1.0


async def test_admission_at_capacity_says_when_to_come_back(rollout_server):
    async with RolloutClient(rollout_server) as client:
        first = await client.start(init("slow", sleep=0.5))
        # At capacity now: the server answers 429 with Retry-After; the engine, not the
        # client, decides where the rollout goes instead (another endpoint, or later).
        with pytest.raises(AtCapacity) as busy:
            await client.start(init("next"))
        assert busy.value.retry_after_sec > 0
        assert (await client.wait(first)).status == "success"
        assert (await client.wait(await client.start(init("next")))).status == "success"


async def test_a_result_out_of_the_protocols_shape_is_malformed_not_a_crash():
    async def app(scope, receive, send):  # a rollout server that garbles its result
        if scope["type"] != "http":
            return
        body = b'{"rollout_id": "a", "status": "success", "sample": {"reward": NaN}}'
        status = 200
        if scope["method"] == "POST":
            status = 202
            body = (
                b'{"rollout_id": "a", "status": "queued", "polling_lease_token": "t",'
                b' "result_wait_timeout_sec": 1, "polling_lease_timeout_sec": 5}'
            )
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": body})

    with serving(app) as url:
        async with RolloutClient(url) as client:
            lease = await client.start(init("a"))
            with pytest.raises(MalformedResponse, match="malformed result body: sample"):
                await client.wait(lease)


async def test_a_4xx_admission_is_this_rollouts_failure(rollout_server):
    async with RolloutClient(rollout_server) as client:
        await client.wait(await client.start(init("dup")))
        with pytest.raises(AdmissionRejected) as caught:
            await client.start(init("dup"))
    assert caught.value.status_code == 409


async def test_a_dead_server_is_unavailable_not_a_failure():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        async with RolloutClient(f"http://127.0.0.1:{port}", transport_retries=1) as client:
            with pytest.raises(RolloutServerUnavailable):
                await client.start(init("x"))


async def test_wait_gives_up_at_the_supervisor_deadline_and_cancel_stops_it(rollout_server):
    async with RolloutClient(rollout_server) as client:
        lease = await client.start(init("long", sleep=30))
        with pytest.raises(ResultDeadlineExceeded):
            await client.wait(lease, deadline_sec=0.3)
        assert await client.cancel(["long"]) == {"long": "cancelled_running"}
        assert (await client.wait(lease)).status == "cancelled"
