"""<your-rollout>: created by `osmosis rollout init`. Edit the two classes below.

- `Workflow.run()` drives the policy model and returns the conversation (the sample);
- `ExactAnswer.grade()` turns that sample into a reward with `ctx.set_reward(x)`.

It works as it is: one model call per row, reward 1 when the reply contains the row's label.
Run it as the evaluation engine does: `_OSMOSIS_ROLLOUT_PORT=8000 python main.py`.
"""

import os

import uvicorn

from osmosis import (
    AgentWorkflow,
    AgentWorkflowContext,
    Grader,
    GraderContext,
    LocalBackend,
    create_rollout_server,
)


class Workflow(AgentWorkflow):
    """One model call with the row's messages (`ctx.prompt`); the label is never shown."""

    async def run(self, ctx: AgentWorkflowContext) -> list[dict]:
        # ctx.chat takes OpenAI parameters (temperature, tools, response_format, ...);
        # ctx.openai_client() gives an AsyncOpenAI client bound to the same policy.
        reply = await ctx.chat(ctx.prompt)
        return [*ctx.prompt, reply]


class ExactAnswer(Grader):
    """Reward 1 when the last reply contains the row's `ground_truth`, else 0."""

    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        reply = str(ctx.sample.messages[-1].get("content") or "")
        expected = (ctx.label or "").strip()
        ctx.set_reward(1.0 if expected and expected in reply else 0.0)


app = create_rollout_server(backend=LocalBackend(workflow=Workflow, grader=ExactAnswer))

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("_OSMOSIS_ROLLOUT_PORT", "8000")))
