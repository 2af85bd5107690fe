"""`Grader`: turns a finished rollout into a reward. Subclass it and implement `grade(ctx)`."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from osmosis.rollout.artifacts_dir import ArtifactsDirField
from osmosis.rollout.configs import GraderConfig
from osmosis.rollout.sample import RolloutSample

REWARD_EXPLANATION = "reward_explanation"
"""The key of a grader's explanation in the sample's `extra_fields`: it travels with the result
inside the reference protocol, so an `osmosis-ai` controller just ignores it."""
MAX_EXPLANATION_CHARS = 1000


@dataclass
class GraderContext:
    """What a grader sees: the label, the sample, and the row's metadata."""

    label: str | None
    """The row's ground truth (`ground_truth` or `label` column)."""
    sample: RolloutSample | None
    """The workflow's sample; None when the workflow produced no messages."""
    project_path: str | None = None
    """The rollout's directory, when known."""
    metadata: dict[str, Any] | None = None
    """The dataset row's metadata."""
    artifacts_dir: ArtifactsDirField = ArtifactsDirField()  # noqa: RUF009 - a descriptor
    """The same directory the workflow wrote its artifacts to (created when first read)."""

    def set_reward(self, reward: float, explanation: str | None = None) -> None:
        """Give the sample its reward: a finite number, and optionally why, in a sentence
        (stored with the attempt and shown beside its reward; cut to 1,000 characters).

        ctx.set_reward(1.0 if answer == ctx.label else 0.0)
        ctx.set_reward(0.0, explanation=f"answered {answer}, expected {ctx.label}")
        """
        if explanation is not None and not isinstance(explanation, str):
            raise TypeError(f"explanation must be a string, not {type(explanation).__name__}")
        if isinstance(reward, bool) or not isinstance(reward, (int, float)):
            raise TypeError(f"reward must be a number, not {type(reward).__name__}")
        if not math.isfinite(reward):
            raise ValueError(f"reward must be finite, got {reward}")
        if self.sample is None:
            raise ValueError("cannot set a reward: the workflow produced no sample")
        self.sample.reward = float(reward)
        if explanation is not None:
            self.sample.extra_fields[REWARD_EXPLANATION] = explanation[:MAX_EXPLANATION_CHARS]


class Grader(ABC):
    """Scores one rollout by calling `ctx.set_reward(...)` (or setting `remove_sample`).

    class ExactMatch(Grader):
        async def grade(self, ctx):
            ctx.set_reward(1.0 if ctx.label in ctx.sample.messages[-1]["content"] else 0.0)
    """

    def __init__(self, config: GraderConfig | None = None) -> None:
        self.config = config

    @abstractmethod
    async def grade(self, ctx: GraderContext) -> Any:
        """Grade the sample; the return value is ignored."""


def require_reward(sample: RolloutSample | None) -> None:
    """After grading, a sample must carry a reward unless it was removed."""
    if sample is None:
        raise ValueError(
            "the grader ran without a sample: the workflow returned no messages, registered no "
            "sample source and made no recorded policy call"
        )
    if sample.reward is None and not sample.remove_sample:
        raise ValueError("sample has no reward after grading; call ctx.set_reward(...)")
