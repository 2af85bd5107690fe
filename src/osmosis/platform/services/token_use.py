"""When each token was last used, kept in memory and written in batches, never by a request.

Checking a token is a read: a write on every request's path made every API call fail once
the disk was full (issue 25.5). Uses are recorded here, `flush` writes them all in one
transaction off the request path (the app's background task, every `FLUSH_EVERY_SEC`), and
a flush the database refuses keeps them for the next one.

    uses = TokenUses()
    uses.record(token)                 # in the auth check: memory only
    uses.last_used(token)              # what listings show: the newer of memory and database
    uses.flush(sessions)               # raises, keeping them, on failure
    await keep_flushing(uses, sessions)  # the app's lifespan: every 10 s, and at the end
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from datetime import datetime, timedelta

from sqlalchemy import or_, update
from sqlalchemy.orm import Session, sessionmaker

from osmosis.platform.core.db.models import ApiToken, utcnow

logger = logging.getLogger("osmosis.platform.token_use")

# Recording every use would turn each read into a write; a minute's precision is plenty.
LAST_USED_PRECISION = timedelta(minutes=1)
FLUSH_EVERY_SEC = 10.0
LAST_FLUSH_SEC = 5.0


class TokenUses:
    """Tokens used since the last flush, by id, with when (thread-safe: requests run in
    threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, datetime] = {}

    def record(self, token: ApiToken, *, now: datetime | None = None) -> None:
        """Note a use of `token` now, when its stored time is more than a minute old."""
        at = now or utcnow()
        stored = token.last_used_at
        if stored is not None and at - stored <= LAST_USED_PRECISION:
            return
        with self._lock:
            known = self._pending.get(token.id)
            if known is None or at - known > LAST_USED_PRECISION:
                self._pending[token.id] = at

    def last_used(self, token: ApiToken) -> datetime | None:
        """When `token` was last used: a use not yet written counts."""
        with self._lock:
            pending = self._pending.get(token.id)
        stored = token.last_used_at
        if pending is None or (stored is not None and stored >= pending):
            return stored
        return pending

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)

    def flush(self, sessions: sessionmaker[Session]) -> int:
        """Write every pending use in one transaction; how many. On failure (a full disk, a
        database away) they stay pending and the error is raised for the caller to log."""
        with self._lock:
            batch, self._pending = self._pending, {}
        if not batch:
            return 0
        try:
            with sessions() as db:
                for token_id, at in batch.items():
                    db.execute(
                        update(ApiToken)
                        .where(
                            ApiToken.id == token_id,
                            or_(ApiToken.last_used_at.is_(None), ApiToken.last_used_at < at),
                        )
                        .values(last_used_at=at)
                    )
                db.commit()
        except BaseException:
            with self._lock:  # back in line, unless a newer use came meanwhile
                for token_id, at in batch.items():
                    newer = self._pending.get(token_id)
                    if newer is None or newer < at:
                        self._pending[token_id] = at
            raise
        return len(batch)


async def keep_flushing(
    uses: TokenUses, sessions: sessionmaker[Session], *, every: float = FLUSH_EVERY_SEC
) -> None:
    """Flush `uses` every `every` seconds until cancelled, then once more. A refused flush is
    logged (once until one succeeds) and tried again: it never reaches a request."""
    failing = False
    flush: asyncio.Future[int] | None = None
    try:
        while True:
            await asyncio.sleep(every)
            # Shielded: a cancel cannot stop the thread, and the end below waits for it.
            flush = asyncio.ensure_future(asyncio.to_thread(uses.flush, sessions))
            try:
                await asyncio.shield(flush)
            except Exception as error:
                if not failing:
                    logger.warning(
                        "cannot record when %d tokens were last used (%s); trying again "
                        "every %.0f s",
                        len(uses),
                        _brief(error),
                        every,
                    )
                failing = True
            else:
                if failing:
                    logger.info("recorded when tokens were last used again")
                failing = False
    finally:
        # Shutting down: the flush under way ends first (its write must not land after the
        # platform stopped), then one last try; both within LAST_FLUSH_SEC, not waiting long
        # on a database that is away.
        with contextlib.suppress(Exception):
            async with asyncio.timeout(LAST_FLUSH_SEC):
                if flush is not None:
                    with contextlib.suppress(Exception):  # its uses are pending again
                        await asyncio.shield(flush)
                await asyncio.to_thread(uses.flush, sessions)


def _brief(error: Exception) -> str:
    """The driver's own words, one line (not SQLAlchemy's SQL text)."""
    said = str(getattr(error, "orig", None) or error) or type(error).__name__
    return said.splitlines()[0]
