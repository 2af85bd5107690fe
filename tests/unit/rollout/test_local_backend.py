"""LocalBackend in-process: deadlines, queueing, capacity, artifacts and trajectories."""

import asyncio
import json
import time

import pytest

from osmosis import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowOutput,
    ConcurrencyConfig,
    Grader,
    LocalBackend,
)
from osmosis.rollout.backend import ExecutionRequest
from osmosis.rollout.types import ErrorCategory, RolloutStatus

PROMPT = [{"role": "user", "content": "What is 2 + 2?"}]


class SleepThenAnswer(AgentWorkflow):
    async def run(self, ctx):
        await asyncio.sleep(float((ctx.metadata or {}).get("sleep", 0)))
        if ctx.artifacts_dir is not None:
            (ctx.artifacts_dir / "note.txt").write_text("hello")
        return AgentWorkflowOutput(
            messages=[*ctx.prompt, {"role": "assistant", "content": "4"}], metrics={"turns": 1}
        )


class BlockTheLoop(AgentWorkflow):
    async def run(self, ctx):
        time.sleep(0.3)  # noqa: ASYNC251 - on purpose: the deadline cannot interrupt it
        return [*ctx.prompt, {"role": "assistant", "content": "4"}]


class ToolConversation(AgentWorkflow):
    async def run(self, ctx):
        call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a":2}'}}
        return [
            *ctx.prompt,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "4"},
            {"role": "assistant", "content": "4"},
        ]


class Exact(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0 if ctx.sample.messages[-1]["content"] == ctx.label else 0.0)


def one_slot(workflow=SleepThenAnswer, **kwargs):
    config = AgentWorkflowConfig(name="t", concurrency=ConcurrencyConfig(max_concurrent=1))
    return LocalBackend(workflow=workflow, workflow_config=config, grader=Exact, **kwargs)


def request(rollout_id, **kwargs):
    return ExecutionRequest(id=rollout_id, prompt=PROMPT, label="4", **kwargs)


async def test_success_is_graded_and_artifacts_and_trajectory_are_written(tmp_path):
    backend = one_slot(artifact_root=tmp_path)
    outcome = await backend.execute(request("r1", extra_fields={"row_index": 0, "run_index": 1}))
    assert outcome.result.status is RolloutStatus.SUCCESS
    assert outcome.result.sample.reward == 1.0
    assert (tmp_path / "r1" / "artifacts" / "note.txt").read_text() == "hello"
    doc = json.loads((tmp_path / "r1" / "trajectory.json").read_text())
    assert doc["schema_version"] == "ATIF-v1.7"
    assert doc["session_id"] == "r1"
    assert [s["source"] for s in doc["steps"]] == ["user", "agent"]
    assert doc["extra"]["osmosis"]["reward"] == 1.0
    assert doc["extra"]["osmosis"]["sample_metrics"] == {"turns": 1.0}
    assert doc["extra"]["osmosis"]["request_extra_fields"] == {"row_index": 0, "run_index": 1}


async def test_queue_time_counts_against_the_agent_deadline(tmp_path):
    backend = one_slot(artifact_root=tmp_path)
    first = asyncio.create_task(backend.execute(request("a", metadata={"sleep": 0.6})))
    await asyncio.sleep(0.05)
    # Its own work (0.3 s) fits in 0.8 s, but 0.55 s of waiting for the slot does not.
    second = await backend.execute(request("b", metadata={"sleep": 0.3}, agent_timeout_sec=0.8))
    assert (await first).result.status is RolloutStatus.SUCCESS
    assert second.result.status is RolloutStatus.FAILURE
    assert second.result.err_category is ErrorCategory.TIMEOUT
    assert "spent queued" in second.result.err_message


async def test_blocking_workflow_that_returns_late_is_a_timeout(tmp_path):
    backend = one_slot(BlockTheLoop, artifact_root=tmp_path)
    outcome = await backend.execute(request("r", agent_timeout_sec=0.1))
    assert outcome.result.status is RolloutStatus.FAILURE
    assert outcome.result.err_category is ErrorCategory.TIMEOUT


async def test_no_grader_or_nothing_to_grade_against_is_a_silent_failure(tmp_path):
    backend = LocalBackend(workflow=SleepThenAnswer, artifact_root=tmp_path)
    outcome = await backend.execute(request("r"))
    assert outcome.result.status is RolloutStatus.FAILURE
    assert outcome.result.err_message is None
    ungraded = await backend.execute(request("r2", grade=False))
    assert ungraded.result.status is RolloutStatus.SUCCESS
    assert ungraded.result.sample.reward is None


async def test_max_pending_reports_no_capacity_while_full(tmp_path):
    backend = one_slot(max_pending=2, artifact_root=tmp_path)
    assert backend.has_capacity()
    tasks = [
        asyncio.create_task(backend.execute(request(f"r{i}", metadata={"sleep": 0.2})))
        for i in range(2)
    ]
    await asyncio.sleep(0.05)
    assert not backend.has_capacity()
    assert backend.health()["concurrency"] == {
        "max_concurrent": 1,
        "queued": 1,
        "running": 1,
        "max_pending": 2,
    }
    await asyncio.gather(*tasks)
    assert backend.has_capacity()


async def test_tool_calls_and_results_become_agent_steps_with_observations(tmp_path):
    backend = one_slot(ToolConversation, artifact_root=tmp_path)
    await backend.execute(request("t"))
    steps = json.loads((tmp_path / "t" / "trajectory.json").read_text())["steps"]
    assert [s["source"] for s in steps] == ["user", "agent", "agent"]
    assert steps[1]["tool_calls"] == [
        {"tool_call_id": "c1", "function_name": "add", "arguments": {"a": 2}}
    ]
    assert steps[1]["observation"] == {"results": [{"source_call_id": "c1", "content": "4"}]}


def test_import_strings_resolve_and_bad_ones_explain(tmp_path):
    from osmosis.rollout.grader import Grader as GraderBase
    from osmosis.rollout.workflow import AgentWorkflow as WorkflowBase

    backend = LocalBackend(
        workflow="osmosis.rollout.workflow:AgentWorkflow",
        grader="osmosis.rollout.grader.Grader",
        artifact_root=tmp_path,
    )
    assert backend.workflow_cls is WorkflowBase and backend.grader_cls is GraderBase
    with pytest.raises(ValueError, match=r"package\.module:Name"):
        LocalBackend(workflow="NoModule", artifact_root=tmp_path)
