"""The end of `osmosis eval run`: a rollout whose lifespan has shutdown work is stopped
gracefully, and the command ends only once every server is gone, its shutdown run to its end."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import CLI, model_env
from tests.e2e.workspace import SCRIPTED_MAIN, make_workspace, row

pytestmark = pytest.mark.slow

# The scripted rollout with a lifespan whose shutdown marks its start, takes a while (a user's
# rollout closing a database, flushing a file), then marks its end: one pair of files per
# server process, named by its pid.
LIFESPAN_MAIN = SCRIPTED_MAIN.replace(
    "app = create_rollout_server(backend=LocalBackend(",
    """import contextlib


@contextlib.asynccontextmanager
async def lifespan(app):
    yield
    marks = Path(os.environ["LIFESPAN_DIR"])
    (marks / f"{os.getpid()}.stopping").write_text("")
    await asyncio.sleep(float(os.environ["LIFESPAN_EXIT_SEC"]))
    (marks / f"{os.getpid()}.closed").write_text("")
    print("lifespan: closed", flush=True)


app = create_rollout_server(lifespan=lifespan, backend=LocalBackend(""",
)


def _until(condition: Callable[[], bool], *, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.mark.parametrize("replicas", [1, 2])
def test_the_command_waits_for_each_rollouts_lifespan_shutdown_and_leaves_none_behind(
    tmp_path, fake_model, replicas
):
    assert "lifespan=lifespan" in LIFESPAN_MAIN  # the scripted main still has that line
    config = make_workspace(tmp_path, [row("pass", a, 7) for a in range(2, 6)], main=LIFESPAN_MAIN)
    marks = tmp_path / "marks"
    marks.mkdir()
    env = model_env(fake_model, LIFESPAN_DIR=str(marks), LIFESPAN_EXIT_SEC="1.5")
    command = [*CLI, "eval", "run", str(config), "--name", "ends", "-y", "--json"]
    command += ["--replicas", str(replicas)]
    process = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        _until(
            lambda: len(list(marks.glob("*.stopping"))) == replicas or process.poll() is not None,
            seconds=90,
            what="the rollout servers' lifespan shutdown",
        )
        assert process.poll() is None, process.communicate()[1]
        assert not list(marks.glob("*.closed"))  # shutting down (1.5 s each), not killed
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    assert json.loads(out)["resource"]["outcomes"]["passed"] == 4
    # The command ended after every server's shutdown ran to its end, and left none behind.
    pids = sorted(int(mark.name.split(".")[0]) for mark in marks.glob("*.stopping"))
    assert sorted(int(mark.name.split(".")[0]) for mark in marks.glob("*.closed")) == pids
    assert [pid for pid in pids if Path(f"/proc/{pid}").exists()] == []
    # What the shutdown printed is in the run's log: the log stays open until the servers end.
    logs = (tmp_path / ".osmosis" / "evals" / "ends" / "logs.txt").read_text()
    assert logs.count("[rollout] lifespan: closed") == replicas


# Inside the sandbox the lifespan cannot write to the test's directory: it says it closed.
SANDBOXED_LIFESPAN_MAIN = SCRIPTED_MAIN.replace(
    "app = create_rollout_server(backend=LocalBackend(",
    """import contextlib


@contextlib.asynccontextmanager
async def lifespan(app):
    yield
    await asyncio.sleep(0.5)
    print("lifespan: closed", flush=True)


app = create_rollout_server(lifespan=lifespan, backend=LocalBackend(""",
)


def test_a_sandboxed_rollouts_lifespan_shutdown_runs_to_its_end(tmp_path, fake_model):
    # SIGTERM to bwrap's process group ended the outer bwrap alone, and --die-with-parent
    # killed the server before its lifespan's shutdown could run: the shim is asked instead.
    config = make_workspace(
        tmp_path, [row("pass", a, 7) for a in range(2, 6)], main=SANDBOXED_LIFESPAN_MAIN
    )
    done = subprocess.run(
        [*CLI, "eval", "run", str(config), "--name", "boxed", "-y", "--json", "--sandbox"],
        cwd=tmp_path,
        env=model_env(fake_model),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["resource"]["outcomes"]["passed"] == 4
    logs = (tmp_path / ".osmosis" / "evals" / "boxed" / "logs.txt").read_text()
    assert logs.count("[rollout] lifespan: closed") == 1
