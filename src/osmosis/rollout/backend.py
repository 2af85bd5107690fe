"""The execution backend interface the rollout server drives, and its request/result types."""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from osmosis.rollout.sample import RolloutSample
from osmosis.rollout.types import ErrorCategory, Messages, RolloutStatus


@dataclass(frozen=True)
class ExecutionRequest:
    """One rollout to execute, as admitted by the server."""

    id: str
    prompt: Messages
    label: str | None = None
    metadata: dict[str, Any] | None = None
    agent_timeout_sec: float | None = None
    """Budget of the workflow, counted from `submitted_at` (queue time included)."""
    grader_timeout_sec: float | None = None
    """Budget of the grader, counted from when grading starts."""
    grade: bool = True
    extra_fields: dict[str, Any] | None = None
    submitted_at: float = field(default_factory=time.monotonic)
    """`time.monotonic()` when the controller's request was admitted."""
    return_trajectory: bool = False
    """The controller takes the trajectory in the result: put it in
    `ExecutionOutcome.trajectory` instead of writing `trajectory.json`."""

    def __post_init__(self) -> None:
        for name in ("agent_timeout_sec", "grader_timeout_sec"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{name} must be finite; omit it to run unbounded")


@dataclass
class ExecutionResult:
    """How one phase (workflow or grader) ended."""

    status: RolloutStatus
    sample: RolloutSample | None = None
    err_message: str | None = None
    err_category: ErrorCategory | None = None
    extra_fields: dict[str, Any] = field(default_factory=dict)


@dataclass
class ExecutionOutcome:
    """The workflow's result and, when grading ran, the grader's."""

    workflow: ExecutionResult
    grader: ExecutionResult | None = None
    trajectory: dict[str, Any] | None = None
    """The ATIF document, when the request asked for it back (`return_trajectory`)."""

    @property
    def result(self) -> ExecutionResult:
        """The result that reaches the controller: the grader's when it ran."""
        return self.grader if self.grader is not None else self.workflow


class ExecutionBackend(ABC):
    """Runs rollouts for the server. `LocalBackend` runs them in this process."""

    @abstractmethod
    async def execute(self, request: ExecutionRequest) -> ExecutionOutcome:
        """Run the workflow (and grader) of one rollout to completion."""

    def has_capacity(self) -> bool:
        """False makes the server answer 429 so the controller retries later."""
        return True

    def cancel_rollouts(
        self, ids: Sequence[str] | None = None, prefix: str | None = None, all: bool = False
    ) -> dict[str, str]:
        """Cancel work the backend owns outside the server's task; {} when not applicable."""
        return {}

    def health(self) -> dict[str, Any]:
        return {"status": "ok"}

    async def shutdown(self) -> None:
        """Release resources after the server stopped admitting rollouts."""
        return None
