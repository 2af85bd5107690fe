"""Wire models of rollout protocol 0.4, shared by the rollout server and the engine's client.

Field names and vocabularies match the `osmosis-ai` SDK, so either side can be swapped.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, Field, field_validator

from osmosis.rollout.sample import RolloutSample
from osmosis.rollout.types import ErrorCategory, Messages, RolloutStatus

LEASE_HEADER = "X-Osmosis-Rollout-Lease"
INSTANCE_HEADER = "x-osmosis-rollout-instance-id"
SDK_VERSION_HEADER = "x-osmosis-rollout-sdk-version"


def check_path_segment(value: str, *, label: str) -> str:
    """Ids travel in URL paths and name directories: one plain segment only."""
    if value in ("", ".", "..") or "/" in value or "\\" in value or "\x00" in value:
        raise ValueError(f"{label} must be a single path segment (no '/', '\\', '.' or '..')")
    return value


class RolloutInitRequest(BaseModel):
    """`POST /rollout`: start one attempt. Unknown fields are ignored (older controllers)."""

    initial_messages: Messages
    label: str | None = None
    metadata: dict[str, Any] | None = None
    rollout_id: str
    chat_completions_url: str
    llm_api_key: str | None = None
    grade: bool = True
    agent_timeout_sec: float | None = None
    grader_timeout_sec: float | None = None
    extra_fields: dict[str, Any] | None = None

    @field_validator("rollout_id")
    @classmethod
    def _single_segment(cls, value: str) -> str:
        return check_path_segment(value, label="rollout_id")

    @field_validator("llm_api_key")
    @classmethod
    def _non_empty_key(cls, value: str | None) -> str | None:
        if value == "":
            raise ValueError("llm_api_key must be omitted or a non-empty string")
        return value

    @field_validator("agent_timeout_sec", "grader_timeout_sec")
    @classmethod
    def _finite_timeout(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("timeout must be finite; omit it to run unbounded")
        return value


class RolloutInitResponse(BaseModel):
    """`202` answer to `POST /rollout`: the lease token that every result poll must carry."""

    rollout_id: str
    status: RolloutStatus
    polling_lease_token: str = Field(min_length=1)
    result_wait_timeout_sec: float
    polling_lease_timeout_sec: float


class RolloutResultResponse(BaseModel):
    """`GET /rollout/{id}/result`: the current status, and once terminal the outcome."""

    rollout_id: str
    status: RolloutStatus
    sample: RolloutSample | None = None
    err_message: str | None = None
    err_category: ErrorCategory | None = None


class CancelRolloutsRequest(BaseModel):
    """`POST /rollout/cancel`: exactly one of `ids`, `prefix`, `all`."""

    ids: list[str] | None = None
    prefix: str | None = None
    all: bool = False

    def selector_count(self) -> int:
        return sum([self.ids is not None, self.prefix is not None, self.all])


class CancelRolloutsResponse(BaseModel):
    """Per id: `cancelled_queued`, `cancelled_running` or `not_found`."""

    dispositions: dict[str, str]
