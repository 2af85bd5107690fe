"""The LLM-as-judge scorer behind `osmosis eval rubric`.

Records come from a JSONL file (`read_records`), each is judged `number` times by a model
reached through the engine's transports (`JudgeClient`), verdicts are cached by what decides
them (`VerdictCache`), and `evaluate` returns a `RubricReport` with scores, errors, clamped-score
flags and statistics.

    from osmosis.eval.model.providers import open_transport, resolve_model
    from osmosis.rubric import JudgeClient, RubricSettings, evaluate, read_records

    target = resolve_model("openai/gpt-4o-mini", os.environ, timeout=30)
    judge = JudgeClient(open_transport(target), target)
    report = await evaluate(read_records(path).items, RubricSettings(model=..., rubric=...), judge)

Modules: `records` (input), `judge` (prompt, schema, verdict parsing), `cache` (verdict
store), `runner` (calls, retries, concurrency, statistics).
"""

from osmosis.rubric.cache import VerdictCache, default_cache_dir
from osmosis.rubric.judge import ScoreRange, Verdict, VerdictError, parse_verdict
from osmosis.rubric.records import RecordProblem, RecordSet, RubricRecord, read_records
from osmosis.rubric.runner import (
    JudgeClient,
    JudgeFailed,
    Judgement,
    RecordResult,
    RubricReport,
    RubricSettings,
    evaluate,
    statistics,
)

__all__ = [
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
