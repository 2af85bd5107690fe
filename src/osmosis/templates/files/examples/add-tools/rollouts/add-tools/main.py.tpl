"""Add with a tool: an agent loop that offers the policy an `add(a, b)` tool.

Each turn the policy either calls the tool (the workflow runs it and sends the result back) or
answers; the loop stops at an answer or after `MAX_TURNS`. The grader rewards 1 when the last
integer of the final answer is the label. Models that ignore `tools` (the bundled SmolLM2
does) simply answer in the first turn; `osmosis dev fake-model` calls the tool.

Run it as the evaluation engine does: `_OSMOSIS_ROLLOUT_PORT=8000 python main.py`.
"""

import json
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

MAX_TURNS = 4
INTEGER = re.compile(r"-?\d+")
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers and return their sum.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


def run_tool(name: str, arguments: str) -> str:
    """Execute one tool call; a bad call gets an error text the model can read."""
    try:
        args = json.loads(arguments or "{}")
        if name == "add":
            return str(int(args["a"]) + int(args["b"]))
        return f"error: unknown tool {name!r}"
    except (ValueError, KeyError, TypeError) as error:
        return f"error: {error}"


class AddToolsWorkflow(AgentWorkflow):
    """Call the policy with the tool on offer until it answers without a tool call."""

    async def run(self, ctx: AgentWorkflowContext) -> list[dict]:
        messages = list(ctx.prompt)
        for _ in range(MAX_TURNS):
            reply = await ctx.chat(messages, tools=TOOLS)
            messages.append(reply)
            calls = reply.get("tool_calls") or []
            if not calls:
                break
            for call in calls:
                function = call.get("function") or {}
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": call.get("id"),
                        "content": run_tool(function.get("name", ""), function.get("arguments")),
                    }
                )
        return messages


class LastIntegerMatches(Grader):
    """Reward 1 when the last integer of the final answer equals the label, else 0."""

    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        answer = str(ctx.sample.messages[-1].get("content") or "")
        found = INTEGER.findall(answer)
        expected = (ctx.label or "").strip()
        ctx.set_reward(1.0 if found and found[-1] == expected else 0.0)


app = create_rollout_server(
    backend=LocalBackend(workflow=AddToolsWorkflow, grader=LastIntegerMatches)
)

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("_OSMOSIS_ROLLOUT_PORT", "8000")))
