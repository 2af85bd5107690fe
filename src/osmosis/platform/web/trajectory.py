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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_BYTES = 20 * 1024 * 1024  # a trajectory larger than this is not rendered inline
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
class Turn:
    step: int
    role: str
    text: str
    model: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    results: list[ToolResult] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Conversation:
    turns: list[Turn]
    label: Any = None
    reward: Any = None
    grader_metrics: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    final_metrics: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None


def _pretty(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, ensure_ascii=False, default=repr)


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def read_conversation(path: Path) -> Conversation:
    """Read the ATIF document at `path`; problems come back in `problem`, never raised."""
    try:
        if path.is_symlink() or not path.is_file():
            return Conversation(turns=[], problem="no trajectory was recorded for this attempt")
        if path.stat().st_size > MAX_BYTES:
            return Conversation(turns=[], problem="the trajectory is too large to show here")
        document = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError) as error:
        return Conversation(turns=[], problem=f"the trajectory cannot be read: {error}")
    return conversation(_mapping(document))


def conversation(document: dict[str, Any]) -> Conversation:
    turns: list[Turn] = []
    for index, raw in enumerate(document.get("steps") or []):
        step = _mapping(raw)
        calls = [
            ToolCall(
                call_id=_opt_str(call.get("tool_call_id")),
                name=str(call.get("function_name") or "?"),
                arguments=_pretty(call.get("arguments")),
            )
            for call in map(_mapping, step.get("tool_calls") or [])
        ]
        observation = _mapping(step.get("observation"))
        results = [
            ToolResult(call_id=_opt_str(r.get("source_call_id")), content=_pretty(r.get("content")))
            for r in map(_mapping, observation.get("results") or [])
        ]
        source = str(step.get("source") or "")
        turns.append(
            Turn(
                step=int(step.get("step_id") or index + 1),
                role=_ROLES.get(source, source or "unknown"),
                text=_pretty(step.get("message") or ""),
                model=_opt_str(step.get("model_name")),
                tool_calls=calls,
                results=results,
                metrics=_mapping(step.get("metrics")),
            )
        )
    extra = _mapping(_mapping(document.get("extra")).get("osmosis"))
    error = extra.get("err_message")
    return Conversation(
        turns=turns,
        label=extra.get("label"),
        reward=extra.get("reward"),
        grader_metrics=_mapping(extra.get("sample_metrics")),
        error=str(error) if error else None,
        final_metrics=_mapping(document.get("final_metrics")),
    )


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)
