"""The public names of `osmosis.rubric`, pinned so a change to them is deliberate."""

from __future__ import annotations

import osmosis.rubric


def test_public_names() -> None:
    assert osmosis.rubric.__all__ == [
        "JudgeClient",
        "JudgeFailed",
        "Judgement",
        "RecordProblem",
        "RecordResult",
        "RecordSet",
        "RubricRecord",
        "RubricReport",
        "RubricSettings",
        "ScoreRange",
        "Verdict",
        "VerdictCache",
        "VerdictError",
        "default_cache_dir",
        "evaluate",
        "parse_verdict",
        "read_records",
        "statistics",
    ]
    assert osmosis.rubric.__all__ == sorted(osmosis.rubric.__all__)
    for name in osmosis.rubric.__all__:
        assert getattr(osmosis.rubric, name).__doc__
