"""The durable record of one finished attempt, and the `index.jsonl` row made from it.

An attempt is one rollout of one dataset row, keyed by `(row_index, run_index)`. The engine
writes one `AttemptRecord` the moment an attempt ends; resume skips what is recorded, and every
aggregate is recomputed from the records (see `osmosis.eval.results.metrics`).

    record = AttemptRecord(row_index=0, run_index=0, rollout_id=uuid4().hex, ...)
    index_row(record)  # {"row_index": 0, "run_index": 0, "rollout_id": "…", ...}

The shapes around a record live here too, so that the engine, `classify` and the results sink
share them without importing one another: the `WorkItem` an attempt starts from, the
`PolicyCall`s the bridge counted for it, and the `FinishedAttempt` the sink stores.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, Protocol

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from osmosis.rollout.types import Messages
from osmosis.vocabulary import ATTEMPT_STATUSES as STATUSES
from osmosis.vocabulary import AttemptStatus

__all__ = [
    "RECORD_SCHEMA_VERSION",
    "STATUSES",
    "TRAJECTORY_FILENAME_PATTERN",
    "AttemptRecord",
    "AttemptStatus",
    "FinishedAttempt",
    "PolicyCall",
    "WorkItem",
    "index_row",
    "journal_entry",
    "lint_index_row",
]

RECORD_SCHEMA_VERSION: Final = 1
"""The `schema_version` this osmosis writes and reads; bump it when a field changes meaning."""

TRAJECTORY_FILENAME_PATTERN: Final = r"^trajectory[A-Za-z0-9._-]*\.json$"

_ROLLOUT_ID = re.compile(r"^[0-9a-f]{32}$")
_TRAJECTORY_FILENAME = re.compile(TRAJECTORY_FILENAME_PATTERN)


class AttemptRecord(BaseModel):
    """One finished attempt: what happened, what it scored and what it cost.

    Reward is trusted only where the reference trusts it: a skipped attempt never carries one,
    and a failed attempt may (an imported run can hold such rows, and the metrics count them).

    record = AttemptRecord.model_validate_json(line)
    record.status, record.reward  # ("success", 1.0)
    """

    # The scalar fields are Strict*: a journal line with "row_index": "3" or "reward": true is
    # corrupt, not something to coerce quietly. No NaN or infinity in any float, as in the SDK.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    schema_version: Literal[1] = RECORD_SCHEMA_VERSION
    """Version of this record's shape."""
    row_index: StrictInt = Field(ge=0)
    """Position of the row inside the selected set (0..N-1); what the platform shows."""
    run_index: StrictInt = Field(ge=0)
    """Which attempt of the row this is (0..n-1)."""
    rollout_id: StrictStr
    """Fresh id of this attempt's rollout: 32 lowercase hex characters (`uuid4().hex`)."""
    source_row_index: StrictInt = Field(ge=0)
    """Offset of the row in the dataset file; local bookkeeping only."""
    status: AttemptStatus
    """How the attempt ended."""
    reward: StrictFloat | None = None
    """The grader's finite reward; None when ungraded or skipped."""
    tokens: StrictInt | None = Field(default=None, ge=0)
    """Total model tokens the attempt used (prompt + completion)."""
    prompt_tokens: StrictInt | None = Field(default=None, ge=0)
    """Prompt tokens, when the bridge could count them separately."""
    completion_tokens: StrictInt | None = Field(default=None, ge=0)
    """Completion tokens, when the bridge could count them separately."""
    cost_usd: StrictFloat | None = Field(default=None, ge=0)
    """Provider cost of the attempt in US dollars; None when no price is known."""
    duration_ms: StrictFloat = Field(ge=0)
    """Wall time from dispatch to the terminal result, in milliseconds."""
    error_type: StrictStr | None = Field(default=None, min_length=1)
    """Category of a failure, such as `timeout`, `agent_error`, `validation_error`."""
    error_message: StrictStr | None = None
    """Human-readable detail of a failure, already redacted."""
    reward_explanation: StrictStr | None = None
    """Why the grader gave its reward, when it said (`ctx.set_reward(r, explanation=...)`);
    redacted like the error message."""
    trajectory_filename: StrictStr | None = None
    """Name of the attempt's ATIF trajectory file, when one was written."""
    resumed: StrictBool = False
    """True when the result was carried over from an earlier invocation of the run."""
    endpoint: StrictStr | None = None
    """The rollout endpoint that ran the attempt (`scripted-1`); None in older journals."""
    node: StrictStr | None = None
    """The machine that endpoint ran on (`local` for this machine); None in older journals."""
    finished_at: AwareDatetime
    """When the attempt reached its terminal state."""

    @field_validator("schema_version", mode="before")
    @classmethod
    def _known_version(cls, value: object) -> object:
        # Say plainly that the record is from another osmosis, rather than "Input should be 1".
        if value != RECORD_SCHEMA_VERSION or isinstance(value, bool):
            raise ValueError(
                f"unsupported attempt record schema_version {value!r}; "
                f"this osmosis reads version {RECORD_SCHEMA_VERSION}"
            )
        return value

    @field_validator("rollout_id")
    @classmethod
    def _hex_rollout_id(cls, value: str) -> str:
        if not _ROLLOUT_ID.fullmatch(value):
            raise ValueError(f"rollout_id must be 32 lowercase hex characters, got {value!r}")
        return value

    @field_validator("trajectory_filename")
    @classmethod
    def _trajectory_name(cls, value: str | None) -> str | None:
        if value is not None and not _TRAJECTORY_FILENAME.fullmatch(value):
            raise ValueError(
                f"trajectory_filename must match {TRAJECTORY_FILENAME_PATTERN}, got {value!r}"
            )
        return value

    @model_validator(mode="after")
    def _status_rules(self) -> AttemptRecord:
        problems: list[str] = []
        if self.status == "skipped" and self.reward is not None:
            # remove_sample takes the attempt out of scoring; a reward would sneak it back in.
            problems.append("a skipped attempt carries no reward")
        if self.status == "failed" and self.error_type is None:
            problems.append("a failed attempt needs an error_type")
        if self.status != "failed" and (
            self.error_type is not None or self.error_message is not None
        ):
            problems.append(f"a {self.status} attempt carries no error_type or error_message")
        if problems:
            raise ValueError("; ".join(problems))
        return self


def index_row(record: AttemptRecord) -> dict[str, Any]:
    """Return the record as one `index.jsonl` row: reference key order, None keys omitted.

    index_row(record)
    # {"row_index": 1, "run_index": 0, "rollout_id": "9249…", "status": "failed", ...}
    """
    row: dict[str, Any] = {
        "row_index": record.row_index,
        "run_index": record.run_index,
        "rollout_id": record.rollout_id,
        "trajectory_filename": record.trajectory_filename,
        "status": record.status,
        "reward": record.reward,
        "tokens": record.tokens,
        "duration_ms": record.duration_ms,
        "error_type": record.error_type,
        # The reference writes `resumed` only as `true`; a fresh result leaves the key out.
        "resumed": True if record.resumed else None,
    }
    return {key: value for key, value in row.items() if value is not None}


def journal_entry(record: AttemptRecord) -> dict[str, Any]:
    """Return the record as one JSON-ready journal line, None keys omitted.

    line = json.dumps(journal_entry(record))
    AttemptRecord.model_validate_json(line) == record  # True
    """
    return record.model_dump(mode="json", exclude_none=True)


def _is_number(value: object) -> bool:
    # JSON booleans arrive as Python bools, which are ints; the platform rejects them.
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def lint_index_row(row: Mapping[str, Any]) -> list[str]:
    """List every way an `index.jsonl` row breaks the platform's rules; empty means accepted.

    lint_index_row({"row_index": "0", "run_index": 0, "status": "success"})
    # ["row_index must be a number", "duration_ms must be a number", ...]
    """
    if not isinstance(row, Mapping):
        return ["row must be a JSON object"]
    problems: list[str] = []
    null_keys = sorted(str(key) for key, value in row.items() if value is None)
    if null_keys:
        problems.append(f"None-valued keys must be omitted: {', '.join(null_keys)}")
    for key in ("row_index", "run_index", "duration_ms"):
        if key in row and row[key] is None:
            continue  # already reported as a null key
        if not _is_number(row.get(key)):
            problems.append(f"{key} must be a number")
    status = row.get("status")
    if status is not None and status not in STATUSES:
        problems.append(f"status must be one of {', '.join(STATUSES)}; got {status!r}")
    elif "status" not in row:
        problems.append(f"status must be one of {', '.join(STATUSES)}; it is missing")
    rollout_id = row.get("rollout_id")
    if rollout_id is not None:
        if not (isinstance(rollout_id, str) and _ROLLOUT_ID.fullmatch(rollout_id)):
            problems.append(f"rollout_id must be 32 lowercase hex characters; got {rollout_id!r}")
    elif row.get("sample_id") is None:
        problems.append("a row needs a rollout_id or sample_id")
    filename = row.get("trajectory_filename")
    if filename is not None and not (
        isinstance(filename, str) and _TRAJECTORY_FILENAME.fullmatch(filename)
    ):
        problems.append(
            f"trajectory_filename must match {TRAJECTORY_FILENAME_PATTERN}; got {filename!r}"
        )
    return problems


@dataclass(frozen=True)
class WorkItem:
    """One attempt to make: a selected row and which of its `n` attempts this is.

    item = WorkItem(row_index=0, run_index=1, source_row_index=7, messages=row.messages,
                    label=row.label, metadata=None)
    """

    row_index: int
    run_index: int
    source_row_index: int
    messages: Messages
    label: str | None
    metadata: dict[str, Any] | None


class PolicyCall(Protocol):
    """What the engine reads of one bridge call (see `osmosis.eval.model.bridge.CallRecord`)."""

    @property
    def prompt_tokens(self) -> int | None: ...
    @property
    def completion_tokens(self) -> int | None: ...
    @property
    def cost_usd(self) -> float | None: ...
    @property
    def latency_ms(self) -> float: ...
    @property
    def model(self) -> str | None: ...
    @property
    def status_code(self) -> int: ...
    @property
    def response_message(self) -> Mapping[str, Any] | None: ...


@dataclass(frozen=True)
class FinishedAttempt:
    """What the results sink stores for one attempt.

    await sink.store(FinishedAttempt(record=record, trajectory=document, trial_dir=trial))
    """

    record: AttemptRecord
    trajectory: dict[str, Any] | None
    """The ATIF document, enriched with the bridge's per-call tokens, cost and latency."""
    trial_dir: Path | None
    """A local directory holding `trajectory.json` and `artifacts/` of this attempt."""
