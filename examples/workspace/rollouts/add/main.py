"""Add: one-digit sums, answered as JSON, graded exactly.

The workflow shows the policy two worked examples as earlier turns, then asks the row's
question with the reply constrained by a JSON schema to `{"answer": <integer>}`; the grader
rewards 1 when that integer is the label. Sampling is on (temperature 0.8), so each of a row's
`n` attempts can come out differently and pass@k means something.

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

# A small model copies the shape of earlier answers far better than it follows instructions.
WORKED_EXAMPLES = [
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": '{"answer": 5}'},
    {"role": "user", "content": "What is 4 + 4?"},
    {"role": "assistant", "content": '{"answer": 8}'},
]
ANSWER_FORMAT = {
    "type": "json_schema",
    "json_schema": {
        "name": "answer",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"answer": {"type": "integer"}},
            "required": ["answer"],
            "additionalProperties": False,
        },
    },
}
INTEGER = re.compile(r"-?\d+")


class AddWorkflow(AgentWorkflow):
    """One model call: the row's system prompt, the worked examples, then its question."""

    async def run(self, ctx: AgentWorkflowContext) -> list[dict]:
        system = [m for m in ctx.prompt if m["role"] == "system"]
        question = [m for m in ctx.prompt if m["role"] != "system"]
        messages = [*system, *WORKED_EXAMPLES, *question]
        reply = await ctx.chat(
            messages, response_format=ANSWER_FORMAT, temperature=0.8, max_tokens=16
        )
        return [*messages, reply]


def answer_of(content: str) -> int | None:
    """The integer a reply gives: `{"answer": n}` as asked, else the last integer in it."""
    try:
        parsed = json.loads(content)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and type(parsed.get("answer")) is int:
        return int(parsed["answer"])
    if type(parsed) is int:
        return parsed
    found = INTEGER.findall(content)
    return int(found[-1]) if found else None


class ExactSum(Grader):
    """Reward 1 when the answered integer equals the label, else 0."""

    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        content = str(ctx.sample.messages[-1].get("content") or "")
        expected = int((ctx.label or "").strip())
        ctx.set_reward(1.0 if answer_of(content) == expected else 0.0)


app = create_rollout_server(backend=LocalBackend(workflow=AddWorkflow, grader=ExactSum))

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("_OSMOSIS_ROLLOUT_PORT", "8000")))
