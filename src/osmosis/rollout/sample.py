"""`RolloutSample`: the message history one attempt produced, and its reward."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

from osmosis.rollout.types import Messages


def _no_messages() -> Messages:
    # Not `list`: pydantic reads a factory's signature, and for a builtin that means parsing
    # its text signature with the tokenizer's regexes, compiled on first use: ~2.5 ms of every
    # rollout server's start (no other import there does it).
    return []


class RolloutSample(BaseModel):
    """What a rollout hands to its grader and back to the controller.

    sample = RolloutSample(messages=[{"role": "assistant", "content": "391"}], label="391")
    sample.reward = 1.0      # validated on assignment: NaN or inf raise
    """

    model_config = ConfigDict(allow_inf_nan=False, validate_assignment=True)

    messages: Messages = Field(default_factory=_no_messages)
    """The rollout's message history, as the policy saw it."""
    trajectory_messages: Messages | None = None
    """Messages for the trajectory file; a copy of `messages` unless set (None disables it)."""
    label: str | None = None
    """The row's ground truth, if it has one."""
    reward: float | None = None
    """The grader's number; must be finite."""
    remove_sample: bool = False
    """True drops the attempt from scoring: it becomes `skipped`, its reward null."""
    metrics: dict[str, Any] = Field(default_factory=dict)
    """Workflow-reported numbers (`AgentWorkflowOutput.metrics`)."""
    extra_fields: dict[str, Any] = Field(default_factory=dict)
    """Free-form diagnostics carried to the controller."""

    @model_validator(mode="before")
    @classmethod
    def _default_trajectory(cls, data: Any, info: ValidationInfo) -> Any:
        # An explicit None must survive (it disables the trajectory); only absence copies.
        # A sample read off the wire (WIRE context) never writes a trajectory: no copy.
        if (
            isinstance(data, dict)
            and "trajectory_messages" not in data
            and not (info.context and info.context.get("wire"))
        ):
            data = {**data, "trajectory_messages": copy.deepcopy(data.get("messages") or [])}
        return data

    def wire_copy(self) -> RolloutSample:
        """The sample as it travels back over HTTP: no trajectory messages, only JSON-safe
        numbers in `metrics` and `extra_fields` (non-finite or unencodable values dropped)."""
        return RolloutSample.model_construct(
            messages=self.messages,
            trajectory_messages=None,
            label=self.label,
            reward=self.reward,
            remove_sample=self.remove_sample,
            metrics=_json_safe(self.metrics),
            extra_fields=_json_safe(self.extra_fields),
        )


WIRE = {"wire": True}
"""Validation context for a result read off the wire (`model_validate_json(body,
context=WIRE)`): its sample keeps `trajectory_messages` None instead of copying messages."""


def _json_safe(values: dict[str, Any]) -> dict[str, Any]:
    safe: dict[str, Any] = {}
    for key, value in values.items():
        value = _plain_number(value)
        if isinstance(value, float) and not math.isfinite(value):
            continue
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            continue
        safe[str(key)] = value
    return safe


def _plain_number(value: Any) -> Any:
    # numpy scalars and similar expose .item(); turn them into Python numbers.
    item = getattr(value, "item", None)
    if callable(item) and not isinstance(value, (list, dict, str, bytes)):
        try:
            return item()
        except (TypeError, ValueError):
            return value
    return value
