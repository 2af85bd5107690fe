"""The local-process site under the engine: real rollout server processes on loopback, the
real bridge, the scripted model, a run directory. Replicas share the work; one that dies is
drained onto the others and restarted; one that cannot start is the user's error."""

from __future__ import annotations

import asyncio
import os
import signal
import textwrap
import time
from pathlib import Path

import pytest

from osmosis.eval.engine import Engine, EngineOutcome, EngineSettings
from osmosis.eval.errors import HostError
from osmosis.eval.host.run_dir import RunDirectory, Slots
from osmosis.eval.model.bridge import ModelBridge
from osmosis.eval.model.providers import ModelTarget
from osmosis.eval.results.records import WorkItem
from osmosis.eval.results.redact import Redactor
from osmosis.eval.sites.environment import RolloutEnvironment
from osmosis.eval.sites.local import LocalProcessSite
from osmosis.eval.sites.rollout_process import RolloutStartError
from osmosis.testing import FakeModelServer

CURRENT = RolloutEnvironment(
    python=Path(os.sys.executable), kind="current", cache_key=None, sdk="osmosis"
)

MAIN = """
import asyncio, os, sys, time
from pathlib import Path

import uvicorn
from osmosis import (AgentWorkflow, AgentWorkflowConfig, ConcurrencyConfig, Grader,
                     LocalBackend, create_rollout_server)

Path(os.environ["PID_DIR"], str(os.getpid())).touch()
if os.environ.get("CRASH_AT_IMPORT"):
    raise RuntimeError("boom: the tool registry is missing")
time.sleep(float(os.environ.get("SLOW_START", "0")))  # a heavy import, say


class AskOnce(AgentWorkflow):
    async def run(self, ctx):
        await asyncio.sleep(float(ctx.metadata.get("sleep", 0)))
        if ctx.metadata.get("kind") == "die":
            print("Traceback (most recent call last):", flush=True)
            print("MemoryError: the agent blew up", flush=True)
            print("INFO:     Uvicorn running on http://127.0.0.1 (CTRL+C to quit)", flush=True)
            os._exit(3)
        return [*ctx.prompt, await ctx.chat(ctx.prompt)]


class Exact(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0 if ctx.label in ctx.sample.messages[-1]["content"] else 0.0)


app = create_rollout_server(backend=LocalBackend(
    workflow=AskOnce, grader=Exact,
    workflow_config=AgentWorkflowConfig(name="t", concurrency=ConcurrencyConfig(max_concurrent=4)),
), configure_logging=False)

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]),
                log_level="warning")
"""


def workspace(tmp_path: Path) -> Path:
    rollout = tmp_path / "scripted"
    rollout.mkdir()
    (rollout / "main.py").write_text(textwrap.dedent(MAIN))
    (tmp_path / "pids").mkdir()
    return rollout


def site_for(tmp_path: Path, run: RunDirectory, **options: object) -> LocalProcessSite:
    env = {"PID_DIR": str(tmp_path / "pids"), **options.pop("env", {})}  # type: ignore[dict-item]
    return LocalProcessSite(
        CURRENT,
        tmp_path / "scripted",
        "main.py",
        env=env,
        trials_root=tmp_path / "run" / "rollout_trials",
        log=run.log,
        redactor=Redactor([]),
        **options,  # type: ignore[arg-type]
    )


def items(count: int, **metadata: object) -> list[WorkItem]:
    return [
        WorkItem(
            row_index=r,
            run_index=0,
            source_row_index=r,
            messages=[{"role": "user", "content": f"What is {r + 2} * 3?"}],
            label=str((r + 2) * 3),
            metadata={"kind": "pass", **metadata},
        )
        for r in range(count)
    ]


async def evaluate(
    site: LocalProcessSite, run: RunDirectory, model, work, **hooks
) -> EngineOutcome:
    target = ModelTarget(kind="openai-compatible", model="fake", api_base=model.base_url)
    async with ModelBridge(target=target) as bridge:
        engine = Engine(
            site=site,
            bridge=bridge,
            sink=run,
            settings=EngineSettings(concurrency=8, agent_timeout_sec=30, grader_timeout_sec=30),
            **hooks,
        )
        return await engine.run(work)


def pids(tmp_path: Path) -> set[int]:
    return {int(path.name) for path in (tmp_path / "pids").iterdir()}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and " Z " in stat.read_text())


async def test_two_replicas_share_the_work_and_a_killed_one_is_drained_and_restarted(tmp_path):
    workspace(tmp_path)
    rows = 60  # ~4 s of work after the kill: the replacement (~1 s to start) joins in time
    run = RunDirectory.open(tmp_path / "run", slots=Slots(rows=rows, n=1), inputs={}, provenance={})
    killed: list[int] = []

    def kill_one_early(_record) -> None:
        if run.recorded_count() == 5 and not killed:
            victim = site.endpoints[-1]
            killed.append(victim.process.pid)  # type: ignore[attr-defined]
            os.kill(killed[0], signal.SIGKILL)

    with run, FakeModelServer() as model:
        async with site_for(tmp_path, run) as site:
            await site.start(replicas=2)
            assert [e.name for e in site.endpoints] == ["scripted-0", "scripted-1"]
            assert [e.capacity for e in site.endpoints] == [4, 4]
            outcome = await evaluate(
                site, run, model, items(rows, sleep=0.25), on_record=kill_one_early
            )
            survivors = [e.process.pid for e in site.endpoints]  # type: ignore[attr-defined]
        records = list(run.records())
    assert killed and outcome.halted is None
    assert (outcome.recorded, outcome.pending) == (rows, 0)
    assert [(r.row_index, r.status, r.reward) for r in records] == [
        (row, "success", 1.0) for row in range(rows)
    ]
    assert {r.endpoint for r in records} == {"scripted-0", "scripted-1"}
    assert outcome.requeued >= 1  # what was in flight on the killed one ran again
    log = (tmp_path / "run" / "logs.txt").read_text()
    assert "rollout endpoint scripted-1" in log and "killed by SIGKILL" in log
    assert "restarting rollout server scripted-1 (restart 1 of 2 within 10 minutes)" in log
    assert len(pids(tmp_path)) == 3 and killed[0] not in survivors  # a fresh process
    assert not any(alive(pid) for pid in pids(tmp_path))  # stopped on the way out


async def test_a_replica_that_keeps_dying_halts_naming_the_cause_not_its_last_line(tmp_path):
    workspace(tmp_path)
    run = RunDirectory.open(tmp_path / "run", slots=Slots(rows=4, n=1), inputs={}, provenance={})
    dying = WorkItem(**{**items(4)[3].__dict__, "metadata": {"kind": "die", "sleep": 0.5}})
    work = [*items(3), dying]  # the others finish before it kills its server
    with run, FakeModelServer() as model:
        async with site_for(tmp_path, run, max_restarts=1) as site:
            await site.start(replicas=1)
            outcome = await evaluate(site, run, model, work)
        records = list(run.records())
    assert outcome.halted is not None
    assert outcome.halted.startswith("no rollout server left: rollout server 'scripted' exited")
    assert "(code 3): MemoryError: the agent blew up" in outcome.halted
    assert "Uvicorn running" not in outcome.halted
    assert "restarted 1 times in the last 10 minutes (limit 1)" in outcome.halted
    # The dying row is pending, never a zero; the others are recorded once each.
    assert [(r.row_index, r.status) for r in records] == [(row, "success") for row in range(3)]
    assert len(pids(tmp_path)) == 2


async def test_a_replica_that_dies_again_after_the_restart_window_is_restarted_again(tmp_path):
    # One restart allowed per second: two deaths 1.5 s apart are two restarts, not a halt
    # (before the window, a replica that died twice early could never be replaced later).
    workspace(tmp_path)
    rows = 90
    run = RunDirectory.open(tmp_path / "run", slots=Slots(rows=rows, n=1), inputs={}, provenance={})
    kills: list[float] = []
    loop = asyncio.get_running_loop()

    def kill_twice(_record) -> None:
        first_due = not kills and run.recorded_count() >= 5
        second_due = len(kills) == 1 and loop.time() - kills[0] > 1.5
        if first_due or second_due:
            kills.append(loop.time())
            os.kill(site.endpoints[0].process.pid, signal.SIGKILL)  # type: ignore[attr-defined]

    with run, FakeModelServer() as model:
        async with site_for(tmp_path, run, max_restarts=1, restart_window_sec=1.0) as site:
            await site.start(replicas=1)
            outcome = await evaluate(
                site, run, model, items(rows, sleep=0.25), on_record=kill_twice
            )
        records = list(run.records())
    assert len(kills) == 2 and outcome.halted is None
    assert [(r.row_index, r.status) for r in records] == [(row, "success") for row in range(rows)]
    log = (tmp_path / "run" / "logs.txt").read_text()
    assert log.count("restarting rollout server scripted (restart 1 of 1 within 1 s)") == 2
    assert len(pids(tmp_path)) == 3


async def test_an_entrypoint_that_raises_at_import_is_the_users_error_with_its_last_lines(
    tmp_path,
):
    workspace(tmp_path)
    run = RunDirectory.open(tmp_path / "run", slots=Slots(rows=1, n=1), inputs={}, provenance={})
    with run:
        site = site_for(tmp_path, run, env={"CRASH_AT_IMPORT": "1"}, startup_timeout=20)
        with pytest.raises(RolloutStartError) as caught:
            await site.start(replicas=2)
    error = caught.value
    assert isinstance(error, HostError) and error.code == "VALIDATION"
    assert "RuntimeError: boom: the tool registry is missing" in str(error)
    assert "nothing was dispatched" in error.hint
    assert site.endpoints == []
    assert len(pids(tmp_path)) == 2 and not any(alive(pid) for pid in pids(tmp_path))


async def test_the_site_says_each_server_is_spawned_before_it_answers(tmp_path):
    # The run holds its bridge's imports back until then, not to slow the spawn down: a site
    # that never said so would cost every run its wait's whole limit.
    workspace(tmp_path)
    said: list[float] = []
    run = RunDirectory.open(tmp_path / "run", slots=Slots(rows=1, n=1), inputs={}, provenance={})
    with run:
        site = site_for(
            tmp_path,
            run,
            env={"SLOW_START": "1.5"},
            on_spawned=lambda: said.append(time.monotonic()),
        )
        try:
            await site.start(replicas=2)
            healthy = time.monotonic()
        finally:
            await site.stop()
    assert len(said) == 2
    assert all(healthy - moment > 1.0 for moment in said)


async def test_stopping_the_site_while_replicas_start_leaves_no_process(tmp_path):
    workspace(tmp_path)
    run = RunDirectory.open(tmp_path / "run", slots=Slots(rows=1, n=1), inputs={}, provenance={})
    with run:
        # Each server sleeps a second after its pid is written: the cancel lands mid-start
        # however slow this machine is (without it, a starved loop could see all three healthy).
        site = site_for(tmp_path, run, env={"SLOW_START": "1.0"})
        try:
            starting = asyncio.create_task(site.start(replicas=3))
            while len(pids(tmp_path)) < 3:  # noqa: ASYNC110 - every child runs its entrypoint
                await asyncio.sleep(0.01)
            starting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await starting
        finally:
            await site.stop()
    await asyncio.sleep(0.2)
    assert not any(alive(pid) for pid in pids(tmp_path))
