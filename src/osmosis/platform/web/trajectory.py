"""An ATIF trajectory read as a conversation: who said what, which tools were called with what,
what they returned, and what each model call cost in tokens and time.

    convo = read_conversation(run_dir / "trajectories" / "row_0_run_0.json")
    convo.turns[0].role        # "system"
    convo.label, convo.reward  # from the document's extra.osmosis block

A malformed or missing document gives an empty conversation with `problem` saying why, so a
sample page still renders the attempt's numbers.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_BYTES = 20 * 1024 * 1024  # a trajectory larger than this is not rendered inline
# A rollout writes its trajectory itself, so any field may be huge or of any type: one text
# is cut at MAX_TEXT characters (the JSON download has it whole) and the page shows
# STEPS_PER_PAGE steps at a time, so a long agent loop never makes a page of many megabytes.
MAX_TEXT = 20_000
STEPS_PER_PAGE = 100
_ROLES = {"agent": "assistant", "system": "system", "user": "user"}


@dataclass(frozen=True)
class ToolCall:
    call_id: str | None
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolResult:
    call_id: str | None
    content: str


@dataclass(frozen=True)
class CallMetrics:
    """One model call's cost, each None unless the document gave a number."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_ms: float | None = None
    cost_usd: float | None = None

    def __bool__(self) -> bool:
        values = (self.prompt_tokens, self.completion_tokens, self.latency_ms, self.cost_usd)
        return any(value is not None for value in values)


@dataclass(frozen=True)
class Turn:
    step: int
    role: str
    text: str
    model: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    results: list[ToolResult] = field(default_factory=list)
    metrics: CallMetrics = field(default_factory=CallMetrics)


@dataclass(frozen=True)
class Conversation:
    turns: list[Turn]
    label: Any = None
    reward: Any = None
    grader_metrics: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    final_metrics: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None
    osmosis: dict[str, Any] = field(default_factory=dict)
    """The document's `extra.osmosis` block as written."""


def _clip(text: str) -> str:
    if len(text) <= MAX_TEXT:
        return text
    rest = len(text) - MAX_TEXT
    return f"{text[:MAX_TEXT]}\n… {rest:,} more characters (the trajectory JSON has them all)"


def _pretty(value: Any) -> str:
    if isinstance(value, str):
        return _clip(value)
    return _clip(json.dumps(value, indent=2, ensure_ascii=False, default=repr))


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _items(value: Any) -> list[Any]:
    # A string is iterable too; only a real list is a list of steps, calls or results.
    return value if isinstance(value, list) else []


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _count(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None else None


def read_conversation(path: Path) -> Conversation:
    """Read the ATIF document at `path`; problems come back in `problem`, never raised."""
    try:
        if path.is_symlink() or not path.is_file():
            return Conversation(turns=[], problem="no trajectory was recorded for this attempt")
        if path.stat().st_size > MAX_BYTES:
            return Conversation(turns=[], problem="the trajectory is too large to show here")
        document = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except OSError as error:  # its strerror, not the server's path to the file
        return Conversation(turns=[], problem=f"the trajectory cannot be read: {error.strerror}")
    except ValueError as error:
        return Conversation(turns=[], problem=f"the trajectory is not valid JSON: {error}")
    except RecursionError:
        return Conversation(turns=[], problem="the trajectory is nested too deeply to show")
    try:
        return conversation(_mapping(document))
    except RecursionError:  # json.dumps of a value nested deeper than the parser minded
        return Conversation(turns=[], problem="the trajectory is nested too deeply to show")


def conversation(document: dict[str, Any]) -> Conversation:
    turns: list[Turn] = []
    for index, raw in enumerate(_items(document.get("steps"))):
        step = _mapping(raw)
        calls = [
            ToolCall(
                call_id=_opt_str(call.get("tool_call_id")),
                name=_clip(str(call.get("function_name") or "?")),
                arguments=_pretty(call.get("arguments")),
            )
            for call in map(_mapping, _items(step.get("tool_calls")))
        ]
        observation = _mapping(step.get("observation"))
        results = [
            ToolResult(call_id=_opt_str(r.get("source_call_id")), content=_pretty(r.get("content")))
            for r in map(_mapping, _items(observation.get("results")))
        ]
        source = str(step.get("source") or "")
        metrics = _mapping(step.get("metrics"))
        turns.append(
            Turn(
                step=_count(step.get("step_id")) or index + 1,
                role=_ROLES.get(source, source[:40] or "unknown"),
                text=_pretty(step.get("message") or ""),
                model=_opt_str(step.get("model_name")),
                tool_calls=calls,
                results=results,
                metrics=CallMetrics(
                    prompt_tokens=_count(metrics.get("prompt_tokens")),
                    completion_tokens=_count(metrics.get("completion_tokens")),
                    # ATIF keeps it in `extra` (ours since issue 30); older ones beside.
                    latency_ms=_number(
                        metrics.get("latency_ms", _mapping(metrics.get("extra")).get("latency_ms"))
                    ),
                    cost_usd=_number(metrics.get("cost_usd")),
                ),
            )
        )
    extra = _mapping(_mapping(document.get("extra")).get("osmosis"))
    error = extra.get("err_message")
    return Conversation(
        turns=turns,
        label=extra.get("label"),
        reward=extra.get("reward"),
        grader_metrics=_mapping(extra.get("sample_metrics")),
        error=_pretty(error) if error else None,
        final_metrics=_mapping(document.get("final_metrics")),
        osmosis=extra,
    )


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)[:200]


def _text(message: Any) -> str | None:
    if message is None or message == "" or message == []:
        return None
    return message if isinstance(message, str) else json.dumps(message, ensure_ascii=False)


def final_output(document: dict[str, Any]) -> str | None:
    """The attempt's answer: the last assistant step that said something."""
    for raw in reversed(_items(document.get("steps"))):
        step = _mapping(raw)
        if step.get("source") == "agent" and (text := _text(step.get("message"))):
            return text
    return None


def first_user_message(document: dict[str, Any]) -> str | None:
    """The prompt as the trajectory recorded it: the first user step's message."""
    for raw in _items(document.get("steps")):
        step = _mapping(raw)
        if step.get("source") == "user":
            return _text(step.get("message"))
    return None
