"""Issue 25.4: the disk a sandboxed rollout server holds is counted while it runs, and given back.

Real bwrap, real rollout servers, the scripted model: a rollout that writes past its server's
disk quota in the outbox's root, in `/tmp`, in `HOME`, or through a child that keeps writing
into its artifacts after its attempt returned, fails `resource_limit`; nothing of it is kept,
the next attempt (on a fresh server) passes, and the outbox is gone after the run.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from osmosis.eval.host.plan import RunOptions, plan_run
from osmosis.eval.host.run import run_evaluation
from osmosis.eval.results.records import AttemptRecord
from osmosis.eval.results.redact import Redactor
from osmosis.eval.sites.environment import prepare_environment
from osmosis.eval.sites.sandbox import SandboxLimits, SandboxPolicy
from osmosis.eval.sites.sandbox.site import SandboxSite
from osmosis.eval.sites.spec import SandboxSiteSpec
from osmosis.testing import FakeModelServer
from tests.e2e.conftest import model_env
from tests.e2e.workspace import make_workspace, row

MiB = 1024**2
LIMITS = SandboxLimits(artifact_bytes=4 * MiB, disk_bytes=8 * MiB, file_bytes=64 * MiB)
MARKER = "osmosis-disk-test-child"

# One attempt at a time (concurrency 1): a limit is charged to the attempt that broke it.
WRITER = f'''
import asyncio, os, subprocess, sys
from pathlib import Path

import uvicorn
from osmosis import (AgentWorkflow, AgentWorkflowConfig, ConcurrencyConfig, Grader,
                     LocalBackend, create_rollout_server)

MiB = 1024 * 1024
CHILD = """
import sys, time
handle = open(sys.argv[1], "wb", buffering=0)  # held open: the attempt's own artifact
open(sys.argv[2], "w").close()
time.sleep(0.3)  # the attempt has returned by now
while True:
    handle.write(b"x" * 1048576)
    time.sleep(0.005)
"""


def fill(path, mib):
    with open(path, "wb") as handle:
        for _ in range(mib):
            handle.write(b"x" * MiB)


class Writer(AgentWorkflow):
    async def run(self, ctx):
        kind = ctx.metadata["kind"]
        if kind == "pass":
            (ctx.artifacts_dir / "notes.txt").write_text("an honest artifact")
        elif kind == "outbox_root":
            fill(Path(os.environ["_OSMOSIS_ROLLOUT_ARTIFACT_ROOT"]) / "junk.bin", 16)
        elif kind == "tmp":
            fill(Path("/tmp/junk.bin"), 16)
        elif kind == "home":
            fill(Path.home() / "junk.bin", 16)
        elif kind == "child":
            ready = Path("/tmp/ready")
            subprocess.Popen(
                [sys.executable, "-c", CHILD, str(ctx.artifacts_dir / "log.bin"), str(ready),
                 "{MARKER}"],
                start_new_session=True,
            )
            while not ready.exists():
                await asyncio.sleep(0.01)
            ready.unlink()
        return [*ctx.prompt, await ctx.chat(ctx.prompt)]


class One(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0)


app = create_rollout_server(backend=LocalBackend(
    workflow=Writer, grader=One,
    workflow_config=AgentWorkflowConfig(
        name="writer", concurrency=ConcurrencyConfig(max_concurrent=1)),
))

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]),
                log_level="warning")
'''


class Quiet:
    """A reporter that shows nothing (the run's log is in its directory)."""

    def stage(self, message: str) -> None:
        pass

    def start_progress(self, total: int, done: int, *, pass_threshold: float) -> None:
        pass

    def advance(self, record: AttemptRecord) -> None:
        pass

    def log_line(self, line: str) -> None:
        pass


def allocated(root: Path) -> int:
    """Bytes the files below `root` hold on disk."""
    return sum(p.lstat().st_blocks * 512 for p in root.rglob("*") if not p.is_symlink())


def children_left() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if MARKER.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.parametrize("kind", ["outbox_root", "tmp", "home", "child"])
def test_a_rollout_writing_past_its_disk_quota_fails_resource_limit_and_keeps_nothing(
    tmp_path, kind
):
    rows = [row(kind), row("pass"), row("pass"), row("pass")]  # the first two run
    config = make_workspace(tmp_path, rows, limit=2, main=WRITER)
    with FakeModelServer() as model:
        plan = plan_run(config, RunOptions(name="disk", environ=model_env(model)))
        spec = SandboxSiteSpec(policy=SandboxPolicy(limits=LIMITS))
        report = asyncio.run(run_evaluation(plan, Quiet(), site=spec))

    run_dir = plan.run_dir
    said = (run_dir / "logs.txt").read_text()
    records = {
        r["row_index"]: r
        for r in map(json.loads, (run_dir / "index.jsonl").read_text().splitlines())
    }
    assert report.status == "finished", said
    assert (records[0]["status"], records[0].get("error_type")) == ("failed", "resource_limit")
    assert records[1]["status"] == "success", said  # the server that follows starts clean
    journal = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    message = next(e["error_message"] for e in journal if e["row_index"] == 0)
    assert message.startswith("resource_limit: ") and "exceeded its" in message, message
    # Nothing of the failed attempt is kept; the passing one keeps its artifact, once.
    assert not (run_dir / "artifacts" / "row_0_run_0").exists()
    # rollout_trials/<id>/ holds what the official `eval upload` reads: the trajectory and
    # links to the kept artifacts, never a second copy of them.
    assert not (run_dir / "rollout_trials" / records[0]["rollout_id"] / "artifacts").exists()
    kept = run_dir / "artifacts" / "row_1_run_0" / "notes.txt"
    assert kept.read_text() == "an honest artifact"
    mirrored = run_dir / "rollout_trials" / records[1]["rollout_id"] / "artifacts" / "notes.txt"
    assert mirrored.stat().st_ino == kept.stat().st_ino
    assert sorted(p.name for p in mirrored.parent.iterdir()) == ["notes.txt"]
    # The space comes back: no outbox, no ended attempts, no writer left.
    assert not [p for p in run_dir.parent.iterdir() if ".sandbox" in p.name]
    assert not [p for p in run_dir.iterdir() if ".sandbox" in p.name]
    assert allocated(run_dir) < 2 * MiB, sorted(
        (p.lstat().st_blocks, str(p)) for p in run_dir.rglob("*")
    )[-5:]
    # The sandbox's PID namespace died with its server: its processes go (exits take a moment).
    deadline = time.monotonic() + 10
    while children_left() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not children_left()


def test_a_stale_outbox_is_removed_when_a_site_starts(tmp_path):
    """A killed engine leaves its outbox (and ended attempts); the resumed run's site removes
    them before its servers start (the platform does too, when it notices the dead worker)."""
    rollout = tmp_path / "ws" / "rollouts" / "writer"
    rollout.mkdir(parents=True)
    (rollout / "main.py").write_text(WRITER)
    trials = tmp_path / "run" / "rollout_trials"
    stale = [
        trials.parent / "rollout_trials.sandbox" / "junk.bin",
        trials.parent / "rollout_trials.sandbox-ended" / "writer-0" / "r1" / "log.bin",
    ]
    for path in stale:
        path.parent.mkdir(parents=True)
        path.write_bytes(b"x" * MiB)
    lines: list[str] = []
    site = SandboxSite(
        prepare_environment(rollout, cache_root=tmp_path / "envs", log=lines.append),
        rollout,
        "main.py",
        env={},
        trials_root=trials,
        log=lines.append,
        redactor=Redactor([]),
        policy=SandboxPolicy(limits=LIMITS),
        workspace=rollout.parent.parent,
        bridge_url="http://127.0.0.1:45999/v1",
        bridge_address=("127.0.0.1", 45999),
    )

    async def start_and_stop() -> list[str]:
        await site.start(1)
        try:
            return sorted(os.listdir(trials.parent))
        finally:
            await site.stop()

    assert asyncio.run(start_and_stop()) == ["rollout_trials.sandbox"]  # fresh and empty
    assert not any(path.exists() for path in stale)
    assert not (trials.parent / "rollout_trials.sandbox").exists()
