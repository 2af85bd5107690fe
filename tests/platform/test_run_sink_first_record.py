"""A run's first attempt reaches the API at once (issue 30: submit → first attempt recorded):
the run sink writes a record that arrives after a quiet spell without waiting for its next
tick, and still batches the records that follow it. On a real SQLite platform database, with
a tick long enough (an hour) that only the quiet-spell rule can have written anything."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from osmosis.platform import Settings, create_app
from osmosis.platform.core.db.run_models import EvalAttempt, EvalRun
from osmosis.platform.worker.run_sink import AttemptSink
from tests.platform.test_run_sink import empty_run, record

HOUR = 3600.0


def visible(sessions: sessionmaker[Session], run_id: str) -> tuple[list[int], int]:
    """The rows the API would list for the run, and its `completed` counter."""
    with sessions() as db:
        rows = db.scalars(select(EvalAttempt.row_index).where(EvalAttempt.run_id == run_id))
        completed = db.scalar(select(EvalRun.completed).where(EvalRun.id == run_id))
        return sorted(rows), int(completed or 0)


async def test_the_first_record_is_written_at_once_and_the_next_ones_wait_for_the_tick(
    tmp_path: Path,
) -> None:
    settings = Settings(home=tmp_path / "home")
    platform = create_app(settings)
    sessions = platform.state.sessions
    try:
        run_id = empty_run(sessions, settings.home)
        sink = AttemptSink(sessions, run_id=run_id, pass_threshold=1.0, flush_interval=HOUR)
        async with sink.flushing():
            sink.advance(record(0))
            # Without the quiet-spell rule it waits for the hour's tick: 30 s pass without it.
            for _ in range(3000):
                if visible(sessions, run_id) == ([0], 1):
                    break
                await asyncio.sleep(0.01)
            else:
                pytest.fail("the first record was not written while the run went on")
            sink.advance(record(1))
            sink.advance(record(2))
            await asyncio.sleep(0.3)
            # Written a moment ago: these two are batched for the tick (or the run's end).
            assert visible(sessions, run_id) == ([0], 1)
        assert visible(sessions, run_id) == ([0, 1, 2], 3)  # the end writes what is left
    finally:
        platform.state.engine.dispose()
