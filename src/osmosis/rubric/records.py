"""Reading the records a rubric judges: one JSON object per line of a JSONL file.

A record names its candidate either as a chat (`messages`: the last non-empty assistant
message is judged, as a string or as text parts) or directly (`solution_str`), and may carry
`ground_truth`, `original_input`, `metadata` and a label (`id` or `conversation_id`).
Malformed lines are collected with their line numbers, never silently dropped.

    records = read_records(Path("data.jsonl"))
    records.items[0].candidate, [p.line for p in records.problems]
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["RecordProblem", "RecordSet", "RubricRecord", "parse_record", "read_records"]


@dataclass(frozen=True)
class RubricRecord:
    """One candidate to judge, with the context the judge may see.

    RubricRecord(index=0, line=1, label="record[0]", candidate="Paris")
    """

    index: int
    """Position among the file's valid records, from 0."""
    line: int
    """The line of the file it came from, from 1."""
    label: str
    """`id`, else `conversation_id`, else `record[<index>]`."""
    candidate: str
    """The text being judged."""
    ground_truth: str | None = None
    """A reference answer, when the record has one."""
    original_input: str | None = None
    """The prompt that produced the candidate, when the record has one."""
    metadata: Mapping[str, Any] | None = field(default=None, hash=False)
    """Free-form context shown to the judge as JSON."""

    def content(self) -> dict[str, Any]:
        """What the judge sees of this record; the label and position are not part of it."""
        return {
            "candidate": self.candidate,
            "ground_truth": self.ground_truth,
            "original_input": self.original_input,
            "metadata": self.metadata,
        }


@dataclass(frozen=True)
class RecordProblem:
    """A line that could not be used: `RecordProblem(line=3, message="not valid JSON: ...")`."""

    line: int
    message: str


@dataclass(frozen=True)
class RecordSet:
    """The usable records of a file and the problems of the others."""

    items: list[RubricRecord]
    problems: list[RecordProblem]


class RecordError(ValueError):
    """A record object that cannot be judged; the message says why."""


def _text_of(content: Any) -> str:
    """A message's text: its string content, or its text parts joined by newlines."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and part.get("type") == "text":
                text = part.get("text")
                if isinstance(text, str):
                    parts.append(text)
        return "\n".join(parts)
    return ""


def _candidate(obj: Mapping[str, Any]) -> str:
    messages = obj.get("messages")
    if messages is not None:
        if not isinstance(messages, list):
            raise RecordError("'messages' must be a list of chat messages")
        for message in reversed(messages):
            if isinstance(message, Mapping) and message.get("role") == "assistant":
                text = _text_of(message.get("content"))
                if text.strip():
                    return text
        raise RecordError("'messages' has no non-empty assistant message")
    solution = obj.get("solution_str")
    if solution is None:
        raise RecordError("the record has neither 'messages' nor 'solution_str'")
    if not isinstance(solution, str):
        raise RecordError("'solution_str' must be a string")
    return solution


def _optional_text(obj: Mapping[str, Any], key: str) -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float, bool)):
        return json.dumps(value)
    raise RecordError(f"'{key}' must be a string")


def parse_record(obj: Any, *, index: int, line: int) -> RubricRecord:
    """A `RubricRecord` from one decoded JSON line; raises `RecordError` when unusable.

    parse_record({"solution_str": "4", "id": "q1"}, index=0, line=1).label  # "q1"
    """
    if not isinstance(obj, Mapping):
        raise RecordError("each line must be a JSON object")
    candidate = _candidate(obj)
    metadata = obj.get("metadata")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise RecordError("'metadata' must be an object")
    label = obj.get("id")
    if label is None:
        label = obj.get("conversation_id")
    return RubricRecord(
        index=index,
        line=line,
        label=str(label) if label is not None else f"record[{index}]",
        candidate=candidate,
        ground_truth=_optional_text(obj, "ground_truth"),
        original_input=_optional_text(obj, "original_input"),
        metadata=dict(metadata) if metadata is not None else None,
    )


def read_records(path: Path) -> RecordSet:
    """Every usable record of a JSONL file, and a problem for each line that is not.

    Blank lines are ignored. Raises `OSError` when the file cannot be read.

        read_records(Path("data.jsonl")).problems  # [RecordProblem(line=3, ...)]
    """
    items: list[RubricRecord] = []
    problems: list[RecordProblem] = []
    with path.open(encoding="utf-8") as handle:
        for number, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except ValueError as error:
                problems.append(RecordProblem(number, f"not valid JSON: {error}"))
                continue
            try:
                items.append(parse_record(obj, index=len(items), line=number))
            except RecordError as error:
                problems.append(RecordProblem(number, str(error)))
    return RecordSet(items, problems)
