"""Local runs made as a user makes them (`osmosis eval run` against the scripted model) and the
viewer a user starts over them (`osmosis eval view DIR`), for the `eval view` tests.

The rollout answers each row as its metadata says for the run's VARIANT (an environment
variable, so one config makes runs that differ): `right` asks the model and repeats its answer,
`wrong` answers 0, `half` gets one of the row's two attempts right, `crash` raises (a
traceback in the rollout's log). Every output names the
row's animal, so a search for it finds that row's attempts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.e2e.workspace import make_workspace

CLI = [sys.executable, "-c", "from osmosis.cli.main import run; run()"]

VIEW_MAIN = """
import asyncio, os
from collections import Counter
import uvicorn
from osmosis import AgentWorkflow, Grader, LocalBackend, create_rollout_server


seen = Counter()  # attempts per row in this process: "half" gets every other one right


def parse(question):
    raise ValueError(f"cannot parse the question: {question}")


class Answer(AgentWorkflow):
    async def run(self, ctx):
        behaviour = ctx.metadata["by_variant"].get(os.environ.get("VARIANT", "a"), "crash")
        await asyncio.sleep(float(os.environ.get("SLEEP", "0")))
        if behaviour == "crash":
            parse(ctx.metadata["animal"])
        reply = await ctx.chat(ctx.prompt)
        seen[ctx.metadata["animal"]] += 1
        right = behaviour == "right" or (behaviour == "half" and seen[ctx.metadata["animal"]] % 2)
        answer = reply["content"] if right else "0"
        said = {"role": "assistant",
                "content": f"The answer is {answer}, said the {ctx.metadata['animal']}."}
        return [*ctx.prompt, reply, said]


class Check(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0 if f"is {ctx.label}," in ctx.sample.messages[-1]["content"] else 0.0)


app = create_rollout_server(backend=LocalBackend(workflow=Answer, grader=Check))

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]),
                log_level="warning")
"""

ANIMALS = ("otter", "falcon", "heron", "lynx", "puffin", "walrus")
# Row -> behaviour per variant; an unknown variant crashes every row (the all-failed run).
BEHAVIOURS = (
    {"a": "right", "b": "wrong", "c": "right"},  # 0: regressed in b
    {"a": "right", "b": "right", "c": "crash"},  # 1: regressed in c, with an error
    {"a": "wrong", "b": "right", "c": "right"},  # 2: improved in b and c
    {"a": "right", "b": "right", "c": "right"},  # 3: the same everywhere
    {"a": "crash", "b": "right", "c": "right"},  # 4: base fails with a traceback
    {"a": "half", "b": "right", "c": "right"},  # 5: 1 of 2 in base, improved in b and c
)
ROWS = [
    {
        "user_prompt": f"What is {i + 2} * 7? Ask the {animal}.",
        "ground_truth": str((i + 2) * 7),
        "metadata": {"animal": animal, "by_variant": BEHAVIOURS[i]},
    }
    for i, animal in enumerate(ANIMALS)
]
RUNS = {"base": "a", "candidate": "b", "third": "c", "broken": "z"}
N = 2


def make_view_workspace(root: Path) -> Path:
    """A git workspace with the scripted rollout, its config (n = 2) and six rows."""
    config = make_workspace(root, ROWS, n=N, main=VIEW_MAIN)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    return config


def eval_run(
    config: Path,
    name: str,
    variant: str,
    env: Mapping[str, str],
    *,
    wait: bool = True,
    **extra: str,
) -> subprocess.Popen[str]:
    """`osmosis eval run` of every row under `name`, as the variant behaves."""
    process = subprocess.Popen(
        [
            *CLI,
            "eval",
            "run",
            str(config),
            "--name",
            name,
            "--rows",
            "0-5",
            "--yes",
            "--max-in-flight",
            "1" if extra.get("SLEEP") else "4",
        ],
        cwd=config.parents[2],
        env={**env, "VARIANT": variant, **extra},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if wait:
        output, _ = process.communicate(timeout=180)
        assert process.returncode == 0, output
    return process


def metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


@dataclass
class Viewer:
    """An `osmosis eval view` process serving `root` on `url`."""

    process: subprocess.Popen[str]
    url: str
    root: Path

    @classmethod
    def start(
        cls, root: Path, port: int, env: Mapping[str, str], *args: str, cwd: Path | None = None
    ) -> Viewer:
        process = subprocess.Popen(
            [*CLI, "eval", "view", str(root), "--port", str(port), *args],
            env=dict(env),
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        viewer = cls(process=process, url=f"http://127.0.0.1:{port}", root=root)
        viewer.wait_ready()
        return viewer

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"eval view exited: {self.process.stdout.read()}")  # type: ignore[union-attr]
            try:
                if httpx.get(self.url + "/", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError("eval view did not answer in time")

    def stop(self) -> str:
        self.process.send_signal(2)  # Ctrl-C, as a user stops it
        try:
            output, _ = self.process.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            output, _ = self.process.communicate()
        return output
