"""Multiply: ask the policy an arithmetic question and grade the number it answers.

Run it as the evaluation engine does: `_OSMOSIS_ROLLOUT_PORT=8000 python main.py`.
"""

import os
import re

import uvicorn

from osmosis import (
    AgentWorkflow,
    AgentWorkflowContext,
    Grader,
    GraderContext,
    LocalBackend,
    create_rollout_server,
)

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class MultiplyWorkflow(AgentWorkflow):
    """One turn: send the prompt to the policy and keep its reply."""

    async def run(self, ctx: AgentWorkflowContext) -> list[dict]:
        reply = await ctx.chat(ctx.prompt)
        return [*ctx.prompt, reply]


class LastNumberMatches(Grader):
    """Reward 1 when the last number in the reply equals the label, else 0."""

    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        content = ctx.sample.messages[-1].get("content") or ""
        numbers = NUMBER.findall(str(content))
        expected = (ctx.label or "").strip()
        ctx.set_reward(1.0 if numbers and float(numbers[-1]) == float(expected) else 0.0)


app = create_rollout_server(
    backend=LocalBackend(workflow=MultiplyWorkflow, grader=LastNumberMatches)
)

if __name__ == "__main__":
    port = int(os.environ.get("_OSMOSIS_ROLLOUT_PORT", "8000"))
    # No access log: one line per protocol request would bury the rollout's own messages
    # in the run's logs.txt.
    uvicorn.run(app, host="127.0.0.1", port=port, access_log=False)
