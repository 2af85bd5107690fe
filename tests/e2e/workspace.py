"""Builds a throwaway workspace whose rollout behaves as each row's metadata says, so the
metrics of a run can be computed by hand."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

SCRIPTED_MAIN = """
import asyncio, os, re, time
from collections import Counter
from pathlib import Path

import uvicorn
from osmosis import (AgentWorkflow, AgentWorkflowConfig, ConcurrencyConfig, Grader,
                     LocalBackend, create_rollout_server)

seen = Counter()  # attempts per prompt in this process: "pass 1 of 4" passes the first one
if os.environ.get("PID_FILE"):
    Path(os.environ["PID_FILE"]).write_text(str(os.getpid()))
if os.environ.get("SHOUT_SECRET"):
    print("starting with secret", os.environ["SHOUT_SECRET"], flush=True)


class Scripted(AgentWorkflow):
    async def run(self, ctx):
        kind = ctx.metadata["kind"]
        if kind == "hang":
            await asyncio.sleep(3600)
        await asyncio.sleep(float(ctx.metadata.get("sleep", 0)))
        reply = await ctx.chat(ctx.prompt)
        if os.environ.get("SHOUT_SECRET"):
            reply = {**reply, "content": reply["content"] + " " + os.environ["SHOUT_SECRET"]}
        return [*ctx.prompt, reply]


class ScriptedGrader(Grader):
    async def grade(self, ctx):
        kind = ctx.metadata["kind"]
        if kind == "grader_error":
            raise RuntimeError("grader exploded " + os.environ.get("SHOUT_SECRET", ""))
        if kind == "breakable" and os.environ.get("BREAK_GRADER"):
            raise RuntimeError("broken on purpose")
        if kind == "grader_hang":
            await asyncio.sleep(3600)
        if kind == "remove":
            ctx.sample.remove_sample = True
            return
        if kind.startswith("pass_first_"):
            key = ctx.sample.messages[-2]["content"]
            seen[key] += 1
            ctx.set_reward(1.0 if seen[key] <= int(kind.rsplit("_", 1)[1]) else 0.0)
            return
        numbers = re.findall(r"-?\\d+", str(ctx.sample.messages[-1]["content"]))
        ctx.set_reward(1.0 if numbers and numbers[0] == ctx.label else 0.0)


concurrency = int(os.environ.get("MAX_CONCURRENT", "8"))
app = create_rollout_server(backend=LocalBackend(
    workflow=Scripted, grader=ScriptedGrader,
    workflow_config=AgentWorkflowConfig(
        name="scripted", concurrency=ConcurrencyConfig(max_concurrent=concurrency)),
))

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]),
                log_level="warning")
"""


def make_workspace(
    root: Path,
    rows: list[dict],
    *,
    n: int = 1,
    limit: int | None = None,
    batch_size: int | None = None,
    agent_timeout: float = 30,
    grader_timeout: float = 30,
    secrets: list[str] = (),
    env: dict[str, str] | None = None,
    main: str = SCRIPTED_MAIN,
    model_path: str = "openai/fake-model",
) -> Path:
    """Write rollouts/scripted, configs/eval/scripted.toml and data/scripted.jsonl."""
    (root / "rollouts" / "scripted").mkdir(parents=True)
    (root / "configs" / "eval").mkdir(parents=True)
    (root / "data").mkdir()
    (root / "rollouts" / "scripted" / "main.py").write_text(textwrap.dedent(main))
    with (root / "data" / "scripted.jsonl").open("w") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    evaluation = [
        f"n = {n}",
        f"agent_workflow_timeout_s = {agent_timeout}",
        f"grader_timeout_s = {grader_timeout}",
    ]
    if limit is not None:
        evaluation.append(f"limit = {limit}")
    if batch_size is not None:
        evaluation.append(f"batch_size = {batch_size}")
    env_lines = "".join(f'{k} = "{v}"\n' for k, v in (env or {}).items())
    config = (
        "[experiment]\n"
        'rollout = "scripted"\nentrypoint = "main.py"\n'
        f'model_path = "{model_path}"\ndataset = "scripted"\n\n'
        "[evaluation]\n"
        + "\n".join(evaluation)
        + "\n\n"
        + (f"[env]\n{env_lines}\n" if env_lines else "")
        + f"[secrets]\nrequired = {json.dumps(list(secrets))}\n"
    )
    (root / "configs" / "eval" / "scripted.toml").write_text(config)
    return root / "configs" / "eval" / "scripted.toml"


def row(kind: str, a: int = 6, b: int = 7, **extra) -> dict:
    return {
        "user_prompt": f"What is {a} * {b}? [{kind}]",
        "ground_truth": str(a * b),
        "metadata": {"kind": kind, **extra},
    }


# The same scripted logic written against the open-source osmosis-ai 0.3.x SDK: it has no
# ctx.chat helper, so it calls the rollout-scoped URL with httpx, as its users do.
OSMOSIS_AI_MAIN = SCRIPTED_MAIN.replace(
    """from osmosis import (AgentWorkflow, AgentWorkflowConfig, ConcurrencyConfig, Grader,
                     LocalBackend, create_rollout_server)""",
    """import httpx
from osmosis_ai.rollout import (AgentWorkflow, AgentWorkflowConfig, ConcurrencyConfig, Grader,
                                LocalBackend, get_rollout_context)
from osmosis_ai.rollout.server import create_rollout_server


async def chat(messages):
    rollout = get_rollout_context()
    async with httpx.AsyncClient(timeout=60) as client:
        response = await client.post(
            rollout.chat_completions_url + "/chat/completions",
            headers={"Authorization": "Bearer " + rollout.api_key},
            json={"model": "any", "messages": messages},
        )
    response.raise_for_status()
    return response.json()["choices"][0]["message"]""",
).replace("reply = await ctx.chat(ctx.prompt)", "reply = await chat(ctx.prompt)")

OSMOSIS_AI_PYPROJECT = """\
[project]
name = "scripted-osmosis-ai"
version = "0.1.0"
requires-python = ">=3.12"
dependencies = ["osmosis-ai[server]==0.3.8"]
"""
