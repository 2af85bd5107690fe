"""Configuration objects handed to workflows and graders."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ConcurrencyConfig(BaseModel):
    """How many rollouts a backend runs at once; None means unbounded."""

    model_config = ConfigDict(validate_assignment=True)

    max_concurrent: int | None = Field(default=4, ge=1)


class BaseConfig(BaseModel):
    """A named configuration; extra fields are kept for the user's own settings."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    name: str
    description: str | None = None


class AgentWorkflowConfig(BaseConfig):
    """Configuration of an `AgentWorkflow`; each rollout gets its own deep copy.

    config = AgentWorkflowConfig(name="multiply", concurrency=ConcurrencyConfig(max_concurrent=8))
    """

    concurrency: ConcurrencyConfig = Field(default_factory=ConcurrencyConfig)


class GraderConfig(BaseConfig):
    """Configuration of a `Grader`."""

    concurrency: ConcurrencyConfig = Field(default_factory=ConcurrencyConfig)
