"""Issue 30: attempts that end together on one sandboxed server are settled together (one
measure of the server's disk for the lot), and each is still judged on its own files.

Real bwrap, one real rollout server running eight attempts at once, the scripted model: the
attempts wait for each other, then write their artifacts and return at the same moment. The
one that wrote past its output limit fails `resource_limit` and keeps nothing; each of the
others keeps its own artifact, and no ended attempt is left on disk after the run.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from osmosis.eval.host.plan import RunOptions, plan_run
from osmosis.eval.host.run import run_evaluation
from osmosis.eval.sites.sandbox import SandboxLimits, SandboxPolicy
from osmosis.eval.sites.spec import SandboxSiteSpec
from osmosis.testing import FakeModelServer
from tests.e2e.conftest import model_env
from tests.e2e.workspace import make_workspace, row
from tests.integration.test_sandbox_disk import Quiet

pytestmark = pytest.mark.slow

MiB = 1024**2
LIMITS = SandboxLimits(artifact_bytes=4 * MiB, disk_bytes=64 * MiB, file_bytes=64 * MiB)
ATTEMPTS = 8

TOGETHER = f"""
import asyncio, os

import uvicorn
from osmosis import (AgentWorkflow, AgentWorkflowConfig, ConcurrencyConfig, Grader,
                     LocalBackend, create_rollout_server)

arrived = 0
everyone = asyncio.Event()


class Together(AgentWorkflow):
    async def run(self, ctx):
        global arrived
        arrived += 1
        if arrived >= {ATTEMPTS}:
            everyone.set()
        try:  # alone (re-run after a server was stopped): go on after a moment
            await asyncio.wait_for(everyone.wait(), 2)
        except asyncio.TimeoutError:
            pass
        answer = await ctx.chat(ctx.prompt)
        if ctx.metadata["kind"] == "big":
            (ctx.artifacts_dir / "big.bin").write_bytes(b"x" * (5 * 1024 * 1024))
        else:
            (ctx.artifacts_dir / "mine.txt").write_text(ctx.prompt[-1]["content"])
        return [*ctx.prompt, answer]


class One(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0)


app = create_rollout_server(backend=LocalBackend(
    workflow=Together, grader=One,
    workflow_config=AgentWorkflowConfig(
        name="together", concurrency=ConcurrencyConfig(max_concurrent={ATTEMPTS})),
))

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]),
                log_level="warning")
"""


def test_attempts_ending_together_on_one_server_are_each_judged_on_their_own_files(tmp_path):
    rows = [row("big" if a == 5 else "small", a, 3) for a in range(2, 2 + ATTEMPTS)]
    config = make_workspace(tmp_path, rows, limit=ATTEMPTS, batch_size=ATTEMPTS, main=TOGETHER)
    with FakeModelServer() as model:
        plan = plan_run(config, RunOptions(name="together", environ=model_env(model)))
        spec = SandboxSiteSpec(policy=SandboxPolicy(limits=LIMITS))
        report = asyncio.run(run_evaluation(plan, Quiet(), site=spec))

    run_dir = plan.run_dir
    said = (run_dir / "logs.txt").read_text()
    assert report.status == "finished", said
    records = [json.loads(line) for line in (run_dir / "index.jsonl").read_text().splitlines()]
    outcome = {r["row_index"]: (r["status"], r.get("error_type")) for r in records}
    big = next(i for i, r in enumerate(rows) if r["metadata"]["kind"] == "big")
    assert outcome.pop(big) == ("failed", "resource_limit"), said
    assert set(outcome.values()) == {("success", None)} and len(outcome) == ATTEMPTS - 1, said
    # The over-limit attempt keeps nothing; every other one keeps its own file, not another's.
    assert not (run_dir / "artifacts" / f"row_{big}_run_0").exists()
    for index in outcome:
        kept = run_dir / "artifacts" / f"row_{index}_run_0" / "mine.txt"
        assert kept.read_text() == rows[index]["user_prompt"], index
    # Every ended attempt was let go: no outbox, no ended directory is left.
    assert not [p for p in run_dir.parent.iterdir() if ".sandbox" in p.name]
    assert not [p for p in run_dir.iterdir() if ".sandbox" in p.name]
