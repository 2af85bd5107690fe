"""Conformance entrypoint written for the open-source osmosis-ai 0.3.x SDK.

    _OSMOSIS_ROLLOUT_PORT=8000 .venv-interop/bin/python tests/conformance/apps/app_osmosis_ai.py

Behaviours live in `behaviours.py`, shared with `app_osmosis.py`; server tuning comes from the
CONFORMANCE_* environment variables it defines.
"""

from __future__ import annotations

import os
from typing import Any

import behaviours
import uvicorn
from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    AgentWorkflowOutput,
    ConcurrencyConfig,
    Grader,
    GraderConfig,
    GraderContext,
    LocalBackend,
    get_rollout_context,
)
from osmosis_ai.rollout.server import create_rollout_server


class ConformanceWorkflow(AgentWorkflow[AgentWorkflowConfig]):
    async def run(self, ctx: AgentWorkflowContext[AgentWorkflowConfig]) -> Any:
        return await behaviours.run_workflow(
            ctx, output_type=AgentWorkflowOutput, rollout_context=get_rollout_context
        )


class ConformanceGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        await behaviours.grade(ctx)


class MaxPendingLocalBackend(LocalBackend):
    """osmosis-ai's LocalBackend always has capacity; add the rule ours has as `max_pending`.

    Once queued + running rollouts reach `max_pending`, `has_capacity()` is False and the server
    answers 429.
    """

    def __init__(self, *, max_pending: int | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_pending = max_pending

    def has_capacity(self) -> bool:
        if self.max_pending is None:
            return True
        concurrency = self.health()["concurrency"]
        return int(concurrency["queued"]) + int(concurrency["running"]) < self.max_pending


settings = behaviours.ServerSettings.from_env(os.environ)
backend = MaxPendingLocalBackend(
    max_pending=settings.max_pending,
    workflow=ConformanceWorkflow,
    workflow_config=AgentWorkflowConfig(
        name="conformance",
        description=behaviours.CONFIG_DESCRIPTION,
        concurrency=ConcurrencyConfig(max_concurrent=settings.max_concurrent),
    ),
    grader=ConformanceGrader,
    grader_config=GraderConfig(name="conformance-grader"),
)
app = create_rollout_server(
    backend=backend,
    api_key=settings.api_key,
    result_wait_timeout_sec=settings.result_wait_timeout_sec,
    polling_lease_timeout_sec=settings.polling_lease_timeout_sec,
    result_retention_sec=settings.result_retention_sec,
)

if __name__ == "__main__":
    # A long keep-alive, as the SDK's scaffold sets, so idle test connections are not cut.
    uvicorn.run(
        app, host="127.0.0.1", port=settings.port, log_level="warning", timeout_keep_alive=60
    )
