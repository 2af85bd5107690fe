"""A run's `GET` (ours, the official CLI's, its metrics) reads the run's stored counters
(issue 30): the numbers it shows match the attempts while the run sink writes them batch by
batch, after a retried attempt replaces another, and once the run ends; the rows and errors
it reduces in the database are those `eval compare` finds in the attempts. On SQLite and on
PostgreSQL."""

from __future__ import annotations

import collections
import math
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from sqlalchemy import select, update

from osmosis.eval.results.compare import row_outcomes
from osmosis.eval.results.records import AttemptRecord
from osmosis.platform.core.db.models import User
from osmosis.platform.core.db.run_models import EvalRun
from osmosis.platform.worker.run_sink import AttemptSink
from tests.platform.conftest import LocalPlatform
from tests.web import seed
from tests.web.seed import RunSpec

THRESHOLD = 0.5
N = 3


def record(row: int, run_index: int, kind: int, *, variant: int = 0) -> AttemptRecord:
    """Outcomes of every sort: passes (at the threshold too), misses, failures of two
    types, skips; tokens and cost sometimes missing."""
    status = ("success", "success", "success", "failed", "failed", "skipped")[kind % 6]
    reward = (1.0, THRESHOLD, 0.25)[kind % 3] if status == "success" else None
    return AttemptRecord(
        row_index=row,
        run_index=run_index,
        rollout_id=f"{row:016x}{run_index:08x}{variant:08x}",
        source_row_index=row,
        status=status,  # type: ignore[arg-type]
        reward=reward,
        tokens=None if kind % 7 == 0 else 10 + kind,
        duration_ms=5.0,
        error_type=("timeout" if kind % 4 else "agent_error") if status == "failed" else None,
        cost_usd=None if kind % 5 == 0 else 0.001 * (kind % 3 + 1),
        finished_at=datetime.now(UTC),
    )


def expected(attempts: dict[tuple[int, int], AttemptRecord], total: int) -> dict[str, Any]:
    """What the run's views must say, counted here from the attempts themselves."""
    values = list(attempts.values())
    scored = [a for a in values if a.status != "skipped"]
    graded = [a.reward for a in scored if a.reward is not None]
    passed = sum(reward >= THRESHOLD for reward in graded)
    costs = [a.cost_usd for a in values if a.cost_usd is not None]
    rows = [a.model_dump() for a in values]
    return {
        "completed": len(values),
        "total": total,
        "failed": sum(a.status == "failed" for a in values),
        "skipped": len(values) - len(scored),
        "graded": len(graded),
        "passed": passed,
        "tokens": sum(a.tokens or 0 for a in values),
        "avg_reward": sum(graded) / len(graded) if graded else None,
        "pass_rate": (passed / len(scored) if scored else 0.0) if values else None,
        "errors": dict(
            collections.Counter(str(a.error_type) for a in values if a.status == "failed")
        ),
        "cost": math.fsum(costs) if costs else None,
        "flaky": sorted(r for r, o in row_outcomes(rows, THRESHOLD).items() if o.flaky),
    }


async def views(api: httpx.AsyncClient, name: str) -> tuple[Any, Any, Any]:
    answers = [
        await api.get(path)
        for path in (
            f"/api/eval-runs/{name}",
            f"/api/cli/eval-runs/{name}",
            f"/api/cli/eval-runs/{name}/metrics",
        )
    ]
    assert [a.status_code for a in answers] == [200, 200, 200], [a.text for a in answers]
    ours, official, metrics = (a.json() for a in answers)
    return ours, official, metrics


def approx(value: float | None) -> Any:
    # The mean reward moves by each batch's sum while the run goes (the last bits may differ
    # from a fresh mean); the recount at the end makes it exact.
    return None if value is None else pytest.approx(value, rel=1e-12)


async def check(api: httpx.AsyncClient, name: str, want: dict[str, Any]) -> None:
    ours, official, metrics = await views(api, name)
    summary = ours["summary"]
    progress = summary["progress"]
    assert (progress["completed"], progress["total"]) == (want["completed"], want["total"])
    assert {k: summary[k] for k in ("failed", "skipped", "graded", "passed")} == {
        k: want[k] for k in ("failed", "skipped", "graded", "passed")
    }
    assert summary["total_tokens"] == want["tokens"]
    assert summary["avg_reward"] == approx(want["avg_reward"])
    assert summary["pass_rate"] == approx(want["pass_rate"])
    assert ours["errors_by_type"] == want["errors"]
    assert ours["cost_usd"] == approx(want["cost"])
    assert ours["flaky_rows"] == want["flaky"]

    results = official["results"]
    assert {k: results[k] for k in ("graded", "passed", "failed", "skipped")} == {
        k: want[k] for k in ("graded", "passed", "failed", "skipped")
    }
    assert results["total_runs"] == want["completed"]
    assert results["total_tokens"] == want["tokens"]
    assert results["score"] == approx(want["avg_reward"])
    assert results["pass_rate"] == approx(want["pass_rate"])

    overview = metrics["overview"]  # a running run has no metrics.json: its counters
    assert overview["completed_samples"] == want["completed"]
    assert overview["total_samples"] == want["total"]
    assert overview["tokens_used"] == want["tokens"]
    assert (overview["graded"], overview["passed"], overview["failed"]) == (
        want["graded"],
        want["passed"],
        want["failed"],
    )


async def test_a_running_runs_numbers_match_its_attempts_at_every_batch_and_at_the_end(
    local_platform: LocalPlatform, api: httpx.AsyncClient
) -> None:
    sessions = local_platform.app.state.sessions
    rows = 20
    with sessions() as db:
        admin = db.query(User).one()
        ws = seed.workspace(db, identity="acme/evals", owner=admin)
        spec = RunSpec("live", [], status="running", n=N, pass_threshold=THRESHOLD)
        run_id = seed.seed_run(db, local_platform.settings.home, ws=ws, user=admin, spec=spec).id
        db.execute(update(EvalRun).where(EvalRun.id == run_id).values(total=rows * N))
        db.commit()
    sink = AttemptSink(sessions, run_id=run_id, pass_threshold=THRESHOLD)
    stored: dict[tuple[int, int], AttemptRecord] = {}
    plan = [record(row, i, row * N + i) for row in range(rows) for i in range(N)]
    await check(api, "live", expected(stored, rows * N))  # nothing recorded yet
    async with sink.flushing():
        for start in range(0, len(plan), 17):
            for one in plan[start : start + 17]:
                sink.advance(one)
                stored[(one.row_index, one.run_index)] = one
            await sink.flush()
            # What the views say as soon as a batch is committed: no lag behind the table.
            await check(api, "live", expected(stored, rows * N))
        # A retry within the run replaces attempts: a failure by a pass, a pass by a skip,
        # and a failure by one of another type (the counters do not say which).
        retried = [
            record(0, 1, 0, variant=1),
            record(1, 0, 5, variant=1),
            record(7, 1, 4, variant=1),
        ]
        assert (stored[(7, 1)].error_type, retried[2].error_type) == ("timeout", "agent_error")
        for one in retried:
            sink.advance(one)
            stored[(one.row_index, one.run_index)] = one
        await sink.flush()
        await check(api, "live", expected(stored, rows * N))
    # The sink's last flush recounts from every attempt: the mean is now exact.
    with sessions() as db:
        mean = db.scalar(select(EvalRun.avg_reward).where(EvalRun.id == run_id))
    assert mean == expected(stored, rows * N)["avg_reward"]
    await check(api, "live", expected(stored, rows * N))


@pytest.mark.parametrize("status", ["pending", "running", "finished", "stopped", "failed"])
async def test_flaky_rows_and_errors_are_those_the_attempts_give_in_every_status(
    local_platform: LocalPlatform, api: httpx.AsyncClient, status: str
) -> None:
    attempts = [
        seed.Attempt(row, i, **outcome)
        for row, outcomes in enumerate(
            [
                [{"reward": 1.0}, {"reward": 0.0}],  # flaky
                [{"reward": 0.5}, {"reward": 0.7}],  # both at or above 0.5: not flaky
                [{"reward": 1.0}, {"status": "skipped", "reward": None}],  # one scored
                # Flaky: a failure is scored and does not pass.
                [{"reward": 1.0}, {"status": "failed", "reward": None, "error_type": "agent"}],
                [{"status": "failed", "reward": None, "error_type": "timeout"}] * 2,
                [{"reward": 0.49}, {"reward": 0.5, "cost_usd": None}],  # flaky, at the edge
            ]
        )
        for i, outcome in enumerate(outcomes)
    ]
    with local_platform.app.state.sessions() as db:
        admin = db.query(User).one()
        ws = seed.workspace(db, identity="acme/evals", owner=admin)
        spec = RunSpec("r", attempts, status=status, n=2, pass_threshold=0.5)
        seed.seed_run(db, local_platform.settings.home, ws=ws, user=admin, spec=spec)
        db.commit()
    ours, official, _ = await views(api, "r")
    assert ours["flaky_rows"] == [0, 3, 5]
    assert ours["errors_by_type"] == {"timeout": 2, "agent": 1}
    assert ours["cost_usd"] == pytest.approx(0.001 * 11)
    assert official["results"]["failed"] == ours["summary"]["failed"] == 3
    assert official["eval_run"]["status"] == ours["eval_run"]["status"] == status
