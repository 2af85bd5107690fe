"""osmosis: write an `AgentWorkflow` and a `Grader`, serve them, and evaluate them.

    from osmosis import AgentWorkflow, Grader, LocalBackend, create_rollout_server

The names load lazily so that `import osmosis` (and so the `osmosis` command) stays fast.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from osmosis._version import __version__

if TYPE_CHECKING:
    from osmosis.rollout import (
        AgentWorkflow,
        AgentWorkflowConfig,
        AgentWorkflowContext,
        AgentWorkflowOutput,
        ConcurrencyConfig,
        Grader,
        GraderConfig,
        GraderContext,
        LocalBackend,
        RolloutSample,
        create_rollout_server,
        get_rollout_context,
    )

__all__ = [
    "AgentWorkflow",
    "AgentWorkflowConfig",
    "AgentWorkflowContext",
    "AgentWorkflowOutput",
    "ConcurrencyConfig",
    "Grader",
    "GraderConfig",
    "GraderContext",
    "LocalBackend",
    "RolloutSample",
    "__version__",
    "create_rollout_server",
    "get_rollout_context",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(import_module("osmosis.rollout"), name)
    raise AttributeError(f"module 'osmosis' has no attribute {name!r}")
