"""A run's worker is stopped two ways at once: the scheduler's SIGTERM and its own look at
the run's stop flag (`watching_stop`). Both come within a second of each other; the run's
task is cancelled once, so the second does not cut short the outputs the first one's
handling writes (`test_roles.py` stops a run whose scheduler cannot signal it). The stop is
also an event the run's engine halts on (`tests/integration/test_run_stop.py`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from osmosis.platform import create_app
from osmosis.platform.core.settings import Settings
from osmosis.platform.worker.run_worker import _Worker


async def test_a_stop_by_signal_and_by_flag_cancels_the_run_once(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    create_app(settings).state.engine.dispose()  # a migrated home, as a worker finds it
    worker = _Worker(settings, "a-run", 1)
    try:
        run = asyncio.create_task(asyncio.sleep(60))
        await asyncio.sleep(0)
        worker.stop(run, "the run's stop flag is set")
        worker.stop(run, "SIGTERM")  # the scheduler's, a moment later
        assert run.cancelling() == 1
        # And the engine is told by state too: its halt holds if the cancellation is lost.
        assert worker.stop_event.is_set()
        await asyncio.gather(run, return_exceptions=True)
        assert run.cancelled()
    finally:
        worker.close()
