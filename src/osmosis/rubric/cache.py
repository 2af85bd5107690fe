"""The verdict cache: a judgement already paid for is never bought twice.

A verdict is keyed by the sha256 of everything that decides it: the model, the rubric, the
record's content (not its label or position), the judgement index, the score range and the
prompt version. Only good verdicts are stored; errors are tried again on the next run.

Storage is one SQLite file (stdlib `sqlite3`, WAL journal), committed per verdict, so a run
that is interrupted keeps every verdict it received; a re-run pays only for what is missing.

    with VerdictCache.open(default_cache_dir() / "verdicts.sqlite") as cache:
        key = verdict_key(model="openai/gpt-4o-mini", rubric=r, record=rec, judgement=0,
                          score_range=ScoreRange())
        cache.get(key) or cache.put(key, verdict)
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from osmosis.rubric.judge import PROMPT_VERSION, ScoreRange, Verdict
from osmosis.rubric.records import RubricRecord

__all__ = ["CACHE_FILE", "VerdictCache", "default_cache_dir", "verdict_key"]

CACHE_FILE = "verdicts.sqlite"


def default_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """`$OSMOSIS_HOME/cache/rubric`, else `~/.osmosis/cache/rubric`.

    default_cache_dir({"OSMOSIS_HOME": "/srv/osmosis"})  # Path("/srv/osmosis/cache/rubric")
    """
    env = os.environ if env is None else env
    home = env.get("OSMOSIS_HOME")
    root = Path(home) if home else Path.home() / ".osmosis"
    return root / "cache" / "rubric"


def verdict_key(
    *,
    model: str,
    rubric: str,
    record: RubricRecord,
    judgement: int,
    score_range: ScoreRange,
) -> str:
    """The cache key of one judgement: a hex sha256.

    verdict_key(model="m", rubric="r", record=rec, judgement=0, score_range=ScoreRange())
    """
    material = {
        "prompt_version": PROMPT_VERSION,
        "model": model,
        "rubric": rubric,
        "record": record.content(),
        "judgement": judgement,
        "score_range": [score_range.low, score_range.high],
    }
    canonical = json.dumps(material, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


class VerdictCache:
    """Verdicts by key in one SQLite file; `open` creates it and its directory.

    with VerdictCache.open(path) as cache:
        cache.put(key, Verdict(1.0, "right"))
        cache.get(key)  # Verdict(score=1.0, ...)
    """

    def __init__(self, connection: sqlite3.Connection, path: Path) -> None:
        self._db = connection
        self.path = path

    @classmethod
    def open(cls, path: Path) -> VerdictCache:
        """Open (or create) the cache file at `path`."""
        path.parent.mkdir(parents=True, exist_ok=True)
        # The event loop is the only caller, but closing may happen from a different thread
        # than opening (e.g. under a test runner); every call is serialised by the loop.
        connection = sqlite3.connect(path, timeout=30, check_same_thread=False)
        # WAL with NORMAL sync: each commit survives the process being killed (only a power
        # loss can drop the last few), at a fraction of FULL's fsync cost.
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")
        connection.execute(
            "CREATE TABLE IF NOT EXISTS verdicts ("
            " key TEXT PRIMARY KEY, score REAL NOT NULL, explanation TEXT NOT NULL,"
            " clamped INTEGER NOT NULL, raw_score REAL)"
        )
        connection.commit()
        return cls(connection, path)

    def get(self, key: str) -> Verdict | None:
        """The stored verdict for `key`, or None."""
        row = self._db.execute(
            "SELECT score, explanation, clamped, raw_score FROM verdicts WHERE key = ?", (key,)
        ).fetchone()
        if row is None:
            return None
        score, explanation, clamped, raw_score = row
        return Verdict(float(score), str(explanation), bool(clamped), raw_score)

    def put(self, key: str, verdict: Verdict) -> None:
        """Store a verdict, committed before returning."""
        self._db.execute(
            "INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?, ?, ?)",
            (key, verdict.score, verdict.explanation, int(verdict.clamped), verdict.raw_score),
        )
        self._db.commit()

    def __len__(self) -> int:
        (count,) = self._db.execute("SELECT COUNT(*) FROM verdicts").fetchone()
        return int(count)

    def close(self) -> None:
        """Close the file."""
        self._db.close()

    def __enter__(self) -> VerdictCache:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
