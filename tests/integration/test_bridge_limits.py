"""Model traffic under a provider's limits, end to end: the engine, a real rollout server, the
model bridge and the scripted model.

- A provider that accepts 20 calls/s and answers 429 above it: a run with 128 in flight passes
  every attempt through the bridge's adaptive (AIMD) limit, with far fewer 429s than the same
  run at fixed concurrency; two runs at once on one key share the limit.
- A provider that stops for less than the stall window while attempts' agent deadlines pass:
  those attempts go back to pending (0 failed), while one slow call on a provider that answers
  the others still times out.

Throughput against the provider's 20 calls/s is a bench figure: bench/rate_limit.py.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from osmosis import AgentWorkflow, LocalBackend, create_rollout_server
from osmosis.eval.engine import Engine, EngineOutcome, EngineSettings
from osmosis.eval.host.run_dir import RunDirectory, Slots
from osmosis.eval.model.bridge import ModelBridge, OutagePolicy
from osmosis.eval.model.providers import ModelTarget
from osmosis.eval.model.retry import RetryPolicy
from osmosis.eval.results.records import WorkItem
from osmosis.rollout.configs import AgentWorkflowConfig, ConcurrencyConfig
from osmosis.testing import FakeModelServer, Rule
from tests.integration.conftest import serving
from tests.integration.test_engine_faults import Exact, ServedEndpoint, ServedSite, rollout_app

# The same patient retries for the adaptive and the fixed runs: the fixed one must not end in
# declared outages, or it would stop sending (and collecting 429s) for a while.
PATIENT = RetryPolicy(max_attempts=30, max_elapsed=120, initial_backoff=0.2, max_backoff=2)
# A stall window far longer than the stalls below: what frees their attempts is the verdict
# at each agent deadline, not a declared outage.
LONG_WINDOW = OutagePolicy(stall_after_s=30, probe_timeout_s=0.5, probe_first_s=0.1)
RATE = 20  # calls/s the scripted provider accepts; 429 above
CALLS = 2  # model calls per attempt: more calls than attempts/s the engine reaches here
COMMAND = [sys.executable, "-c", "from osmosis.cli.main import run; run()"]


class AskTwice(AgentWorkflow):
    """Two model calls per attempt."""

    async def run(self, ctx):  # type: ignore[no-untyped-def]
        for _ in range(CALLS - 1):
            await ctx.chat(ctx.prompt)
        return [*ctx.prompt, await ctx.chat(ctx.prompt)]


def chatty_app(trials: Path):  # type: ignore[no-untyped-def]
    # 128 workflows at once (the default is 4): the run's 128 in flight reach the bridge.
    config = AgentWorkflowConfig(name="ask", concurrency=ConcurrencyConfig(max_concurrent=128))
    backend = LocalBackend(
        workflow=AskTwice, workflow_config=config, grader=Exact, artifact_root=trials
    )
    return create_rollout_server(backend=backend, configure_logging=False)


def items(rows: int) -> list[WorkItem]:
    return [
        WorkItem(
            row_index=r,
            run_index=0,
            source_row_index=r,
            messages=[{"role": "user", "content": f"What is {r + 2} * 3?"}],
            label=str((r + 2) * 3),
            metadata=None,
        )
        for r in range(rows)
    ]


def target(base_url: str, key: str) -> ModelTarget:
    return ModelTarget(kind="openai-compatible", model="fake-model", api_base=base_url, api_key=key)


async def evaluate(
    bridge: ModelBridge,
    run: RunDirectory,
    url: str,
    trials: Path,
    rows: int,
    *,
    concurrency: int,
    agent_timeout: float = 60,
) -> EngineOutcome:
    endpoint = ServedEndpoint(url, trials)
    engine = Engine(
        site=ServedSite(endpoint),
        bridge=bridge,
        sink=run,
        settings=EngineSettings(
            concurrency=concurrency, agent_timeout_sec=agent_timeout, grader_timeout_sec=30
        ),
    )
    try:
        return await engine.run(items(rows))
    finally:
        await endpoint.api.aclose()


def open_run(path: Path, rows: int) -> RunDirectory:
    return RunDirectory.open(path, slots=Slots(rows=rows, n=1), inputs={}, provenance={})


@pytest.mark.slow
async def test_128_in_flight_at_a_rate_limit_pass_with_5x_fewer_429s_than_fixed(
    tmp_path: Path,
) -> None:
    rows = 128
    trials = tmp_path / "trials"
    model = FakeModelServer(rate_limit=RATE, latency=0.5, retry_after=1)
    throttled: dict[bool, int] = {}
    with model, serving(chatty_app(trials)) as url:
        for adaptive in (True, False):
            model.reset()
            run = open_run(tmp_path / f"run-{adaptive}", rows)
            # A fresh key per run: the process's limit for a key outlives its bridges.
            bridge = ModelBridge(
                target=target(model.base_url, uuid.uuid4().hex),
                retry=PATIENT,
                max_in_flight=128,
                adaptive=adaptive,
            )
            with run:
                async with bridge:
                    outcome = await evaluate(bridge, run, url, trials, rows, concurrency=128)
                assert outcome.halted is None
                assert [r.status for r in run.records()] == ["success"] * rows
                assert all(r.reward == 1.0 for r in run.records())
            throttled[adaptive] = model.stats().rate_limited
            # The bridge counts what its calls got (the server's count adds probes, if any).
            assert bridge.stats().throttled_calls <= throttled[adaptive]
            limit = bridge.stats().limit
            if adaptive:
                # Near what 20 calls/s of 0.5 s each allow (10), far from 128.
                assert limit is not None and 4 <= limit <= 30
            else:
                assert limit is None
    assert throttled[True] * 5 <= throttled[False], throttled


@pytest.mark.slow
async def test_two_runs_at_once_on_one_key_share_the_limit(tmp_path: Path) -> None:
    rows = 60
    trials = tmp_path / "trials"
    key = uuid.uuid4().hex
    with (
        FakeModelServer(rate_limit=RATE, latency=0.5, retry_after=1) as model,
        serving(chatty_app(trials)) as url,
    ):
        runs = [open_run(tmp_path / name, rows) for name in ("first", "second")]
        bridges = [
            ModelBridge(target=target(model.base_url, key), retry=PATIENT, max_in_flight=128)
            for _ in runs
        ]
        async with bridges[0], bridges[1]:
            # The first run queues its 128 calls before the second starts.
            tasks = [
                asyncio.create_task(evaluate(bridge, run, url, trials, rows, concurrency=128))
                for bridge, run in zip(bridges, runs, strict=True)
            ]
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            # When one run is through, the other did about as much: its share is near half.
            recorded = [run.recorded_count() for run in runs]
            await asyncio.gather(*tasks)
        for run in runs:
            run.close()
            assert [r.status for r in run.records()] == ["success"] * rows
    assert bridges[0].stats().limit == bridges[1].stats().limit  # one limit for the key
    shares = [count / sum(recorded) for count in recorded]
    assert all(0.35 <= share <= 0.65 for share in shares), (recorded, shares)


@pytest.fixture
def model_process() -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`osmosis dev fake-model` in its own process (answering after 0.1 s), to SIGSTOP."""
    process = subprocess.Popen(
        [*COMMAND, "dev", "fake-model", "--port", "0", "--latency", "0.1"],
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
async def test_a_stall_shorter_than_the_stall_window_fails_no_attempt(
    tmp_path: Path, model_process: tuple[subprocess.Popen[str], str]
) -> None:
    # The case scaled down: the provider stops 2 s, agent deadlines are 0.8 s, the
    # stall window 30 s. Before, the attempts caught in the stall were recorded
    # failed/timeout once their calls were answered after it.
    process, base_url = model_process
    rows = 24
    trials = tmp_path / "trials"
    run = open_run(tmp_path / "run", rows)
    bridge = ModelBridge(
        target=target(base_url, uuid.uuid4().hex), retry=PATIENT, outage_policy=LONG_WINDOW
    )
    with run, serving(rollout_app(trials)) as url:
        async with bridge:
            evaluation = asyncio.create_task(
                evaluate(bridge, run, url, trials, rows, concurrency=4, agent_timeout=0.8)
            )
            for _ in range(500):  # the stall begins once the run is under way
                if run.recorded_count() >= 4:
                    break
                await asyncio.sleep(0.02)
            process.send_signal(signal.SIGSTOP)
            stopped = time.monotonic()
            await asyncio.sleep(2.0)
            process.send_signal(signal.SIGCONT)
            outcome = await evaluation
            assert not bridge.outage.is_set() and time.monotonic() - stopped < 30
        assert outcome.halted is None
        assert [r.status for r in run.records()] == ["success"] * rows  # none failed
        assert outcome.requeued >= 1  # the attempts the stall caught ran again
    log = (tmp_path / "run" / "logs.txt").read_text()
    assert "model provider outage" not in log  # the stall window never ran out


async def test_one_slow_call_while_others_are_answered_still_times_out(tmp_path: Path) -> None:
    rows = 8
    trials = tmp_path / "trials"
    run = open_run(tmp_path / "run", rows)
    slow = Rule(contains="What is 2 * 3?", respond="6", delay=2.5)  # row 0 only
    with run, FakeModelServer(script=[slow]) as model, serving(rollout_app(trials)) as url:
        bridge = ModelBridge(
            target=target(model.base_url, uuid.uuid4().hex), outage_policy=LONG_WINDOW
        )
        async with bridge:
            outcome = await evaluate(
                bridge, run, url, trials, rows, concurrency=4, agent_timeout=0.8
            )
    assert outcome.halted is None
    records = {r.row_index: r for r in run.records()}
    assert records[0].status == "failed" and records[0].error_type == "timeout"
    assert all(records[row].status == "success" for row in range(1, rows))
