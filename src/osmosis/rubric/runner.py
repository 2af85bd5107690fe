"""Running a rubric over records: judge calls in parallel, retried, cached, summarised.

`evaluate` asks the judge `number` times per record, up to `concurrency` calls at once, skips
every judgement the cache already holds, and returns a `RubricReport` with each record's
scores, explanations, errors and flags and the statistics over them. A judge that gives no
usable verdict yields an error for that judgement, never a score.

    transport = open_transport(target)
    judge = JudgeClient(transport, target)
    report = await evaluate(records.items, RubricSettings(model=path, rubric=text), judge)
    report.overall_statistics()  # {"average": 0.7, "variance": ..., ...}
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from osmosis.eval.model.providers import ModelTarget, ProviderError, Transport
from osmosis.eval.model.retry import RetriesExhausted, RetryPolicy, call_with_retries
from osmosis.rubric.cache import VerdictCache, verdict_key
from osmosis.rubric.judge import (
    ScoreRange,
    Verdict,
    VerdictError,
    build_messages,
    fence_nonce,
    parse_verdict,
    prompt_texts,
    response_format,
)
from osmosis.rubric.records import RubricRecord

__all__ = [
    "Judge",
    "JudgeClient",
    "JudgeFailed",
    "Judgement",
    "RecordResult",
    "RubricReport",
    "RubricSettings",
    "evaluate",
    "statistics",
]

JUDGE_RETRY = RetryPolicy(max_attempts=6, max_elapsed=120.0)
"""Rate limits on a judge are routine in a large file; allow them two minutes to clear."""


@dataclass(frozen=True)
class RubricSettings:
    """What to judge with and how: `RubricSettings(model="openai/gpt-4o-mini", rubric="...")`."""

    model: str
    """The configured model path (part of the cache key)."""
    rubric: str
    """The rubric text."""
    number: int = 1
    """Judgements per record."""
    score_range: ScoreRange = field(default_factory=ScoreRange)
    """The scores the judge may give."""
    concurrency: int = 8
    """Judge calls in flight at once."""

    def __post_init__(self) -> None:
        if self.number < 1:
            raise ValueError(f"number must be at least 1, got {self.number}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {self.concurrency}")
        if not self.rubric.strip():
            raise ValueError("the rubric is empty")


class JudgeFailed(Exception):
    """A judge call failed for good; the message is what the record's error says.

    `outage` is True when the provider kept failing past the retry policy (rate limits,
    server errors, no connection): the rest of the run would only fail the same way.
    """

    def __init__(self, message: str, *, outage: bool = False) -> None:
        super().__init__(message)
        self.outage = outage


class Judge(Protocol):
    """Answers one judge prompt with the model's text; raises `JudgeFailed`."""

    async def ask(self, messages: list[dict[str, str]]) -> str:
        """The judge's reply to `messages`."""
        ...


class JudgeClient:
    """Asks a model through an engine transport: temperature 0, a strict JSON schema (or JSON
    mode once the provider refuses schemas), retries with back-off on 429/5xx.

    judge = JudgeClient(open_transport(target), target)
    text = await judge.ask(messages)
    """

    def __init__(
        self,
        transport: Transport,
        target: ModelTarget,
        *,
        retry: RetryPolicy = JUDGE_RETRY,
        max_tokens: int | None = None,
    ) -> None:
        self._transport = transport
        self._target = target
        self._retry = retry
        self._max_tokens = max_tokens
        self._schema = True
        self.calls = 0
        """Requests sent, retries included."""

    @property
    def uses_schema(self) -> bool:
        """False once the provider refused a JSON schema and JSON mode is used instead."""
        return self._schema

    async def ask(self, messages: list[dict[str, str]]) -> str:
        """The judge's reply text; raises `JudgeFailed` with a readable reason."""
        target = self._target
        if target.needs_key and not target.api_key:
            raise JudgeFailed(
                f"Environment variable '{target.key_env}' is not set; export it to call "
                f"{target.model_path}"
            )
        schema = self._schema
        try:
            return await self._ask(messages, schema=schema)
        except ProviderError as error:
            if not (schema and _refuses_schema(error)):
                raise JudgeFailed(_describe(error)) from None
            # This provider has no structured outputs; JSON mode plus the prompt's format
            # instructions is the next best thing, for every later call as well.
            self._schema = False
        except RetriesExhausted as error:
            raise JudgeFailed(_describe(error.last, attempts=error.attempts), outage=True) from None
        try:
            return await self._ask(messages, schema=False)
        except ProviderError as error:
            raise JudgeFailed(_describe(error)) from None
        except RetriesExhausted as error:
            raise JudgeFailed(_describe(error.last, attempts=error.attempts), outage=True) from None

    async def _ask(self, messages: list[dict[str, str]], *, schema: bool) -> str:
        body: dict[str, Any] = {
            "model": self._target.model,
            "messages": messages,
            "temperature": 0,
            "response_format": response_format(schema=schema),
        }
        if self._max_tokens is not None:
            body["max_tokens"] = self._max_tokens

        async def call() -> Any:
            self.calls += 1
            return await self._transport.complete(body)

        completion = await call_with_retries(call, self._retry)
        choices = completion.payload.get("choices") or []
        choice = choices[0] if choices and isinstance(choices[0], Mapping) else {}
        message = choice.get("message") if isinstance(choice.get("message"), Mapping) else {}
        content = message.get("content") if isinstance(message, Mapping) else None
        if choice.get("finish_reason") == "length":
            raise JudgeFailed("the verdict was cut short by the token limit")
        if not isinstance(content, str) or not content.strip():
            raise JudgeFailed("the judge returned no text")
        return content


def _refuses_schema(error: ProviderError) -> bool:
    if error.status not in (400, 422):
        return False
    text = error.message.lower()
    return any(word in text for word in ("response_format", "json_schema", "schema"))


def _describe(error: ProviderError, *, attempts: int | None = None) -> str:
    where = f"HTTP {error.status}" if error.status is not None else error.cause
    tried = f" after {attempts} attempts" if attempts else ""
    return f"judge call failed{tried} ({where}): {error.message}"


@dataclass(frozen=True)
class Judgement:
    """One judgement of one record: a verdict or an error, never both."""

    run: int
    """Which of the record's judgements, from 0."""
    verdict: Verdict | None = None
    error: str | None = None
    cached: bool = False
    """Whether the verdict came from the cache (no model call)."""


@dataclass
class RecordResult:
    """A record's judgements in run order."""

    record: RubricRecord
    judgements: list[Judgement]

    @property
    def scores(self) -> list[float]:
        return [j.verdict.score for j in self.judgements if j.verdict is not None]

    @property
    def errors(self) -> list[str]:
        return [f"run {j.run + 1}: {j.error}" for j in self.judgements if j.error is not None]

    def to_json(self) -> dict[str, Any]:
        """The record's entry in `rubric_eval_result.json`."""
        verdicts = [j for j in self.judgements if j.verdict is not None]
        return {
            "index": self.record.index,
            "label": self.record.label,
            "line": self.record.line,
            "scores": self.scores,
            "explanations": [j.verdict.explanation for j in verdicts if j.verdict],
            "errors": self.errors,
            "statistics": statistics(self.scores),
            "judgements": [
                {
                    "run": j.run + 1,
                    "score": j.verdict.score if j.verdict else None,
                    "explanation": j.verdict.explanation if j.verdict else None,
                    "error": j.error,
                    "cached": j.cached,
                }
                for j in self.judgements
            ],
            "flags": [
                {
                    "run": j.run + 1,
                    "flag": "score_clamped",
                    "raw_score": j.verdict.raw_score,
                    "score": j.verdict.score,
                }
                for j in verdicts
                if j.verdict is not None and j.verdict.clamped
            ],
        }


def statistics(scores: Sequence[float]) -> dict[str, float] | None:
    """Average, population variance and stdev, min and max; None without scores.

    statistics([0.0, 1.0])  # {"average": 0.5, "variance": 0.25, "stdev": 0.5, ...}
    """
    if not scores:
        return None
    average = math.fsum(scores) / len(scores)
    variance = math.fsum((s - average) ** 2 for s in scores) / len(scores)
    return {
        "average": average,
        "variance": variance,
        "stdev": math.sqrt(variance),
        "min": min(scores),
        "max": max(scores),
    }


@dataclass
class RubricReport:
    """Everything a rubric run produced."""

    settings: RubricSettings
    results: list[RecordResult]
    model_calls: int = 0
    """Requests sent to the model, retries included."""
    cache_hits: int = 0
    """Judgements answered from the cache."""
    duration_s: float = 0.0
    halted: str | None = None
    """Why the run stopped calling the judge early (a provider outage), if it did."""

    @property
    def error_count(self) -> int:
        """Records with at least one failed judgement."""
        return sum(1 for result in self.results if result.errors)

    def overall_statistics(self) -> dict[str, float] | None:
        """Statistics over every score of every record."""
        return statistics([score for result in self.results for score in result.scores])

    def self_consistency(self) -> dict[str, Any] | None:
        """How much the judge disagrees with itself: the stdev of scores within each record,
        averaged (and its maximum), over records with two or more scores; None when n < 2."""
        if self.settings.number < 2:
            return None
        spreads = [
            stats["stdev"]
            for result in self.results
            if len(result.scores) >= 2 and (stats := statistics(result.scores)) is not None
        ]
        return {
            "mean_stdev": math.fsum(spreads) / len(spreads) if spreads else None,
            "max_stdev": max(spreads) if spreads else None,
            "records": len(spreads),
        }

    def to_document(self, *, data_path: str, generated_at: str) -> dict[str, Any]:
        """The `rubric_eval_result.json` document: the reference's layout plus the score
        range, error and flag counts, the judge's self-consistency and the call counts."""
        records = [result.to_json() for result in self.results]
        document: dict[str, Any] = {
            "generated_at": generated_at,
            "model": self.settings.model,
            "rubric": self.settings.rubric,
            "data_path": data_path,
            "number": self.settings.number,
            "score_min": self.settings.score_range.low,
            "score_max": self.settings.score_range.high,
            "overall_statistics": self.overall_statistics(),
            "self_consistency": self.self_consistency(),
            "record_count": len(records),
            "error_count": self.error_count,
            "flagged_count": sum(1 for record in records if record["flags"]),
            "model_calls": self.model_calls,
            "cache_hits": self.cache_hits,
            "duration_s": round(self.duration_s, 3),
            "halted": self.halted,
            "records": records,
        }
        return document


async def evaluate(
    records: Sequence[RubricRecord],
    settings: RubricSettings,
    judge: Judge,
    *,
    cache: VerdictCache | None = None,
    on_judgement: Callable[[RubricRecord, Judgement], None] | None = None,
) -> RubricReport:
    """Judge every record `settings.number` times and return the report.

    Cached verdicts are used without a call; new verdicts are stored as they arrive, so an
    interrupted run keeps what it paid for.

        report = await evaluate(records, settings, judge, cache=cache)
    """
    began = time.monotonic()
    slots: list[list[Judgement | None]] = [[None] * settings.number for _ in records]
    pending: list[tuple[int, int, str]] = []
    hits = 0
    for position, record in enumerate(records):
        for run in range(settings.number):
            key = verdict_key(
                model=settings.model,
                rubric=settings.rubric,
                record=record,
                judgement=run,
                score_range=settings.score_range,
            )
            verdict = cache.get(key) if cache is not None else None
            if verdict is not None:
                hits += 1
                slots[position][run] = Judgement(run, verdict, cached=True)
                if on_judgement is not None:
                    on_judgement(record, slots[position][run])  # type: ignore[arg-type]
            else:
                pending.append((position, run, key))

    halted: list[str] = []

    async def judge_one(position: int, run: int, key: str) -> None:
        record = records[position]
        nonce = fence_nonce(prompt_texts(settings.rubric, record))
        messages = build_messages(settings.rubric, record, settings.score_range, nonce=nonce)
        try:
            if halted:
                # The provider is down: asking again would spend the whole retry budget on
                # every remaining judgement. They stay errors, so a re-run asks for them.
                raise JudgeFailed(f"not judged: the run halted after: {halted[0]}")
            verdict = parse_verdict(await judge.ask(messages), settings.score_range)
        except JudgeFailed as error:
            if error.outage and not halted:
                halted.append(str(error))
            judgement = Judgement(run, error=str(error))
        except VerdictError as error:
            judgement = Judgement(run, error=str(error))
        else:
            judgement = Judgement(run, verdict)
            if cache is not None:
                cache.put(key, verdict)
        slots[position][run] = judgement
        if on_judgement is not None:
            on_judgement(record, judgement)

    work: Iterator[tuple[int, int, str]] = iter(pending)

    async def worker() -> None:
        # A fixed pool pulling from one iterator: at most `concurrency` calls in flight and
        # no task per judgement, however large the file.
        for position, run, key in work:
            await judge_one(position, run, key)

    async with asyncio.TaskGroup() as group:
        for _ in range(min(settings.concurrency, len(pending))):
            group.create_task(worker())

    results = [
        RecordResult(record, [j for j in slot if j is not None])
        for record, slot in zip(records, slots, strict=True)
    ]
    calls = getattr(judge, "calls", 0)
    return RubricReport(
        settings,
        results,
        model_calls=calls if isinstance(calls, int) else 0,
        cache_hits=hits,
        duration_s=time.monotonic() - began,
        halted=halted[0] if halted else None,
    )
