"""The worker's mirror of a run's journal in the database: `eval_attempts` and the counters.

    sink = AttemptSink(sessions, run_id="9e1d…", pass_threshold=1.0)
    await sink.resync(run_dir / "events.jsonl")   # after a crash: DB := journal
    async with sink.flushing():
        await run_evaluation(plan, sink)                 # the engine's Reporter

The journal (`events.jsonl`, fsynced by the engine) stays the authority: the engine writes a
record there before it reports it here, so the database can only lag behind it, and a resync
at start catches up. Records are buffered and written from a thread in batches (every 0.25 s
or 100 records), so the database never slows the engine; a record that arrives after a quiet
spell (nothing written for 0.25 s: a run's first attempt) is written at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Float, case, cast, delete, func, select, tuple_, update
from sqlalchemy.orm import Session, sessionmaker

from osmosis.eval.results.records import AttemptRecord
from osmosis.platform.core.db.dialect import upsert
from osmosis.platform.core.db.run_models import EvalAttempt, EvalRun
from osmosis.vocabulary import pass_clause

FLUSH_INTERVAL_SEC = 0.25
FLUSH_BATCH = 100
_RESYNC_BATCH = 500


class AttemptSink:
    """A `Reporter` for `run_evaluation` that records attempts in the database."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        *,
        run_id: str,
        pass_threshold: float,
        flush_interval: float = FLUSH_INTERVAL_SEC,
    ) -> None:
        self._sessions = sessions
        self.run_id = run_id
        self.pass_threshold = pass_threshold
        self._interval = flush_interval
        self._buffer: list[AttemptRecord] = []
        self._full = asyncio.Event()
        self._quiet_from = 0.0  # monotonic: from then on, a new record is written at once
        # The write under way: its thread goes on when the flush awaiting it is cancelled
        # (the run ended meanwhile), and the run must not be called over before it commits.
        self._writing: asyncio.Future[None] | None = None

    # -- Reporter ---------------------------------------------------------------------------
    def stage(self, message: str) -> None:
        """Stages reach logs.txt through the run directory already."""

    def start_progress(self, total: int, done: int, *, pass_threshold: float) -> None:
        """The total is stored when the run is planned."""

    def advance(self, record: AttemptRecord) -> None:
        self._buffer.append(record)
        # After a quiet spell (a run's first attempt) the API shows it now, not a tick later.
        if len(self._buffer) >= FLUSH_BATCH or time.monotonic() >= self._quiet_from:
            self._full.set()

    def log_line(self, line: str) -> None:
        """Rollout output reaches logs.txt through the run directory already."""

    # -- writing ----------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def flushing(self) -> AsyncIterator[None]:
        """Write buffered records in the background while the body runs, and all of them
        when it ends (also on cancellation)."""
        task = asyncio.create_task(self._flush_forever())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await asyncio.shield(self._last_flush())

    async def _last_flush(self) -> None:
        await self.flush()
        # The counters, recounted once from every attempt: exact, as a resync leaves them
        # (the flushes before only added what each batch changed).
        await asyncio.to_thread(self._recount)

    def _recount(self) -> None:
        with self._sessions() as db:
            refresh_counters(db, run_id=self.run_id, pass_threshold=self.pass_threshold)
            db.commit()

    async def _flush_forever(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._full.wait(), self._interval)
            await self.flush()

    async def flush(self) -> None:
        """Write what is buffered; returns once it and any write before it are committed."""
        self._full.clear()
        await self._written()
        if not self._buffer:
            return
        batch, self._buffer = self._buffer, []
        self._quiet_from = time.monotonic() + self._interval
        self._writing = asyncio.ensure_future(asyncio.to_thread(self._write, batch))
        await self._written()

    async def _written(self) -> None:
        writing = self._writing
        if writing is None:
            return
        try:
            await asyncio.shield(writing)
        finally:
            if writing.done():  # its error, if any, is raised once
                self._writing = None

    async def resync(self, journal: Path) -> int:
        """Make `eval_attempts` equal the journal (the latest line per attempt wins); returns
        how many attempts the journal holds."""
        return await asyncio.to_thread(self._resync, journal)

    def _resync(self, journal: Path) -> int:
        with self._sessions() as db:
            db.execute(delete(EvalAttempt).where(EvalAttempt.run_id == self.run_id))
            for batch in _batches(_journal_records(journal), _RESYNC_BATCH):
                _upsert(db, self.run_id, batch)
            refresh_counters(db, run_id=self.run_id, pass_threshold=self.pass_threshold)
            db.commit()
            return int(db.scalar(select(EvalRun.completed).where(EvalRun.id == self.run_id)) or 0)

    def _write(self, batch: list[AttemptRecord]) -> None:
        with self._sessions() as db:
            latest = {(r.row_index, r.run_index): r for r in batch}
            # Counted by what the batch changes, not recounted from every attempt of the run
            # at each flush (quadratic in the run's size; issue 30).
            _advance_counters(db, self.run_id, self.pass_threshold, latest)
            _upsert(db, self.run_id, list(latest.values()))
            db.commit()


def refresh_counters(db: Session, *, run_id: str, pass_threshold: float) -> None:
    """Recompute the run's progress counters from its attempts (as the metrics define them:
    skipped attempts leave every denominator; `graded` = non-skipped with a reward)."""
    scored = EvalAttempt.status != "skipped"
    graded = scored & EvalAttempt.reward.is_not(None)
    row = db.execute(
        select(
            func.count(),
            func.sum(case((EvalAttempt.status == "failed", 1), else_=0)),
            func.sum(case((EvalAttempt.status == "skipped", 1), else_=0)),
            func.sum(case((graded, 1), else_=0)),
            func.sum(case((graded & pass_clause(EvalAttempt.reward, pass_threshold), 1), else_=0)),
            func.avg(case((graded, cast(EvalAttempt.reward, Float)), else_=None)),
            func.sum(func.coalesce(EvalAttempt.tokens, 0)),
        ).where(EvalAttempt.run_id == run_id)
    ).one()
    count, failed, skipped, graded_count, passed, mean, tokens = row
    db.execute(
        update(EvalRun)
        .where(EvalRun.id == run_id)
        .values(
            completed=count or 0,
            failed=failed or 0,
            skipped=skipped or 0,
            graded=graded_count or 0,
            passed=passed or 0,
            avg_reward=float(mean) if mean is not None else None,
            tokens=tokens or 0,
        )
    )


def _advance_counters(
    db: Session,
    run_id: str,
    pass_threshold: float,
    latest: dict[tuple[int, int], AttemptRecord],
) -> None:
    """Add what `latest` changes to the run's counters (before it is upserted): each record
    counts, less the row it replaces (a retried attempt), read in the same transaction. The
    mean reward moves by the change of its sum; `refresh_counters` recounts it exactly."""
    earlier = select(EvalAttempt.status, EvalAttempt.reward, EvalAttempt.tokens).where(
        EvalAttempt.run_id == run_id,
        tuple_(EvalAttempt.row_index, EvalAttempt.run_index).in_(list(latest)),
    )
    replaced = db.connection().execute(earlier).all()
    completed = len(latest) - len(replaced)
    failed = skipped = graded = passed = tokens = 0
    reward_sum = 0.0
    for sign, status, reward, used in [
        *((1, r.status, r.reward, r.tokens) for r in latest.values()),
        *((-1, status, reward, used) for status, reward, used in replaced),
    ]:
        failed += sign * (status == "failed")
        skipped += sign * (status == "skipped")
        tokens += sign * (used or 0)
        if status != "skipped" and reward is not None:  # graded, as `refresh_counters` says
            graded += sign
            passed += sign * bool(pass_clause(reward, pass_threshold))
            reward_sum += sign * reward
    was = func.coalesce(EvalRun.avg_reward, 0.0) * EvalRun.graded
    db.connection().execute(  # no ORM synchronisation: no run object is loaded here
        update(EvalRun)
        .where(EvalRun.id == run_id)
        .values(
            completed=EvalRun.completed + completed,
            failed=EvalRun.failed + failed,
            skipped=EvalRun.skipped + skipped,
            graded=EvalRun.graded + graded,
            passed=EvalRun.passed + passed,
            tokens=EvalRun.tokens + tokens,
            # Every right-hand side reads the row as it was: `graded` is the old count here.
            avg_reward=case(
                (EvalRun.graded + graded > 0, (was + reward_sum) / (EvalRun.graded + graded)),
                else_=None,
            ),
        )
    )


def _journal_records(journal: Path) -> Iterator[AttemptRecord]:
    try:
        handle = journal.open("rb")
    except FileNotFoundError:
        return
    with handle:
        for line in handle:
            if not line.endswith(b"\n"):
                break  # cut short by a crash: the engine treats it as pending too
            with contextlib.suppress(ValueError):
                yield AttemptRecord.model_validate_json(line)


def _batches(records: Iterable[AttemptRecord], size: int) -> Iterator[list[AttemptRecord]]:
    batch: list[AttemptRecord] = []
    for record in records:
        batch.append(record)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _upsert(db: Session, run_id: str, records: list[AttemptRecord]) -> None:
    # One row per (row, attempt): a later record of the same slot (a retry) replaces it.
    latest = {(r.row_index, r.run_index): r for r in records}
    values: list[dict[str, Any]] = [
        {
            "run_id": run_id,
            "row_index": r.row_index,
            "run_index": r.run_index,
            "source_row_index": r.source_row_index,
            "rollout_id": r.rollout_id,
            "status": r.status,
            "reward": r.reward,
            "tokens": r.tokens,
            "duration_ms": r.duration_ms,
            "error_type": r.error_type,
            "cost_usd": r.cost_usd,
            "finished_at": r.finished_at,
        }
        for r in latest.values()
    ]
    # One statement with the rows as parameters (executemany), not the rows inlined in its
    # VALUES: compiled once and cached, 8x less CPU per record than a statement per batch
    # (bench/platform.py profile, issue 30), which the engine's thread shares the GIL with.
    statement = upsert(db, EvalAttempt)
    replaced = {
        key: statement.excluded[key]
        for key in values[0]
        if key not in ("run_id", "row_index", "run_index")
    }
    # On the session's connection, not through the session: the ORM's bulk insert splits the
    # rows into a statement per run of rows with the same None columns (~15 per batch of
    # 100 with mixed outcomes); the connection sends them as one executemany.
    db.connection().execute(
        statement.on_conflict_do_update(
            index_elements=["run_id", "row_index", "run_index"], set_=replaced
        ),
        values,
    )
