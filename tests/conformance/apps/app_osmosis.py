"""Conformance entrypoint written for our SDK (`osmosis`), the same program as app_osmosis_ai.py.

    _OSMOSIS_ROLLOUT_PORT=8000 .venv/bin/python tests/conformance/apps/app_osmosis.py

Behaviours live in `behaviours.py`, shared with `app_osmosis_ai.py`; server tuning comes from the
CONFORMANCE_* environment variables it defines.
"""

from __future__ import annotations

import os
from typing import Any

import behaviours
import uvicorn

from osmosis import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    AgentWorkflowOutput,
    ConcurrencyConfig,
    Grader,
    GraderConfig,
    GraderContext,
    LocalBackend,
    create_rollout_server,
    get_rollout_context,
)


class ConformanceWorkflow(AgentWorkflow[AgentWorkflowConfig]):
    async def run(self, ctx: AgentWorkflowContext[AgentWorkflowConfig]) -> Any:
        return await behaviours.run_workflow(
            ctx, output_type=AgentWorkflowOutput, rollout_context=get_rollout_context
        )


class ConformanceGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        await behaviours.grade(ctx)


settings = behaviours.ServerSettings.from_env(os.environ)
backend = LocalBackend(
    workflow=ConformanceWorkflow,
    workflow_config=AgentWorkflowConfig(
        name="conformance",
        description=behaviours.CONFIG_DESCRIPTION,
        concurrency=ConcurrencyConfig(max_concurrent=settings.max_concurrent),
    ),
    grader=ConformanceGrader,
    grader_config=GraderConfig(name="conformance-grader"),
    max_pending=settings.max_pending,
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
