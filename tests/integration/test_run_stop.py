"""`run_evaluation(stop=)`: a run halts once its stop event is set, whether or not its task
is cancelled too. The platform's worker sets it on `eval stop` beside cancelling the run, so
a stop holds even if that cancellation is lost on its way to the engine (in CI a stopped run
twice went on to its agents' deadline and ended `finished`).

A real rollout server, the scripted model: two rows answer at once, two hang; the event is
set as the second answer is recorded, and nothing cancels the run's task.
"""

from __future__ import annotations

import asyncio
import json

from osmosis.eval.host.plan import RunOptions, plan_run
from osmosis.eval.host.run import STOP_HALT, run_evaluation
from osmosis.eval.results.records import AttemptRecord
from osmosis.testing import FakeModelServer
from tests.e2e.conftest import model_env
from tests.e2e.workspace import make_workspace, row
from tests.integration.test_sandbox_disk import Quiet


class StopAfter(Quiet):
    """Sets `stop` once `count` attempts are recorded."""

    def __init__(self, count: int, stop: asyncio.Event) -> None:
        self.count = count
        self.stop = stop

    def advance(self, record: AttemptRecord) -> None:
        self.count -= 1
        if self.count == 0:
            self.stop.set()


def test_a_set_stop_event_halts_the_run_keeping_what_finished(tmp_path):
    rows = [row("plain", 2, 3), row("plain", 3, 4), row("hang"), row("hang")]
    config = make_workspace(tmp_path, rows, batch_size=4)
    with FakeModelServer() as model:
        plan = plan_run(config, RunOptions(name="stopped", environ=model_env(model)))

        async def run() -> object:
            stop = asyncio.Event()
            return await run_evaluation(plan, StopAfter(2, stop), stop=stop)

        report = asyncio.run(asyncio.wait_for(run(), 60))

    said = (plan.run_dir / "logs.txt").read_text()
    assert report.halted == STOP_HALT, said
    assert report.status == "incomplete" and not report.interrupted
    records = [json.loads(line) for line in (plan.run_dir / "index.jsonl").read_text().splitlines()]
    # The two that answered are kept; the hanging two were cancelled and stay pending.
    assert sorted((r["row_index"], r["status"]) for r in records) == [
        (0, "success"),
        (1, "success"),
    ]
    assert f"halting dispatch: {STOP_HALT}" in said
