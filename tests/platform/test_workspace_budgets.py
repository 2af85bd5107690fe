"""Per-workspace budget defaults and ceilings (issue 28, part 1, the platform's share).

A run's budget is its config's limit, else its workspace's default, else the platform's ceiling,
clamped to the lower of the workspace's and the platform's ceilings. Owners set defaults,
admins ceilings; a member is refused with a 403 that says who may. A workspace ceiling at half
of what a run needs halts it `budget` with nothing failed, and a retry with a raised budget under
a raised ceiling finishes every attempt once. Real server processes and workers, real HTTP, on
SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from osmosis.platform.core.db.models import Workspace
from osmosis.platform.core.settings import Settings
from osmosis.platform.services.workspaces import effective_budget
from osmosis.platform.worker.run_worker import run_budget
from osmosis.testing import FakeModelServer
from tests.e2e.workspace import SCRIPTED_MAIN, row
from tests.platform.conftest import osmosis
from tests.platform.eval_world import (
    Server,
    all_logs,
    finished,
    make_repo,
    read_jsonl,
    run_dir,
    submit,
    upload_dataset,
)
from tests.platform.test_workspaces import cli_error, cli_json, headers, new_user
from tests.platform.test_workspaces import make_repo as git_tree

CALLS = 3  # model calls per attempt: a call held mid-attempt leaves its attempt pending
IN_FLIGHT = 2
ROWS = 10
THREE_CALLS_MAIN = SCRIPTED_MAIN.replace(
    "        reply = await ctx.chat(ctx.prompt)\n",
    "".join(["        reply = await ctx.chat(ctx.prompt)\n"] * CALLS),
)


@pytest.fixture(scope="module")
def fake_model() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


# -- the rule, in process ---------------------------------------------------------------------
def _workspace(**limits: float) -> Workspace:
    return Workspace(identity="acme/evals", **{f"budget_{k}": v for k, v in limits.items()})


def test_config_then_workspace_default_then_platform_ceiling_clamped_to_the_lower_ceiling():
    settings = Settings(budget_max_tokens_total=10_000, budget_max_cost_usd=2.5)
    workspace = _workspace(
        default_tokens_total=3_000,
        ceiling_tokens_total=4_000,
        default_model_calls=50,
        ceiling_cost_usd=5.0,
    )
    # Nothing in the config: the workspace's default tokens, the platform's (lower) cost
    # ceiling, the workspace's default calls.
    found = effective_budget({}, workspace, settings)
    assert found.limits == {"max_tokens_total": 3_000, "max_cost_usd": 2.5, "max_model_calls": 50}
    assert found.clamped == []
    # The config's own limits win over the defaults, and are clamped to the lower ceiling,
    # each clamp naming the ceiling that bound it.
    said: list[str] = []
    budget = run_budget(
        {"max_tokens_total": 9_000, "max_cost_usd": 9.0, "max_model_calls": 7},
        settings,
        workspace=workspace,
        log=lambda line, level: said.append(f"{level}: {line}"),
    )
    assert (budget.max_tokens_total, budget.max_cost_usd, budget.max_model_calls) == (4000, 2.5, 7)
    assert said == [
        "warning: budget: max_tokens_total 9000 is above the workspace ceiling of acme/evals "
        "(max_tokens_total 4000); this run gets 4000",
        "warning: budget: max_cost_usd 9 is above the platform's ceiling "
        "(OSMOSIS_BUDGET_MAX_COST_USD=2.5); this run gets 2.5",
    ]
    # A workspace ceiling with no platform ceiling: a run setting nothing gets it.
    alone = effective_budget({}, _workspace(ceiling_model_calls=12), Settings())
    assert alone.limits == {"max_tokens_total": None, "max_cost_usd": None, "max_model_calls": 12}
    # A default above the platform's ceiling is clamped, and the line says it was the default.
    high = effective_budget({}, _workspace(default_tokens_total=50_000), settings)
    assert high.limits["max_tokens_total"] == 10_000
    assert high.clamped == [
        "budget: the workspace's default max_tokens_total 50000 is above the platform's "
        "ceiling (OSMOSIS_BUDGET_MAX_TOKENS_TOTAL=10000); this run gets 10000"
    ]


# -- who sets what, and what is valid -----------------------------------------------------------
def _patch(platform, token: str, git: str, body: object) -> httpx.Response:
    return httpx.patch(
        f"{platform.url}/api/workspace/budget", json=body, headers=headers(token, git), timeout=30
    )


@pytest.mark.slow
def test_owners_set_defaults_admins_set_ceilings_members_neither(running_platform, tmp_path):
    tree = git_tree(tmp_path)
    owner, as_owner = new_user(running_platform, "bea")
    member, as_member = new_user(running_platform, "cal")
    admin = running_platform.env
    created = cli_json("workspace", "create", "--owner", "bea@example.com", env=admin, cwd=tree)
    git = created["resource"]["identity"]
    added = httpx.post(
        f"{running_platform.url}/api/workspace/members",
        json={"email": "cal@example.com", "role": "member"},
        headers=headers(owner["token"], git),
        timeout=30,
    )
    assert added.status_code == 201, added.text

    shown = cli_json("workspace", "budget", env=as_member, cwd=tree)["data"]
    assert (
        shown["defaults"]
        == shown["ceilings"]
        == {
            "max_tokens_total": None,
            "max_cost_usd": None,
            "max_model_calls": None,
        }
    )

    # The owner sets a default (the CLI), not a ceiling: that caps the owner's own spending.
    done = cli_json(
        "workspace", "budget", "--default", "max_tokens_total=200000", env=as_owner, cwd=tree
    )
    assert done["resource"]["defaults"]["max_tokens_total"] == 200_000
    refused = cli_error(
        "workspace", "budget", "--ceiling", "max_cost_usd=5", env=as_owner, cwd=tree
    )
    assert refused["code"] == "FORBIDDEN"
    assert "only a platform admin sets a workspace's budget ceilings" in refused["message"]

    # A member may do neither: a 403 that says who may.
    answer = _patch(running_platform, member["token"], git, {"defaults": {"max_model_calls": 9}})
    assert answer.status_code == 403, answer.text
    error = answer.json()["error"]
    assert error["code"] == "FORBIDDEN"
    assert error["message"].startswith(f"only an owner of {git} or an admin sets its budget")
    assert "you are a member" in error["message"] and "bea" in error["message"]
    answer = _patch(running_platform, member["token"], git, {"ceilings": {"max_model_calls": 9}})
    assert answer.status_code == 403 and "platform admin" in answer.json()["error"]["message"]
    # Nothing changed.
    after = cli_json("workspace", "budget", env=as_member, cwd=tree)["data"]
    assert after["defaults"]["max_model_calls"] is None and after["ceilings"] == shown["ceilings"]

    # Bad values: a 400 naming the field and what is valid.
    token = running_platform.admin_token
    for field, value, valid in [
        ("max_tokens_total", -5, "a positive whole number"),
        ("max_tokens_total", 0, "a positive whole number"),
        ("max_tokens_total", 2.5, "a positive whole number"),
        ("max_model_calls", "lots", "a positive whole number"),
        ("max_model_calls", True, "a positive whole number"),
        ("max_cost_usd", 0, "a positive number of USD"),
        ("max_cost_usd", "5", "a positive number of USD"),
        ("max_cost_usd", -0.5, "a positive number of USD"),
    ]:
        answer = _patch(running_platform, token, git, {"ceilings": {field: value}})
        assert answer.status_code == 400, (field, value, answer.text)
        error = answer.json()["error"]
        assert error["code"] == "INVALID_BUDGET"
        assert error["details"]["field"] == f"ceilings.{field}"
        assert error["message"].startswith(f"ceilings.{field} must be {valid}"), error
    answer = _patch(running_platform, token, git, {"defaults": {"max_tokens": 5}})
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == (
        "defaults.max_tokens is not a budget limit; valid: max_tokens_total, max_cost_usd, "
        "max_model_calls"
    )

    # A default above the workspace's ceiling, either way round.
    answer = _patch(running_platform, token, git, {"ceilings": {"max_tokens_total": 100_000}})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["details"]["field"] == "defaults.max_tokens_total"
    assert "200000 is above" in answer.json()["error"]["message"]
    both = _patch(
        running_platform,
        token,
        git,
        {"ceilings": {"max_tokens_total": 300_000, "max_cost_usd": 20}},
    )
    assert both.status_code == 200, both.text
    too_high = cli_error(
        "workspace", "budget", "--default", "max_tokens_total=400000", env=as_owner, cwd=tree
    )
    assert too_high["code"] == "INVALID_BUDGET"
    assert f"is above {git}'s ceiling (300000)" in too_high["message"]

    # What everyone sees: `workspace budget` and `workspace info`, the platform's ceilings too.
    shown = cli_json("workspace", "budget", env=as_member, cwd=tree)["data"]
    assert shown["defaults"]["max_tokens_total"] == 200_000
    assert shown["ceilings"] == {
        "max_tokens_total": 300_000,
        "max_cost_usd": 20.0,
        "max_model_calls": None,
    }
    assert shown["platform_ceilings"]["max_tokens_total"] is None
    info = cli_json("workspace", "info", env=as_member, cwd=tree)["data"]
    assert info["budget"] == {key: shown[key] for key in info["budget"]}
    # `none` unsets a limit; the others stay.
    unset = cli_json("workspace", "budget", "--ceiling", "max_cost_usd=none", env=admin, cwd=tree)
    assert unset["resource"]["ceilings"]["max_cost_usd"] is None
    assert unset["resource"]["ceilings"]["max_tokens_total"] == 300_000


# -- the acceptance line: a workspace ceiling at half of what a run needs -----------------------
def _set_ceiling(server: Server, git: str, limit: int) -> dict:
    done = osmosis(
        "--json", "--workspace", git, "workspace", "budget",
        "--ceiling", f"max_tokens_total={limit}", env=server.env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["resource"]


@pytest.mark.slow
@pytest.mark.timeout(600)  # one server start and four runs
def test_a_workspace_ceiling_at_half_halts_the_run_and_a_raised_one_lets_a_retry_finish(
    tmp_path, fake_model, databases
):
    server = Server.start(tmp_path / "platform", fake_model, databases=databases)
    try:
        rows = [row("pass", a, 3, sleep=0.05) for a in range(2, 2 + ROWS)]
        repo = make_repo(
            tmp_path / "ws",
            rows,
            limit=ROWS,
            batch_size=IN_FLIGHT,
            main=THREE_CALLS_MAIN,
            env={"MAX_CONCURRENT": str(IN_FLIGHT)},
        )
        upload_dataset(server, repo)
        with server.client() as client:
            # What the run needs, with no ceiling.
            full = finished(client, submit(client, repo).id)
            assert full.eval_run.status == "finished"
            needed = (full.metrics or {})["eval_run"]["bridge"]["spent_tokens"]
            journal = read_jsonl(run_dir(server, full.eval_run.id) / "events.jsonl")
            per_call = max(record["tokens"] for record in journal) / CALLS
        ceiling = needed // 2
        # No restart: the workspace's ceiling is read when a run starts.
        assert _set_ceiling(server, repo.git, ceiling)["ceilings"]["max_tokens_total"] == ceiling

        # The run asks for far more than it needs: clamped to the workspace ceiling.
        config = repo.config.read_text()
        asked = needed * 10
        repo.config.write_text(
            config.replace("[evaluation]\n", f"[evaluation]\nmax_tokens_total = {asked}\n", 1)
        )
        repo.push("a generous budget")
        with server.client() as client:
            created = submit(client, repo)
            halted = finished(client, created.id)
            logs = "\n".join(all_logs(client, created.id))
            assert halted.eval_run.status == "halted", logs
            assert (
                f"budget: max_tokens_total {asked} is above the workspace ceiling of {repo.git} "
                f"(max_tokens_total {ceiling}); this run gets {ceiling}"
            ) in logs
            error = halted.eval_run.error or ""
            assert error.startswith(f"budget: max_tokens_total {ceiling:,} reached"), error
            assert halted.summary.failed == 0
            assert 0 < halted.summary.progress.completed < ROWS
            spent = (halted.metrics or {})["eval_run"]["bridge"]["spent_tokens"]
            # Calls already forwarded finish: at most one call's worth past the ceiling per
            # attempt in flight.
            assert ceiling <= spent <= ceiling + IN_FLIGHT * per_call
            first = read_jsonl(run_dir(server, created.id) / "events.jsonl")
            assert all(record["status"] == "success" for record in first)
            # `eval info --json` shows the budget the run gets, not the one it asked for.
            info = osmosis("--json", "eval", "info", created.name, env=server.env)
            assert info.returncode == 0, info.stderr
            assert json.loads(info.stdout)["data"]["config"]["max_tokens_total"] == ceiling

            # A retry raising the budget past the ceiling is clamped, and says so; the run
            # halts again before spending anything.
            raised = needed * 2
            retry = osmosis("--json", "eval", "retry", created.name, "-y",
                            "--max-tokens-total", str(raised), env=server.env)  # fmt: skip
            assert retry.returncode == 0, retry.stderr
            told = json.loads(retry.stdout)
            assert told["resource"]["budget_clamped"] == [
                f"budget: max_tokens_total {raised} is above the workspace ceiling of "
                f"{repo.git} (max_tokens_total {ceiling}); this run gets {ceiling}"
            ]
            assert f"Budget: max_tokens_total {raised} is above" in told["message"]
            again = finished(client, created.id)
            logs = "\n".join(all_logs(client, created.id))
            assert again.eval_run.status == "halted", logs
            assert again.summary.progress.completed == len(first)

        # The admin raises the ceiling past the raised budget: a retry finishes, every
        # attempt once, what was recorded before kept.
        _set_ceiling(server, repo.git, needed * 4)
        with server.client() as client:
            retried = client.runs.retry(created.id, max_tokens_total=raised)
            assert retried.retryable_samples == ROWS - len(first)
            assert retried.budget_clamped == []
            done = finished(client, created.id)
            logs = "\n".join(all_logs(client, created.id))
            assert done.eval_run.status == "finished", logs
            assert (done.summary.passed, done.summary.failed) == (ROWS, 0)
            records = read_jsonl(run_dir(server, created.id) / "events.jsonl")
            assert len({(r["row_index"], r["run_index"]) for r in records}) == len(records)
            assert len(records) == ROWS
            assert records[: len(first)] == first
            assert done.config["max_tokens_total"] == raised
    finally:
        server.stop()
