"""The verdict cache: keys that change with what decides a verdict, and durable storage."""

from __future__ import annotations

from pathlib import Path

from osmosis.rubric.cache import VerdictCache, default_cache_dir, verdict_key
from osmosis.rubric.judge import ScoreRange, Verdict
from osmosis.rubric.records import RubricRecord

RECORD = RubricRecord(index=0, line=1, label="a", candidate="Paris", ground_truth="Paris")


def key(**changes: object) -> str:
    fields: dict = {
        "model": "openai/judge",
        "rubric": "R",
        "record": RECORD,
        "judgement": 0,
        "score_range": ScoreRange(),
    }
    fields.update(changes)
    return verdict_key(**fields)


def test_key_depends_on_what_decides_the_verdict() -> None:
    base = key()
    assert key() == base
    assert (
        len(
            {
                base,
                key(model="openai/other"),
                key(rubric="R2"),
                key(judgement=1),
                key(score_range=ScoreRange(0, 10)),
                key(record=RubricRecord(index=0, line=1, label="a", candidate="Paris")),
            }
        )
        == 6
    )


def test_key_ignores_label_and_position() -> None:
    moved = RubricRecord(index=5, line=40, label="b", candidate="Paris", ground_truth="Paris")
    assert key(record=moved) == key()


def test_verdicts_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "verdicts.sqlite"
    with VerdictCache.open(path) as cache:
        cache.put("k1", Verdict(0.5, "half"))
        cache.put("k2", Verdict(1.0, "clamped", clamped=True, raw_score=3.0))
    with VerdictCache.open(path) as cache:
        assert len(cache) == 2
        assert cache.get("k1") == Verdict(0.5, "half")
        assert cache.get("k2") == Verdict(1.0, "clamped", clamped=True, raw_score=3.0)
        assert cache.get("missing") is None


def test_default_cache_dir() -> None:
    assert default_cache_dir({"OSMOSIS_HOME": "/srv/o"}) == Path("/srv/o/cache/rubric")
    assert default_cache_dir({}) == Path.home() / ".osmosis" / "cache" / "rubric"
