"""The run sink writes each batch of records as one statement over many rows (issue 30.3): on
SQLite and PostgreSQL, every record lands, a later record of a slot replaces the earlier one
(a retried attempt) within a batch and across batches, and the counters follow."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import select

from osmosis.eval.results.records import AttemptRecord
from osmosis.platform import create_app
from osmosis.platform.core.db.models import User
from osmosis.platform.core.db.run_models import EvalAttempt, EvalRun
from osmosis.platform.worker.run_sink import FLUSH_BATCH, AttemptSink
from tests.platform.databases import Databases
from tests.web import seed
from tests.web.seed import RunSpec


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
        with sessions() as db:
            admin = db.query(User).one()
            ws = seed.workspace(db, identity="acme/evals", owner=admin)
            spec = RunSpec("r", [])
            run_id = seed.seed_run(db, settings.home, ws=ws, user=admin, spec=spec).id
            db.commit()
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
