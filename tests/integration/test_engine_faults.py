"""The engine under system faults: a provider outage or a dying rollout server halts the run
and leaves attempts pending — never recorded as failures — and a resume completes it.

Real pieces throughout: rollout server (uvicorn, our SDK), model bridge, scripted model,
run directory journal."""

from __future__ import annotations

import asyncio
import itertools

from osmosis import AgentWorkflow, Grader, LocalBackend, create_rollout_server
from osmosis.eval.bridge import ModelBridge
from osmosis.eval.engine import Engine, EngineSettings, WorkItem
from osmosis.eval.providers import ModelTarget
from osmosis.eval.retry import RetryPolicy
from osmosis.eval.rollout_client import RolloutClient
from osmosis.eval.run_dir import RunDirectory, Slots
from osmosis.testing import Fail, FakeModelServer, Rule
from tests.integration.conftest import serving

ROWS = 12


class AskOnce(AgentWorkflow):
    async def run(self, ctx):
        return [*ctx.prompt, await ctx.chat(ctx.prompt)]


class Exact(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0 if ctx.label in ctx.sample.messages[-1]["content"] else 0.0)


def items() -> list[WorkItem]:
    return [
        WorkItem(
            row_index=r,
            run_index=0,
            source_row_index=r,
            messages=[{"role": "user", "content": f"What is {r + 2} * 3?"}],
            label=str((r + 2) * 3),
            metadata=None,
        )
        for r in range(ROWS)
    ]


async def evaluate(run: RunDirectory, model: FakeModelServer, rollout_url: str, **options):
    target = ModelTarget(kind="openai-compatible", model="fake", api_base=model.base_url)
    quick = RetryPolicy(max_attempts=2, max_elapsed=1.0, initial_backoff=0.05)
    async with (
        ModelBridge(target=target, retry=quick) as bridge,
        RolloutClient(rollout_url) as client,
    ):
        engine = Engine(
            rollout=client,
            bridge=bridge,
            sink=run,
            settings=EngineSettings(concurrency=2, agent_timeout_sec=30, grader_timeout_sec=30),
            **options,
        )
        pending = [i for i in items() if not run.is_recorded(i.row_index, i.run_index)]
        return await engine.run(pending)


def rollout_app(tmp_path):
    backend = LocalBackend(workflow=AskOnce, grader=Exact, artifact_root=tmp_path / "trials")
    return create_rollout_server(backend=backend, configure_logging=False)


async def test_a_provider_outage_halts_and_leaves_the_rest_pending(tmp_path):
    served = itertools.count()
    outage = Rule(when=lambda _: next(served) >= 4, respond=Fail(503, "provider down"))
    run = RunDirectory.open(tmp_path / "run", slots=Slots(rows=ROWS, n=1), inputs={}, provenance={})
    with run, FakeModelServer(script=[outage]) as model, serving(rollout_app(tmp_path)) as url:
        outcome = await evaluate(run, model, url)
        assert outcome.halted and "provider" in outcome.halted
        statuses = [r.status for r in run.records()]
        assert statuses == ["success"] * len(statuses)  # nothing was recorded as failed
        assert 1 <= len(statuses) < ROWS
        assert outcome.pending == outcome.dispatched - outcome.recorded > 0

        model.clear_rules()  # the provider recovers: a resume finishes the run
        await evaluate(run, model, url)
        assert run.recorded_count() == ROWS
        assert all(r.status == "success" and r.reward == 1.0 for r in run.records())


class _DeadServer:
    """A halt signal: the rollout server stopped (as RolloutProcess.exit_signal reports)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.reason = "rollout server exited with code -9"


async def test_a_dead_rollout_server_halts_without_recording_failures(tmp_path):
    run = RunDirectory.open(tmp_path / "run", slots=Slots(rows=ROWS, n=1), inputs={}, provenance={})
    dead = _DeadServer()
    two_recorded = asyncio.Event()

    def on_record(_record) -> None:
        if run.recorded_count() >= 2:
            two_recorded.set()

    with run, FakeModelServer(latency=0.2) as model:
        with serving(rollout_app(tmp_path)) as url:
            task = asyncio.create_task(
                evaluate(run, model, url, halt_signals=[dead], on_record=on_record)
            )
            await two_recorded.wait()
        dead.event.set()  # the server is gone (serving() stopped it) and the signal fires
        outcome = await task
        assert outcome.halted == dead.reason
        assert all(r.status == "success" for r in run.records())
        assert run.recorded_count() < ROWS
