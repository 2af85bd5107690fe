"""Workflows calling the policy through the rollout-scoped URL, over real HTTP, end to end:
rollout server (uvicorn) → workflow → scripted model server, and back through the result poll."""

import json

import httpx
import openai

from osmosis import AgentWorkflow, Grader, LocalBackend, create_rollout_server, get_rollout_context
from tests.integration.conftest import serving

QUESTION = [{"role": "user", "content": "What is 17 * 23?"}]
ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "multiply",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        },
    },
}


class PlainOpenAIClient(AgentWorkflow):
    """What a user of any OpenAI-speaking framework writes: no osmosis helper at all."""

    async def run(self, ctx):
        rollout = get_rollout_context()
        async with openai.AsyncOpenAI(
            base_url=rollout.chat_completions_url, api_key=rollout.api_key
        ) as client:
            reply = await client.chat.completions.create(model="anything", messages=ctx.prompt)
        return [*ctx.prompt, reply.choices[0].message.model_dump(exclude_none=True)]


class RecordedOpenAIClient(AgentWorkflow):
    """Returns None: the conversation recorded through ctx.openai_client() is the sample."""

    async def run(self, ctx):
        client = ctx.openai_client()
        await client.chat.completions.create(model="anything", messages=ctx.prompt)
        await client.close()
        return None


class ToolLoop(AgentWorkflow):
    """Two turns with ctx.chat: a tool call, its result, then the answer; returns None."""

    async def run(self, ctx):
        first = await ctx.chat(ctx.prompt, tools=[ADD_TOOL])
        call = first["tool_calls"][0]
        args = json.loads(call["function"]["arguments"])
        result = {"role": "tool", "tool_call_id": call["id"], "content": str(args["a"] * args["b"])}
        await ctx.chat([*ctx.prompt, first, result], tools=[ADD_TOOL])
        return None


class LastMessageHasLabel(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0 if ctx.label in str(ctx.sample.messages[-1]["content"]) else 0.0)


def run_one(workflow, fake_model, artifact_root, rollout_id="r1"):
    backend = LocalBackend(
        workflow=workflow, grader=LastMessageHasLabel, artifact_root=artifact_root
    )
    app = create_rollout_server(backend=backend, configure_logging=False)
    with serving(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        accepted = client.post(
            "/rollout",
            json={
                "rollout_id": rollout_id,
                "initial_messages": QUESTION,
                "label": "391",
                "chat_completions_url": f"{fake_model.base_url}/rollouts/{rollout_id}",
                "llm_api_key": "per-run-token",
            },
        )
        assert accepted.status_code == 202
        lease = {"X-Osmosis-Rollout-Lease": accepted.json()["polling_lease_token"]}
        for _ in range(50):
            result = client.get(f"/rollout/{rollout_id}/result", headers=lease).json()
            if result["status"] in ("success", "failure", "cancelled"):
                return result
    raise AssertionError("the rollout did not finish")


def test_plain_openai_client_reaches_the_rollout_scoped_url(fake_model, tmp_path):
    result = run_one(PlainOpenAIClient, fake_model, tmp_path)
    assert result["status"] == "success", result
    assert result["sample"]["reward"] == 1.0
    assert "391" in result["sample"]["messages"][-1]["content"]
    seen = fake_model.requests
    assert len(seen) == 1
    assert seen[0].path == "/v1/rollouts/r1/chat/completions"
    assert seen[0].headers.get("authorization") == "Bearer per-run-token"


def test_returning_none_uses_the_recorded_openai_conversation(fake_model, tmp_path):
    result = run_one(RecordedOpenAIClient, fake_model, tmp_path)
    assert result["status"] == "success", result
    assert [m["role"] for m in result["sample"]["messages"]] == ["user", "assistant"]
    assert result["sample"]["reward"] == 1.0


def test_tool_calls_are_recorded_with_per_call_tokens_in_the_trajectory(fake_model, tmp_path):
    result = run_one(ToolLoop, fake_model, tmp_path)
    assert result["status"] == "success", result
    roles = [m["role"] for m in result["sample"]["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert result["sample"]["reward"] == 1.0
    doc = json.loads((tmp_path / "r1" / "trajectory.json").read_text())
    agent_steps = [s for s in doc["steps"] if s["source"] == "agent"]
    assert agent_steps[0]["tool_calls"][0]["function_name"] == "multiply"
    assert agent_steps[0]["observation"]["results"][0]["content"] == "391"
    assert all(s["metrics"]["prompt_tokens"] > 0 for s in agent_steps)
    assert doc["final_metrics"]["extra"]["total_policy_calls"] == 2  # ATIF: ours in extra
    assert fake_model.stats().tool_calls == 1
