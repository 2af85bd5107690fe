"""The rollout SDK: what runs inside a rollout's own environment.

    from osmosis.rollout import AgentWorkflow, Grader, LocalBackend, create_rollout_server

This package imports nothing else of osmosis, because it is installed into users' rollout
environments. `create_rollout_server` (FastAPI) loads on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from osmosis.rollout.backend import (
    ExecutionBackend,
    ExecutionOutcome,
    ExecutionRequest,
    ExecutionResult,
)
from osmosis.rollout.configs import AgentWorkflowConfig, BaseConfig, ConcurrencyConfig, GraderConfig
from osmosis.rollout.context import RolloutContext, SampleSource, get_rollout_context
from osmosis.rollout.grader import Grader, GraderContext
from osmosis.rollout.local_backend import LocalBackend
from osmosis.rollout.sample import RolloutSample
from osmosis.rollout.types import ErrorCategory, Messages, RolloutStatus
from osmosis.rollout.workflow import AgentWorkflow, AgentWorkflowContext, AgentWorkflowOutput

if TYPE_CHECKING:
    from osmosis.rollout.policy import chat
    from osmosis.rollout.policy_openai import openai_client
    from osmosis.rollout.server import create_rollout_server

__all__ = [
    "AgentWorkflow",
    "AgentWorkflowConfig",
    "AgentWorkflowContext",
    "AgentWorkflowOutput",
    "BaseConfig",
    "ConcurrencyConfig",
    "ErrorCategory",
    "ExecutionBackend",
    "ExecutionOutcome",
    "ExecutionRequest",
    "ExecutionResult",
    "Grader",
    "GraderConfig",
    "GraderContext",
    "LocalBackend",
    "Messages",
    "RolloutContext",
    "RolloutSample",
    "RolloutStatus",
    "SampleSource",
    "chat",
    "create_rollout_server",
    "get_rollout_context",
    "openai_client",
]

_LAZY = {
    "create_rollout_server": "osmosis.rollout.server",
    "chat": "osmosis.rollout.policy",
    "openai_client": "osmosis.rollout.policy_openai",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'osmosis.rollout' has no attribute {name!r}")
