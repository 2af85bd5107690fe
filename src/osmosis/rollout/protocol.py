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
SHUTDOWN_HEADER = "x-osmosis-rollout-shutdown"
"""On our server's `GET /health`, `none` when stopping it runs nobody's code (no lifespan, no
shutdown handler, no backend shutdown, no middleware of the user's): the engine then ends it
at once instead of waiting out uvicorn's graceful exit (~0.2 s of a short run's end). Absent
(osmosis-ai, or work to do): it is asked to stop (SIGTERM) and given its grace."""
WAIT_HEADER = "X-Osmosis-Rollout-Wait"
"""Optional, `terminal`. On a result poll it asks our server to long-poll until the rollout
is finished (or the wait times out) instead of answering each status change. On
`POST /rollout` it asks our server to hold its 202 open: the status line and headers go out
at once, with the lease in `LEASE_HEADER` and this header echoed, and the body follows when
the rollout is finished (the terminal result, as a poll would answer it) or when the wait
times out (the usual admission body; poll with the lease from there). One exchange per
attempt instead of two. Servers built on `osmosis-ai` ignore it and answer as always."""

TRAJECTORY_HEADER = "X-Osmosis-Rollout-Trajectory"
"""Optional on `POST /rollout`, `inline`: our server puts the rollout's ATIF trajectory in
its terminal result (a top-level `trajectory` object) instead of writing `trajectory.json`
beside its artifacts. A result read again after its controller collected it carries none.
Servers built on `osmosis-ai` ignore it (the controller then reads the file)."""

COLLECTED_HEADER = "X-Osmosis-Rollout-Collected"
"""Optional on `POST /rollout`: a comma-separated list of rollout ids whose terminal result
this controller has received and will not read again. Our server forgets them at once
instead of keeping each for the re-read window (`collected_result_retention_sec`), so what
it holds stays in proportion to the rollouts in flight, not to the run's rate. An id the
server does not know, or whose result nobody has read yet, is left alone. Servers built on
`osmosis-ai` ignore it."""


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
