"""What a run will spend before it runs: model calls, tokens and dollars, with a range.

    estimate = estimate_run(plan)       # osmosis.eval.host.plan.RunPlan; nothing is dispatched
    estimate.tokens.expected, estimate.tokens.low, estimate.tokens.high
    estimate.basis                      # "history" (an earlier run of the rollout) or "dataset"
    estimate_spend(SpendQuestion(...))  # the same without a plan (`eval submit`)

Per attempt, from the newest earlier run of the same rollout under the runs root (the run
itself when it is resumed) that recorded attempts with tokens: its journal's tokens per
attempt (mean; the range from its 10th to 90th percentile) and its `metrics.json` calls per
attempt. Without one, from the selected rows' prompts, on a stated assumption: one model call
per attempt (range one to four) sending the prompt (about four characters a token) and
receiving `ASSUMED_COMPLETION_TOKENS` (range a quarter to four times that). Times the attempts
left to run, times the price (the config's override, else LiteLLM's table; none: no cost).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from osmosis.eval.model.pricing import Price, price_for

if TYPE_CHECKING:
    from osmosis.eval.host.plan import RunPlan

__all__ = [
    "ASSUMED_COMPLETION_TOKENS",
    "Estimate",
    "Figure",
    "SpendQuestion",
    "estimate_run",
    "estimate_spend",
    "prompt_tokens",
]

ASSUMED_COMPLETION_TOKENS = 512
"""Completion tokens per call assumed when no earlier run says (range 128 to 2048)."""
CHARS_PER_TOKEN = 4
"""The usual rule of thumb for English text with BPE tokenizers."""
MESSAGE_OVERHEAD_TOKENS = 4
"""Tokens a chat template adds per message (role markers)."""
ASSUMED_CALLS = (1, 1, 4)
"""Model calls per attempt assumed when no earlier run says: expected, low, high."""


@dataclass(frozen=True)
class Figure:
    """An estimated quantity: `Figure(expected=1200, low=900, high=1800)`."""

    expected: float
    low: float
    high: float

    def scaled(self, factor: float) -> Figure:
        return Figure(self.expected * factor, self.low * factor, self.high * factor)

    def times(self, other: Figure) -> Figure:
        return Figure(self.expected * other.expected, self.low * other.low, self.high * other.high)


@dataclass(frozen=True)
class Estimate:
    """A pre-run estimate for the attempts a run has left."""

    model: str
    attempts: int
    """Attempts this invocation would run (all of them, or what a resume has left)."""
    basis: str
    """`history` (an earlier run of the same rollout) or `dataset` (the prompts' sizes)."""
    source: str
    """Where the per-attempt figures come from, in words."""
    calls_per_attempt: Figure
    tokens_per_attempt: Figure
    calls: Figure
    tokens: Figure
    cost_usd: Figure | None
    """None when the model has no price (LiteLLM lists none and the config sets none)."""
    price_source: str | None

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("calls", "tokens", "cost_usd", "calls_per_attempt", "tokens_per_attempt"):
            value = data[key]
            if value is not None and key != "cost_usd":
                data[key] = {name: round(number, 2) for name, number in value.items()}
        return data


@dataclass(frozen=True)
class SpendQuestion:
    """What an estimate needs to know of a run."""

    rollout: str
    model: str
    attempts: int
    runs_root: Path
    """Where earlier runs of the rollout are looked for (`.osmosis/evals`)."""
    prompt_tokens: Callable[[], float] | None
    """The mean prompt size of the rows, in tokens (`prompt_tokens`); None: not known."""
    input_usd_per_mtok: float | None = None
    output_usd_per_mtok: float | None = None


def estimate_run(plan: RunPlan) -> Estimate:
    """The estimate for `plan` (see the module docstring); reads files, dispatches nothing."""
    from osmosis.eval.inputs.dataset import read_rows

    evaluation = plan.config.evaluation
    return _estimate(
        SpendQuestion(
            rollout=plan.config.experiment.rollout,
            model=plan.config.experiment.model_path,
            attempts=max(plan.total_work_items - _recorded(plan.run_dir / "events.jsonl"), 0),
            runs_root=plan.run_dir.parent,
            prompt_tokens=lambda: prompt_tokens(
                row.messages for row in read_rows(plan.dataset.path, plan.selection)
            ),
            input_usd_per_mtok=evaluation.input_usd_per_mtok,
            output_usd_per_mtok=evaluation.output_usd_per_mtok,
        )
    )


def estimate_spend(question: SpendQuestion) -> Estimate | None:
    """The estimate for a run described by `question`; None when neither an earlier run nor
    the prompts say anything."""
    if question.prompt_tokens is None and _history(question) is None:
        return None
    return _estimate(question)


def _estimate(question: SpendQuestion) -> Estimate:
    attempts = question.attempts
    history = _history(question)
    if history is not None:
        source_dir, seen, calls = history
        basis = "history"
        source = f"earlier run {source_dir.name} ({len(seen)} attempts recorded)"
        mean = sum(seen) / len(seen)
        tokens_per_attempt = Figure(
            mean, min(_percentile(seen, 0.1), mean), max(_percentile(seen, 0.9), mean)
        )
        calls_per_attempt = Figure(calls, calls, calls)
        share = _prompt_share(source_dir)
        prompt_share = Figure(share, share, share)
    else:
        basis = "dataset"
        assert question.prompt_tokens is not None  # estimate_spend checked it
        prompt = question.prompt_tokens()
        expected, low, high = ASSUMED_CALLS
        completion = Figure(
            ASSUMED_COMPLETION_TOKENS, ASSUMED_COMPLETION_TOKENS / 4, ASSUMED_COMPLETION_TOKENS * 4
        )
        calls_per_attempt = Figure(expected, low, high)
        per_call = Figure(
            prompt + completion.expected, prompt + completion.low, prompt + completion.high
        )
        tokens_per_attempt = calls_per_attempt.times(per_call)
        source = (
            f"no earlier run of rollout {question.rollout!r}: the rows' "
            f"prompts (~{prompt:.0f} tokens at {CHARS_PER_TOKEN} characters a token), assumed "
            f"{expected} model call per attempt (range {low}-{high}) answered with "
            f"{ASSUMED_COMPLETION_TOKENS} tokens (range {completion.low:.0f}-"
            f"{completion.high:.0f})"
        )
        prompt_share = Figure(
            prompt / per_call.expected, prompt / per_call.low, prompt / per_call.high
        )
    price, price_source = _price(question)
    tokens = tokens_per_attempt.scaled(attempts)
    cost = None
    if price is not None:
        # Prompt and completion tokens in the proportion the source saw (or assumed).
        cost = tokens.times(
            Figure(
                *(
                    share * price.input_per_token + (1 - share) * price.output_per_token
                    for share in (prompt_share.expected, prompt_share.low, prompt_share.high)
                )
            )
        )
    return Estimate(
        model=question.model,
        attempts=attempts,
        basis=basis,
        source=source,
        calls_per_attempt=calls_per_attempt,
        tokens_per_attempt=tokens_per_attempt,
        calls=calls_per_attempt.scaled(attempts),
        tokens=tokens,
        cost_usd=cost,
        price_source=price_source,
    )


def _records(journal: Path) -> list[dict[str, Any]]:
    if not journal.is_file():
        return []
    found = []
    for line in journal.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a torn last line: the engine ignores it too
        if isinstance(record, dict):
            found.append(record)
    return found


def _recorded(journal: Path) -> int:
    return len({(r.get("row_index"), r.get("run_index")) for r in _records(journal)})


def _history(question: SpendQuestion) -> tuple[Path, list[int], float] | None:
    """The newest run under the runs root of the same rollout (and model, when one has it)
    that recorded attempts with tokens: its directory, tokens per attempt, calls per attempt."""
    root = question.runs_root
    if not root.is_dir():
        return None
    rollout, model = question.rollout, question.model
    candidates: list[tuple[bool, str, Path]] = []
    for directory in root.iterdir():
        try:
            manifest = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        inputs = manifest.get("inputs") or {}
        if (inputs.get("rollout") or {}).get("name") != rollout:
            continue
        same_model = inputs.get("model_path") == model
        candidates.append((same_model, str(manifest.get("created_at", "")), directory))
    for _, _, directory in sorted(candidates, reverse=True):
        records = _records(directory / "events.jsonl")
        tokens = [r["tokens"] for r in records if isinstance(r.get("tokens"), int)]
        if not tokens:
            continue
        calls = _calls_per_attempt(directory, len(records))
        return directory, tokens, calls
    return None


def _bridge(directory: Path) -> dict[str, Any]:
    try:
        metrics = json.loads((directory / "metrics.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    bridge = (metrics.get("eval_run") or {}).get("bridge") or {}
    return bridge if isinstance(bridge, dict) else {}


def _calls_per_attempt(directory: Path, attempts: int) -> float:
    """Calls the run forwarded per attempt it recorded (`metrics.json`); 1 when not known."""
    calls = _bridge(directory).get("spent_calls")
    if isinstance(calls, int) and calls > 0 and attempts > 0:
        return calls / attempts
    return 1.0


def _prompt_share(directory: Path) -> float:
    """The share of prompt tokens in the run's tokens (its journal); 1 when not split."""
    records = _records(directory / "events.jsonl")
    prompt = sum(r.get("prompt_tokens") or 0 for r in records)
    completion = sum(r.get("completion_tokens") or 0 for r in records)
    return prompt / (prompt + completion) if prompt + completion else 1.0


def prompt_tokens(rows: Iterable[Sequence[Mapping[str, str]]]) -> float:
    """The mean prompt size of `rows` (each its chat messages), in tokens: characters /
    CHARS_PER_TOKEN, plus MESSAGE_OVERHEAD_TOKENS a message."""
    sizes = [
        sum(
            math.ceil(len(message.get("content", "")) / CHARS_PER_TOKEN) + MESSAGE_OVERHEAD_TOKENS
            for message in messages
        )
        for messages in rows
    ]
    return sum(sizes) / len(sizes) if sizes else 0.0


def _price(question: SpendQuestion) -> tuple[Price | None, str | None]:
    given_in, given_out = question.input_usd_per_mtok, question.output_usd_per_mtok
    if given_in is not None and given_out is not None:
        price = Price(input_per_token=given_in / 1e6, output_per_token=given_out / 1e6)
        return price, "the config's input_usd_per_mtok and output_usd_per_mtok"
    listed = price_for(question.model)
    return (listed, "LiteLLM's price table") if listed is not None else (None, None)


def _percentile(values: Sequence[int] | Iterable[int], fraction: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    position = fraction * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)
