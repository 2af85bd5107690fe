"""`osmosis eval run` starts with only what it uses (issue 30): the command tree holds the branch
the line names, and libraries only some runs need (retries, a pyproject's requirements, JUnit)
load when a run needs them. A line that names no command still sees every command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from osmosis.testing import FakeModelServer
from tests.e2e.workspace import make_workspace, row

CLI = [sys.executable, "-c", "from osmosis.cli.main import run; run()"]

# A whole `eval run` through `main`, then what the process imported on the way.
PROBE = """
import json, sys
from osmosis.cli.main import main
code = main(sys.argv[1:])
print("LOADED " + json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""

# What a local run with no retry, no pyproject.toml and no --junit never uses.
NOT_FOR_EVAL_RUN = (
    # the other groups and commands
    "osmosis.cli.admin",
    "osmosis.cli.auth",
    "osmosis.cli.dataset",
    "osmosis.cli.dev",
    "osmosis.cli.doctor",
    "osmosis.cli.init",
    "osmosis.cli.rollout",
    "osmosis.cli.secret",
    "osmosis.cli.server",
    "osmosis.cli.template",
    "osmosis.cli.workspace",
    "osmosis.cli.eval.compare",
    "osmosis.cli.eval.download",
    "osmosis.cli.eval.info",
    "osmosis.cli.eval.local_runs",  # --report/--junit, or errored rows to describe
    "osmosis.cli.eval.rubric",
    "osmosis.cli.eval.runs",
    "osmosis.cli.eval.submit",
    "osmosis.cli.eval.transfer",
    "osmosis.cli.eval.upload",
    "osmosis.cli.eval.view",
    # libraries a run loads only when it needs them
    "tenacity",  # the first retryable provider fault (osmosis.eval.model.retry)
    "packaging",  # a rollout with a pyproject.toml (osmosis.eval.sites.environment)
    "xml.etree.ElementTree",  # --junit (osmosis.cli.eval.report)
)


def test_eval_run_imports_neither_other_commands_nor_what_this_run_does_not_use(tmp_path: Path):
    config = make_workspace(tmp_path, [row("pass", a) for a in range(2, 6)], limit=1)
    with FakeModelServer() as model:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OSMOSIS_", "OPENAI_"))}
        env.update(OPENAI_API_BASE=model.base_url, OPENAI_API_KEY="sk-test-not-a-real-key")
        command = ["--json", "eval", "run", str(config), "-y", "--name", "lean"]
        done = subprocess.run(
            [sys.executable, "-c", PROBE, *command],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("LOADED ")]
    loaded = json.loads(line.removeprefix("LOADED "))
    assert loaded["code"] == 0, done.stderr
    summary = json.loads((tmp_path / ".osmosis/evals/lean/metrics.json").read_text())["summary"]
    assert summary["passed"] == 1  # a real run happened: the check below is not of an error path
    modules = set(loaded["modules"])
    assert "osmosis.cli.eval.run" in modules  # the probe sees what the run imported
    assert sorted(modules.intersection(NOT_FOR_EVAL_RUN)) == []


def osmosis(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=60)


EVAL_COMMANDS = ["run", "rubric", "submit", "list", "info", "logs", "stop", "retry", "download",
                 "compare", "upload", "view"]  # fmt: skip
GROUPS = ["doctor", "init", "dataset", "dev", "eval", "server", "auth", "admin", "secret",
          "workspace", "rollout", "template"]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "listed"),
    [(("--help",), GROUPS), (("eval", "--help"), EVAL_COMMANDS), (("eval",), EVAL_COMMANDS)],
)
def test_help_still_lists_every_command_in_order(args: tuple[str, ...], listed: list[str]):
    done = osmosis(*args)
    text = done.stdout + done.stderr
    rows = [line.strip("│ ").split(" ", 1)[0] for line in text.splitlines()]
    assert [name for name in rows if name in listed] == listed


@pytest.mark.parametrize(
    ("args", "suggestion"),
    [(("evl", "run"), "Did you mean 'eval', 'dev'?"), (("eval", "rn"), "Did you mean 'run'?")],
)
def test_a_mistyped_command_is_still_matched_against_every_command(
    args: tuple[str, ...], suggestion: str
):
    done = osmosis(*args)
    assert done.returncode == 2
    assert suggestion in done.stderr


# `eval run`'s early server start (`osmosis.cli.prestart`), in a fresh interpreter: what it
# loaded by the time the server was spawned.
EARLY_PROBE = """
import json, sys
from osmosis.cli import prestart
from osmosis.eval.sites import prestart as held
prestart.begin(sys.argv[1:])
early = held.claim()
loaded = sorted(sys.modules)
if early is not None:
    early.kill()
print("EARLY " + json.dumps({"started": early is not None, "modules": loaded}))
"""


def test_the_early_server_start_loads_neither_typer_nor_pydantic(tmp_path: Path):
    config = make_workspace(tmp_path, [row("pass", a) for a in range(2, 6)], limit=1)
    done = subprocess.run(
        [sys.executable, "-c", EARLY_PROBE, "eval", "run", str(config), "-y"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("EARLY ")]
    early = json.loads(line.removeprefix("EARLY "))
    assert early["started"], done.stderr  # the check below is of a real start
    heavy = {"typer", "click", "rich", "pydantic", "fastapi", "osmosis.eval.sites.api",
             "osmosis.eval.host.plan", "osmosis.eval.inputs.config"}  # fmt: skip
    assert sorted(heavy.intersection(early["modules"])) == []
