"""The run sink writes each batch of records as one statement over many rows (issue 30.3): on
SQLite and PostgreSQL, every record lands, a later record of a slot replaces the earlier one
(a retried attempt) within a batch and across batches, and the counters follow."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import select

from osmosis.eval.results.records import AttemptRecord
from osmosis.platform import create_app
from osmosis.platform.core.db.run_models import EvalAttempt, EvalRun
from osmosis.platform.worker.run_sink import FLUSH_BATCH, AttemptSink, refresh_counters
from tests.platform.databases import Databases
from tests.platform.test_run_sink import empty_run


def record(row: int, *, status: str = "success", reward: float | None = 1.0) -> AttemptRecord:
    return AttemptRecord(
        row_index=row,
        run_index=0,
        rollout_id=f"{row:032x}",
        source_row_index=row,
        status=status,
        reward=reward,
        tokens=3,
        duration_ms=5.0,
        error_type="agent_error" if status == "failed" else None,
        finished_at=datetime.now(UTC),
    )


async def test_batches_land_whole_and_a_later_record_of_a_slot_replaces_it(
    tmp_path: Path, databases: Databases
) -> None:
    settings = databases.settings(tmp_path / "home")
    platform = create_app(settings)
    sessions = platform.state.sessions
    try:
        run_id = empty_run(sessions, settings.home)
        sink = AttemptSink(sessions, run_id=run_id, pass_threshold=1.0)
        rows = FLUSH_BATCH * 2 + 7  # two full batches and a partial one
        async with sink.flushing():
            for index in range(rows):
                failed = index % 10 == 0
                sink.advance(
                    record(index, status="failed", reward=None) if failed else record(index)
                )
            sink.advance(record(0))  # row 0 retried in the same batch as itself: it passed
        async with sink.flushing():
            sink.advance(record(10))  # row 10 retried in a later batch: it passed too
        with sessions() as db:
            stored = {
                a.row_index: (a.status, a.reward, a.error_type)
                for a in db.scalars(select(EvalAttempt).where(EvalAttempt.run_id == run_id))
            }
            run = db.get(EvalRun, run_id)
            assert run is not None
            counters = (run.completed, run.failed, run.passed, run.tokens)
        assert sorted(stored) == list(range(rows))
        assert stored[0] == stored[10] == ("success", 1.0, None)
        assert stored[20] == ("failed", None, "agent_error")
        failures = len(range(20, rows, 10))
        assert counters == (rows, failures, rows - failures, 3 * rows)
    finally:
        platform.state.engine.dispose()


def _counters(sessions, run_id: str) -> tuple:
    with sessions() as db:
        run = db.get(EvalRun, run_id)
        assert run is not None
        return (run.completed, run.failed, run.skipped, run.graded, run.passed, run.tokens,
                run.avg_reward)  # fmt: skip


async def test_counters_follow_each_batch_as_a_recount_has_them(
    tmp_path: Path, databases: Databases
) -> None:
    """Each flush adds what its batch changes (issue 30): a retry replaces its earlier row's
    counts, skipped attempts leave every denominator, and between flushes the counters equal
    a recount from every attempt (what a resync after a crash leaves)."""
    settings = databases.settings(tmp_path / "home")
    platform = create_app(settings)
    sessions = platform.state.sessions
    try:
        run_id = empty_run(sessions, settings.home)
        sink = AttemptSink(sessions, run_id=run_id, pass_threshold=0.5)
        seen = []
        async with sink.flushing():
            for row in range(10):
                kind = row % 4
                sink.advance(
                    record(row, status="failed", reward=None) if kind == 0
                    else record(row, status="skipped", reward=None) if kind == 1
                    else record(row, reward=0.25 if kind == 2 else 0.75)
                )  # fmt: skip
            await sink.flush()
            seen.append(_counters(sessions, run_id))
            sink.advance(record(0, reward=1.0))  # the failed row 0, retried: it passed
            sink.advance(record(2, status="failed", reward=None))  # graded row 2 now failed
            sink.advance(record(10, reward=0.5))  # a new row
            await sink.flush()
            seen.append(_counters(sessions, run_id))
        # 0 failed→passed(1.0), 1 skip, 2 graded→failed, 3 .75, 4 fail, 5 skip, 6 .25,
        # 7 .75, 8 fail, 9 skip, 10 .5
        assert seen[0] == (10, 3, 3, 4, 2, 30, 0.5)
        assert seen[1][:6] == (11, 3, 3, 5, 4, 33) and abs(seen[1][6] - 3.25 / 5) < 1e-12
        with sessions() as db:
            refresh_counters(db, run_id=run_id, pass_threshold=0.5)
            db.commit()
        recounted = _counters(sessions, run_id)
        assert recounted[:6] == seen[1][:6] and abs(recounted[6] - seen[1][6]) < 1e-12
    finally:
        platform.state.engine.dispose()
