"""Add with the OpenAI Agents SDK, written for the open-source `osmosis-ai` SDK.

An `OsmosisAgent` with one `add` function tool answers the row's question; the conversation
the runner stores in an `OsmosisMemorySession` is the sample, and the grader rewards 1 when
the last integer of the agent's final message is the label. `pyproject.toml` declares
`osmosis-ai[server,openai-agents]`, so this rollout gets its own environment (Python >= 3.12)
and runs unchanged here and on the Osmosis platform.

Run it as the evaluation engine does: `_OSMOSIS_ROLLOUT_PORT=8000 python main.py`.
"""

from __future__ import annotations

import os
import re
from typing import Any

import uvicorn
from agents import Runner, function_tool
from osmosis_ai.rollout.agent_workflow import AgentWorkflow
from osmosis_ai.rollout.backend.local import LocalBackend
from osmosis_ai.rollout.context import AgentWorkflowContext, GraderContext
from osmosis_ai.rollout.grader import Grader
from osmosis_ai.rollout.integrations.agents.openai_agents import (
    OsmosisAgent,
    OsmosisMemorySession,
    OsmosisRolloutModel,
)
from osmosis_ai.rollout.server import create_rollout_server

INTEGER = re.compile(r"-?\d+")


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers and return their sum."""
    return a + b


class AddAgentWorkflow(AgentWorkflow):
    """One agent run over the row's question; the session records the conversation."""

    async def run(self, ctx: AgentWorkflowContext) -> None:
        system = " ".join(str(m["content"]) for m in ctx.prompt if m["role"] == "system")
        question = " ".join(str(m["content"]) for m in ctx.prompt if m["role"] == "user")
        agent = OsmosisAgent(
            name="adder",
            instructions=system or "Use the add tool, then answer with the number.",
            tools=[add],
            model=OsmosisRolloutModel(),
        )
        await Runner.run(agent, input=question, session=OsmosisMemorySession())


def final_text(items: list[Any]) -> str:
    """The text of the last assistant message among the session's Responses-API items."""
    for item in reversed(items):
        if isinstance(item, dict) and item.get("role") == "assistant":
            content = item.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(
                    str(part.get("text", "")) for part in content if isinstance(part, dict)
                )
    return ""


class LastIntegerMatches(Grader):
    """Reward 1 when the last integer of the agent's final message equals the label."""

    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        found = INTEGER.findall(final_text(list(ctx.sample.messages)))
        expected = (ctx.label or "").strip()
        ctx.set_reward(1.0 if found and found[-1] == expected else 0.0)


def main() -> None:
    backend = LocalBackend(workflow=AddAgentWorkflow, grader=LastIntegerMatches)
    app = create_rollout_server(backend=backend)
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("_OSMOSIS_ROLLOUT_PORT", "8000")))


if __name__ == "__main__":
    main()
