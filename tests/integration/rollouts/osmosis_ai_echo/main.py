"""An echo rollout written for `osmosis-ai` 0.3.8, as `osmosis rollout init` scaffolds one."""

import os
import sys

import uvicorn
from osmosis_ai.rollout.agent_workflow import AgentWorkflow
from osmosis_ai.rollout.backend.local import LocalBackend
from osmosis_ai.rollout.context import AgentWorkflowContext, GraderContext
from osmosis_ai.rollout.grader import Grader
from osmosis_ai.rollout.server import create_rollout_server


class EchoWorkflow(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> list[dict]:
        return list(ctx.prompt)


class ZeroGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        ctx.set_reward(0.0)


print(f"python={sys.version.split()[0]}", flush=True)
app = create_rollout_server(backend=LocalBackend(workflow=EchoWorkflow, grader=ZeroGrader))

if __name__ == "__main__":
    port = int(os.environ.get("_OSMOSIS_ROLLOUT_PORT", "8000"))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
