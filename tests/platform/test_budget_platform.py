"""Budgets on the platform (issue 28, part 1): the platform's ceilings (`OSMOSIS_BUDGET_MAX_*`)
bound every run; a run halted by its budget ends `halted`, not `failed`, with no attempt failed
for it and at most one call's worth past the limit per attempt in flight, and the API and the
dashboard say so; a retry once the ceiling is raised finishes every attempt once. A real server
process and real workers, on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import httpx
import pytest

from osmosis.platform.core.settings import Settings
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

CALLS = 3  # model calls per attempt: a call held mid-attempt must leave its attempt pending
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


def _relaunch(server: Server, **settings: str) -> None:
    """What an operator does to change a ceiling: stop the server, set it, start again."""
    server.stop()
    server.env.update(settings)
    server.launch()


def _page(server: Server, path: str) -> str:
    with httpx.Client(base_url=server.url, headers={"accept": "text/html"}) as browser:
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', browser.get("/login").text)
        assert csrf is not None
        answer = browser.post(
            "/login", data={"token": server.admin_token, "csrf_token": csrf.group(1)}
        )
        assert answer.status_code == 303, answer.text
        page = browser.get(path)
        assert page.status_code == 200, page.text
        return page.text


@pytest.mark.slow
@pytest.mark.timeout(600)  # three server starts and four runs
def test_a_ceiling_at_half_halts_the_run_and_a_raised_one_finishes_it_on_retry(
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
            needed = (full.metrics or {})["eval_run"]["bridge"]
            assert needed["spent_calls"] == ROWS * CALLS
            journal = read_jsonl(run_dir(server, full.eval_run.id) / "events.jsonl")
            per_call = max(record["tokens"] for record in journal) / CALLS
        ceiling = needed["spent_tokens"] // 2

        _relaunch(server, OSMOSIS_BUDGET_MAX_TOKENS_TOTAL=str(ceiling))
        with server.client() as client:
            created = submit(client, repo)
            halted = finished(client, created.id)
            logs = "\n".join(all_logs(client, created.id))
            assert halted.eval_run.status == "halted", logs
            error = halted.eval_run.error or ""
            assert error.startswith(f"budget: max_tokens_total {ceiling:,} reached"), error
            assert "retry the run with a raised budget" in error
            assert halted.summary.failed == 0
            assert 0 < halted.summary.progress.completed < ROWS
            spent = (halted.metrics or {})["eval_run"]["bridge"]["spent_tokens"]
            # Calls already forwarded finish: at most one call's worth past the ceiling per
            # attempt in flight.
            assert ceiling <= spent <= ceiling + IN_FLIGHT * per_call
            assert (halted.metrics or {})["eval_run"]["status"] == "halted"
            first = read_jsonl(run_dir(server, created.id) / "events.jsonl")
            assert all(record["status"] == "success" for record in first)
            # The dashboard names the state and the reason, on the run and in the list.
            page = _page(server, f"/runs/{created.name}")
            assert 'data-status="halted"' in page
            assert "<dt>Halted</dt>" in page and f"max_tokens_total {ceiling:,}" in page
            assert 'data-status="halted"' in _page(server, "/?status=halted")
            # `eval info --json` (ours) and the official CLI's route say the same.
            info = osmosis("--json", "eval", "info", created.name, env=server.env)
            assert info.returncode == 0, info.stderr
            shown = json.loads(info.stdout)["data"]["eval_run"]
            assert (shown["status"], shown["error"]) == ("halted", error)
            official = httpx.get(
                f"{server.url}/api/cli/eval-runs/{created.name}",
                headers={"Authorization": f"Bearer {server.admin_token}"},
                timeout=30,
            )
            assert official.json()["eval_run"]["status"] == "halted", official.text

            # A retry under the same ceiling halts again at once: nothing more is spent.
            client.runs.retry(created.id)
            again = finished(client, created.id)
            logs = "\n".join(all_logs(client, created.id))
            assert again.eval_run.status == "halted", logs
            assert again.summary.progress.completed == len(first)

        _relaunch(server, OSMOSIS_BUDGET_MAX_TOKENS_TOTAL=str(needed["spent_tokens"] * 4))
        with server.client() as client:
            retried = client.runs.retry(created.id)
            assert retried.retryable_samples == ROWS - len(first)
            done = finished(client, created.id)
            logs = "\n".join(all_logs(client, created.id))
            assert done.eval_run.status == "finished", logs
            assert (done.summary.passed, done.summary.failed) == (ROWS, 0)
            records = read_jsonl(run_dir(server, created.id) / "events.jsonl")
            assert len({(r["row_index"], r["run_index"]) for r in records}) == len(records)
            assert len(records) == ROWS
            assert records[: len(first)] == first

        # The run's own budget, under the ceiling, halts it; `eval retry` raises it (past the
        # ceiling: clamped to it, and the log says so) and the run finishes.
        _relaunch(server, OSMOSIS_BUDGET_MAX_MODEL_CALLS=str(ROWS * CALLS + 10))
        config = repo.config.read_text()
        own = config.replace("[evaluation]\n", "[evaluation]\nmax_model_calls = 6\n", 1)
        repo.config.write_text(own)
        repo.push("a budget of 6 calls")
        with server.client() as client:
            capped = finished(client, submit(client, repo).id)
            assert capped.eval_run.status == "halted"
            assert (capped.eval_run.error or "").startswith("budget: max_model_calls 6 reached")
            assert (capped.metrics or {})["eval_run"]["bridge"]["spent_calls"] == 6
            name = capped.eval_run.name
            retry = osmosis("--json", "eval", "retry", name, "--max-model-calls", "500", "-y",
                            env=server.env)  # fmt: skip
            assert retry.returncode == 0, retry.stderr
            done = finished(client, name)
            logs = "\n".join(all_logs(client, name))
            assert done.eval_run.status == "finished", logs
            failures = [
                (r["row_index"], r.get("error_type"), r.get("error_message"))
                for r in read_jsonl(run_dir(server, done.eval_run.id) / "events.jsonl")
                if r["status"] != "success"
            ]
            assert (done.summary.passed, done.summary.failed) == (ROWS, 0), (failures, logs)
            assert f"(OSMOSIS_BUDGET_MAX_MODEL_CALLS={ROWS * CALLS + 10}); this run gets" in logs
            assert (done.metrics or {})["eval_run"]["bridge"]["spent_calls"] == ROWS * CALLS
            # What the run gets: the 500 it was given last, clamped to the ceiling.
            assert done.config["max_model_calls"] == ROWS * CALLS + 10
    finally:
        server.stop()


def test_a_run_budget_is_clamped_to_the_ceilings_and_gets_them_when_it_sets_none():
    settings = Settings(budget_max_tokens_total=1000, budget_max_cost_usd=2.5)
    said: list[str] = []
    budget = run_budget(
        {"max_tokens_total": 5000, "max_cost_usd": 1.0, "max_model_calls": 9},
        settings,
        log=lambda line, level: said.append(f"{level}: {line}"),
    )
    assert (budget.max_tokens_total, budget.max_cost_usd, budget.max_model_calls) == (1000, 1.0, 9)
    assert said == [
        "warning: budget: max_tokens_total 5000 is above the platform's ceiling "
        "(OSMOSIS_BUDGET_MAX_TOKENS_TOTAL=1000); this run gets 1000"
    ]
    unset = run_budget({}, settings)
    assert (unset.max_tokens_total, unset.max_cost_usd, unset.max_model_calls) == (1000, 2.5, None)
    assert not run_budget({}, Settings()).limited
