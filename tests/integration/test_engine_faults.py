"""The engine under provider outages: dispatch pauses, nothing is recorded as failed, and the
run finishes by itself when the provider answers again, or halts resumable past the wait.

Real pieces throughout: rollout server (uvicorn, our SDK), model bridge, scripted model,
run directory journal. (Dead rollout servers: tests/integration/test_sites.py.)"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from osmosis import AgentWorkflow, Grader, LocalBackend, create_rollout_server
from osmosis.eval.engine import Engine, EngineOutcome, EngineSettings
from osmosis.eval.host.run_dir import RunDirectory, Slots
from osmosis.eval.model.bridge import ModelBridge, OutagePolicy
from osmosis.eval.model.providers import ModelTarget
from osmosis.eval.model.retry import RetryPolicy
from osmosis.eval.results.records import WorkItem
from osmosis.eval.sites import RolloutAPI, SiteExhausted
from osmosis.eval.sites.rollout_client import RolloutClient
from osmosis.testing import Fail, FakeModelServer, Rule
from tests.integration.conftest import serving

ROWS = 12
QUICK_RETRY = RetryPolicy(max_attempts=2, max_elapsed=1.0, initial_backoff=0.05)
QUICK_OUTAGE = OutagePolicy(
    stall_after_s=2, probe_timeout_s=0.5, probe_first_s=0.1, probe_max_s=0.3
)


class AskOnce(AgentWorkflow):
    async def run(self, ctx):
        return [*ctx.prompt, await ctx.chat(ctx.prompt)]


class Exact(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0 if ctx.label in ctx.sample.messages[-1]["content"] else 0.0)


class ServedEndpoint:
    """A rollout server served in this process: an endpoint that never dies."""

    def __init__(self, url: str, trials: Path) -> None:
        self.name, self.node, self.base_url, self.capacity = "served", "here", url, None
        self.api: RolloutAPI = RolloutClient(url)
        self.dead = asyncio.Event()
        self.death_reason = ""
        self.breach = None
        self._trials = trials

    async def trial(self, rollout_id: str) -> Path | None:
        path = self._trials / rollout_id
        return path if path.is_dir() else None


class ServedSite:
    def __init__(self, endpoint: ServedEndpoint) -> None:
        self.endpoints = [endpoint]

    async def replace(self, endpoint: ServedEndpoint, reason: str) -> ServedEndpoint:
        raise SiteExhausted("a served endpoint is not replaced")


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


async def evaluate(
    run: RunDirectory, model: FakeModelServer, url: str, trials: Path, **settings: float
) -> EngineOutcome:
    target = ModelTarget(kind="openai-compatible", model="fake", api_base=model.base_url)
    async with ModelBridge(target=target, retry=QUICK_RETRY, outage_policy=QUICK_OUTAGE) as bridge:
        endpoint = ServedEndpoint(url, trials)
        engine = Engine(
            site=ServedSite(endpoint),
            bridge=bridge,
            sink=run,
            settings=EngineSettings(
                concurrency=2, agent_timeout_sec=30, grader_timeout_sec=30, **settings
            ),
        )
        pending = [i for i in items() if not run.is_recorded(i.row_index, i.run_index)]
        try:
            return await engine.run(pending)
        finally:
            await endpoint.api.aclose()


def rollout_app(trials: Path):
    backend = LocalBackend(workflow=AskOnce, grader=Exact, artifact_root=trials)
    return create_rollout_server(backend=backend, configure_logging=False)


def outage_after(calls: int, lasting: float) -> Rule:
    """The provider answers 503 from its `calls`-th call on, for `lasting` seconds."""
    served = 0
    began: list[float] = []

    def down(_request: object) -> bool:
        nonlocal served
        served += 1
        if served < calls:
            return False
        if not began:
            began.append(time.monotonic())
        return time.monotonic() - began[0] < lasting

    return Rule(when=down, respond=Fail(503, "provider down"))


async def test_a_provider_outage_pauses_dispatch_and_the_run_finishes_by_itself(tmp_path):
    trials = tmp_path / "trials"
    run = RunDirectory.open(tmp_path / "run", slots=Slots(rows=ROWS, n=1), inputs={}, provenance={})
    rule = outage_after(5, lasting=2.0)
    with run, FakeModelServer(script=[rule]) as model, serving(rollout_app(trials)) as url:
        outcome = await evaluate(run, model, url, trials)
    assert outcome.halted is None
    assert run.recorded_count() == ROWS  # no manual resume
    assert [r.status for r in run.records()] == ["success"] * ROWS  # none failed
    assert all(r.reward == 1.0 for r in run.records())
    assert outcome.requeued >= 1  # the attempts the outage caught ran again
    log = (tmp_path / "run" / "logs.txt").read_text()
    assert "model provider outage" in log and "dispatch resumes" in log


async def test_an_outage_longer_than_the_wait_halts_and_a_resume_completes(tmp_path):
    trials = tmp_path / "trials"
    run = RunDirectory.open(tmp_path / "run", slots=Slots(rows=ROWS, n=1), inputs={}, provenance={})
    with run, FakeModelServer(script=[outage_after(5, lasting=3600)]) as model:
        with serving(rollout_app(trials)) as url:
            outcome = await evaluate(run, model, url, trials, outage_wait_sec=1.0)
            assert outcome.halted is not None
            assert "stayed unavailable for more than 1 s" in outcome.halted
            statuses = [r.status for r in run.records()]
            assert statuses == ["success"] * len(statuses)  # nothing was recorded as failed
            assert 1 <= len(statuses) < ROWS
            assert outcome.pending == outcome.dispatched - outcome.recorded > 0

            model.clear_rules()  # the provider is back: a resume finishes the run
            await evaluate(run, model, url, trials)
        assert run.recorded_count() == ROWS
        assert all(r.status == "success" and r.reward == 1.0 for r in run.records())
