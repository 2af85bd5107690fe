"""`AgentWorkflow`: the agent under evaluation. Subclass it and implement `run(ctx)`."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from osmosis.rollout.artifacts_dir import ArtifactsDirField
from osmosis.rollout.configs import AgentWorkflowConfig
from osmosis.rollout.types import Message, Messages

if TYPE_CHECKING:
    from openai import AsyncOpenAI

TConfig = TypeVar("TConfig", bound=AgentWorkflowConfig)


class AgentWorkflowOutput(BaseModel):
    """What `run()` may return: the conversation plus numbers worth keeping.

    return AgentWorkflowOutput(messages=[*ctx.prompt, reply], metrics={"turns": 1.0})
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, revalidate_instances="always")

    messages: Messages | None = None
    """The rollout's single message history; None means no sample."""
    metrics: dict[str, float] = Field(default_factory=dict)
    """Finite numbers; they travel with the sample to the grader and the trajectory."""
    info: dict[str, Any] = Field(default_factory=dict)
    """Reserved for diagnostics; not given to graders."""

    @field_validator("metrics")
    @classmethod
    def _finite_metrics(cls, metrics: dict[str, float]) -> dict[str, float]:
        bad = [key for key, value in metrics.items() if not math.isfinite(value)]
        if bad:
            raise ValueError(f"metrics must be finite numbers; not finite: {', '.join(bad)}")
        return metrics


@dataclass
class AgentWorkflowContext(Generic[TConfig]):
    """What a workflow knows about its row. It never sees the label."""

    prompt: Messages
    """The initial messages (system, then user) built from the dataset row."""
    config: TConfig | None = None
    """A deep copy of the backend's workflow config, private to this rollout."""
    metadata: dict[str, Any] | None = None
    """The dataset row's metadata."""
    artifacts_dir: ArtifactsDirField = ArtifactsDirField()  # noqa: RUF009 - a descriptor
    """A directory for files this attempt produces (created when first read); check for None
    before writing."""

    async def chat(
        self, messages: Messages, *, tools: list[dict[str, Any]] | None = None, **params: Any
    ) -> Message:
        """One chat completion against this rollout's policy; returns the assistant message.

        reply = await ctx.chat([*ctx.prompt])
        """
        from osmosis.rollout.policy import chat

        return await chat(messages, tools=tools, **params)

    def openai_client(self, **kwargs: Any) -> AsyncOpenAI:
        """An `openai.AsyncOpenAI` client bound to this rollout's policy URL and key."""
        from osmosis.rollout.policy_openai import openai_client

        return openai_client(**kwargs)


class AgentWorkflow(ABC, Generic[TConfig]):
    """The agent under evaluation.

    class Multiply(AgentWorkflow):
        async def run(self, ctx):
            return [*ctx.prompt, await ctx.chat(ctx.prompt)]
    """

    def __init__(self, config: TConfig | None = None) -> None:
        self.config = config

    @abstractmethod
    async def run(
        self, ctx: AgentWorkflowContext[TConfig]
    ) -> AgentWorkflowOutput | Messages | None:
        """Run one rollout. Return an output, a bare message list, or None to use the
        registered sample source (by default, the conversation recorded by `ctx.chat`)."""


def coerce_output(value: object) -> AgentWorkflowOutput | None:
    """Normalise what `run()` returned; anything unexpected raises TypeError."""
    if value is None:
        return None
    if isinstance(value, AgentWorkflowOutput):
        return AgentWorkflowOutput.model_validate(value)
    if isinstance(value, list):
        return AgentWorkflowOutput(messages=value)
    raise TypeError(
        "AgentWorkflow.run() must return an AgentWorkflowOutput, a list of messages or None, "
        f"not {type(value).__name__}"
    )
