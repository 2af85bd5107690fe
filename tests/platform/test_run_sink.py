"""The worker's database mirror of a run's journal (osmosis.platform.worker.run_sink), on a real
SQLite platform database: what the engine reported is committed before the run is called
over."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from osmosis.eval.results.records import AttemptRecord
from osmosis.platform import Settings, create_app
from osmosis.platform.core.db.models import User
from osmosis.platform.core.db.run_models import EvalAttempt, EvalRun
from osmosis.platform.worker.run_sink import FLUSH_INTERVAL_SEC, AttemptSink
from tests.web import seed
from tests.web.seed import RunSpec


def record(row: int) -> AttemptRecord:
    return AttemptRecord(
        row_index=row,
        run_index=0,
        rollout_id=f"{row:032x}",
        source_row_index=row,
        status="success",
        reward=1.0,
        tokens=3,
        duration_ms=5.0,
        finished_at=datetime.now(UTC),
    )


def empty_run(sessions: sessionmaker[Session], home: Path) -> str:
    """The id of a run with no attempt yet, in a workspace of the platform's admin."""
    with sessions() as db:
        admin = db.query(User).one()
        ws = seed.workspace(db, identity="acme/evals", owner=admin)
        run_id = seed.seed_run(db, home, ws=ws, user=admin, spec=RunSpec("r", [])).id
        db.commit()
    return run_id


async def test_a_write_under_way_when_the_run_ends_is_committed_before_flushing_returns(
    tmp_path: Path,
) -> None:
    # CI saw a retried run called finished with its last records not yet in the table: the
    # background write was cancelled mid-thread and the final flush found nothing to write.
    settings = Settings(home=tmp_path / "home")
    platform = create_app(settings)
    sessions = platform.state.sessions
    run_id = empty_run(sessions, settings.home)
    sink = AttemptSink(sessions, run_id=run_id, pass_threshold=1.0)
    assert settings.database_url is not None
    holder = sqlite3.connect(settings.database_url.removeprefix("sqlite:///"))
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the database for a moment
    try:
        async with sink.flushing():
            sink.advance(record(0))
            sink.advance(record(1))
            await asyncio.sleep(FLUSH_INTERVAL_SEC * 2)  # the background write is waiting
            asyncio.get_running_loop().call_later(0.5, holder.rollback)
        with sessions() as db:
            stored = db.scalar(select(func.count()).where(EvalAttempt.run_id == run_id))
            completed = db.scalar(select(EvalRun.completed).where(EvalRun.id == run_id))
        assert (stored, completed) == (2, 2)
    finally:
        holder.rollback()
        holder.close()
        platform.state.engine.dispose()
