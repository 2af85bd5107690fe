"""The vocabularies of the rollout protocol: statuses, error categories, messages."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

Message = dict[str, Any]
"""One chat message in OpenAI form: `{"role": "user", "content": "..."}`."""

Messages = list[Message]

PROTOCOL_VERSION = "0.4"


class RolloutStatus(StrEnum):
    """Where one rollout is in its life. Terminal: success, failure, cancelled."""

    QUEUED = "queued"
    RUNNING = "running"
    GRADING = "grading"
    SUCCESS = "success"
    FAILURE = "failure"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"

    @property
    def terminal(self) -> bool:
        return self in (RolloutStatus.SUCCESS, RolloutStatus.FAILURE, RolloutStatus.CANCELLED)


class ErrorCategory(StrEnum):
    """Why a rollout failed, as the controller classifies it (`error_type`)."""

    TIMEOUT = "timeout"
    LEASE_EXPIRED = "lease_expired"
    VALIDATION_ERROR = "validation_error"
    HTTP_ERROR = "http_error"
    AGENT_ERROR = "agent_error"
    INTERNAL_ERROR = "internal_error"
