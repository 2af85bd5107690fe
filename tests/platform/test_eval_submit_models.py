"""`osmosis eval submit --model a --model b -n N --limit L`: one platform run per model over the
same rows, the overrides in the config text the server checks and the worker plans from, and
with `--wait` one table of both models (issue 27.4). A real server process, a workspace whose
`origin` is a local bare repository, the CLI as a subprocess, the scripted model."""

from __future__ import annotations

import pytest

from osmosis.testing import Rule
from tests.platform.test_eval_cli import CONFIG, eval_workspace, fake_model, offline_env
from tests.platform.test_workspaces import cli, cli_error, cli_json
from tests.unit.test_git_state import git

__all__ = ["fake_model", "offline_env"]  # fixtures, shared with test_eval_cli


def test_bad_overrides_are_refused_together_before_any_request(tmp_path, offline_env):
    tree = eval_workspace(tmp_path)
    args = ("--model", "openai/a", "--model", "openai/a", "--model", " ", "-n", "0", "--limit", "0")
    error = cli_error("eval", "submit", CONFIG, "-y", *args, env=offline_env, cwd=tree)
    assert error["code"] == "VALIDATION"
    problems = error["details"]["problems"]
    assert "--model must name a model, e.g. openai/gpt-5-mini" in problems
    assert any(p.startswith("each --model once") for p in problems)
    assert "-n must be at least 1, got 0" in problems
    assert "--limit must be at least 1, got 0" in problems


@pytest.mark.slow
@pytest.mark.timeout(300)  # two runs on the real worker
def test_two_models_submit_two_runs_and_wait_prints_one_table_and_gates_each(
    running_platform, fake_model, tmp_path
):
    tree = eval_workspace(tmp_path, secrets=["OPENAI_API_KEY", "OPENAI_API_BASE"])
    # The local file (what submit reads) says n = 3 and limit = 6: the flags must win.
    config = tree / CONFIG
    config.write_text(
        config.read_text().replace("n = 1", "n = 3").replace("limit = 4", "limit = 6")
    )
    env = {
        **running_platform.env,
        "OPENAI_API_KEY": "sk-fake-for-the-run-27-4",
        "OPENAI_API_BASE": fake_model.base_url,
        "COLUMNS": "200",
    }
    cli_json("dataset", "upload", "data/scripted.jsonl", "-y", env=env, cwd=tree)

    flags = ("--model", "openai/a", "--model", "openai/b", "-n", "1", "--limit", "4")
    # Without --wait, --json lists the submitted runs: one per model, same commit, same rows.
    listed = cli_json("eval", "submit", CONFIG, *flags, "-y", env=env, cwd=tree)["items"]
    assert [item["model_name"] for item in listed] == ["openai/a", "openai/b"]
    assert {item["config"]["commit_sha"] for item in listed} == {git(tree, "rev-parse", "HEAD")}
    assert [(item["config"]["n"], item["config"]["limit"], item["rows"]) for item in listed] == [
        (1, 4, 4)
    ] * 2

    # Model b answers every question wrong: its run finishes, below the gate; a's passes.
    fake_model.add_rule(Rule(when=lambda request: request.model.endswith("b"), respond="0"))
    try:
        gate = ("--min-pass-rate", "0.5")
        done = cli("eval", "submit", CONFIG, *flags, *gate, "--wait", "-y", env=env, cwd=tree)
    finally:
        fake_model.clear_rules()
    assert done.returncode == 3, done.stdout + done.stderr
    assert "below the gate: openai/b (exit 3)" in done.stderr
    assert "4 of 6 (--limit = 4)" in done.stdout  # the rows the summary announced
    assert done.stdout.count("Models side by side") == 1
    table = done.stdout[done.stdout.index("Models side by side") :]
    lines = {model: line for line in table.splitlines() for model in ("openai/a", "openai/b")
             if model in line}  # fmt: skip
    assert set(lines) == {"openai/a", "openai/b"}
    assert "finished" in lines["openai/a"] and " 100.0% [" in lines["openai/a"]
    assert "finished" in lines["openai/b"] and " 0.0% [" in lines["openai/b"]

    runs = cli_json("eval", "list", env=env, cwd=tree)["items"]
    assert sorted(run["model"] for run in runs) == ["openai/a", "openai/a", "openai/b", "openai/b"]
    for run in runs:
        if run["name"] in {item["name"] for item in listed}:
            continue  # the --json pair: not waited for
        data = cli_json("eval", "info", run["name"], env=env, cwd=tree)["data"]
        assert run["name"] in lines[run["model"]]  # the table names each model's run
        assert data["eval_run"]["status"] == "finished", data["eval_run"]["error"]
        assert data["summary"]["progress"] == {"completed": 4, "total": 4, "unit": "samples"}
        # What the server parsed from the config text it was sent: the overridden values.
        config = data["config"]
        assert (config["model_path"], config["n"], config["limit"]) == (run["model"], 1, 4)
