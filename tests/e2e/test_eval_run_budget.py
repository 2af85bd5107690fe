"""`osmosis eval run` with a budget (issue 28, part 1): at half of what the run needs it halts
`budget`, resumable, with no attempt failed because of it and at most one call's worth past the
limit per attempt in flight; a resume with a raised budget finishes every attempt once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import model_env, osmosis, read_jsonl
from tests.e2e.workspace import SCRIPTED_MAIN, make_workspace, row

pytestmark = pytest.mark.slow

CALLS = 3  # model calls per attempt: a call held mid-attempt must leave it pending
IN_FLIGHT = 2
ROWS = 10
# Three calls in a row, each answered before the next is asked.
THREE_CALLS_MAIN = SCRIPTED_MAIN.replace(
    "        reply = await ctx.chat(ctx.prompt)\n",
    "".join(["        reply = await ctx.chat(ctx.prompt)\n"] * CALLS),
)
# One USD per token: the scripted model is in no price table, so the run overrides its price.
PRICE = "input_usd_per_mtok = 1000000\noutput_usd_per_mtok = 1000000\n"


def _workspace(root: Path) -> Path:
    rows = [row("pass", a, 3, sleep=0.05) for a in range(2, 2 + ROWS)]
    config = make_workspace(root, rows, batch_size=IN_FLIGHT, main=THREE_CALLS_MAIN)
    text = config.read_text().replace("[evaluation]\n", "[evaluation]\n" + PRICE, 1)
    config.write_text(text)
    return config


def _run(root: Path, config: Path, fake_model, name: str, *flags: str) -> tuple[int, dict]:
    done = osmosis(
        "eval",
        "run",
        str(config),
        "--name",
        name,
        "-y",
        "--json",
        *flags,
        cwd=root,
        env=model_env(fake_model, MAX_CONCURRENT=str(IN_FLIGHT)),
    )
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def _spent(root: Path, name: str) -> dict:
    metrics = json.loads((root / ".osmosis" / "evals" / name / "metrics.json").read_text())
    return metrics["eval_run"]


@pytest.mark.parametrize(
    ("flag", "spent_key"),
    [
        ("--max-tokens-total", "spent_tokens"),
        ("--max-cost-usd", "spent_cost_usd"),
        ("--max-model-calls", "spent_calls"),
    ],
)
def test_half_the_budget_halts_resumable_and_a_raised_budget_finishes_every_attempt_once(
    tmp_path: Path, fake_model, flag: str, spent_key: str
) -> None:
    config = _workspace(tmp_path)
    code, full = _run(tmp_path, config, fake_model, "full")
    assert code == 0 and full["resource"]["halted"] is None
    needed = _spent(tmp_path, "full")["bridge"]
    assert needed["spent_calls"] == ROWS * CALLS
    # An attempt sends the same prompt three times: its dearest call is a third of its total.
    key = {"spent_tokens": "tokens", "spent_cost_usd": "cost_usd"}.get(spent_key)
    full_journal = read_jsonl(tmp_path / ".osmosis" / "evals" / "full" / "events.jsonl")
    per_call = max(record[key] for record in full_journal) / CALLS if key else 1
    limit = needed[spent_key] / 2
    shown = str(int(limit)) if spent_key != "spent_cost_usd" else f"{limit:g}"

    code, halted = _run(tmp_path, config, fake_model, "capped", flag, shown)
    assert code == 1, halted
    reason = halted["resource"]["halted"]
    name = flag.removeprefix("--").replace("-", "_")
    assert reason.startswith(f"budget: {name} "), reason
    assert halted["resource"]["failed"] == 0
    eval_run = _spent(tmp_path, "capped")
    assert eval_run["halted"] == reason
    spent = eval_run["bridge"][spent_key]
    # Calls already forwarded finish: at most one call's worth past the limit per attempt in
    # flight (model calls are counted as forwarded, so never past theirs).
    slack = 0 if spent_key == "spent_calls" else IN_FLIGHT * per_call
    assert float(shown) <= spent <= float(shown) + slack + 1e-9
    journal = tmp_path / ".osmosis" / "evals" / "capped" / "events.jsonl"
    first = read_jsonl(journal)
    assert 0 < len(first) < ROWS
    assert all(record["status"] == "success" for record in first)

    code, resumed = _run(tmp_path, config, fake_model, "capped", flag, str(int(limit * 4)))
    assert code == 0, resumed
    assert resumed["resource"]["halted"] is None
    assert resumed["resource"]["failed"] == 0
    records = read_jsonl(journal)
    assert len(records) == ROWS
    assert len({(r["row_index"], r["run_index"]) for r in records}) == ROWS
    assert records[: len(first)] == first


def test_a_resume_without_a_raised_budget_halts_again_before_dispatching(
    tmp_path: Path, fake_model
) -> None:
    config = _workspace(tmp_path)
    code, _ = _run(tmp_path, config, fake_model, "tight", "--max-model-calls", "4")
    assert code == 1
    served = fake_model.stats().chat_completions
    code, again = _run(tmp_path, config, fake_model, "tight", "--max-model-calls", "4")
    assert code == 1
    assert again["resource"]["halted"].startswith("budget: max_model_calls 4 reached")
    assert again["resource"]["dispatched"] == 0
    assert fake_model.stats().chat_completions == served + 1  # the pre-flight only


def test_a_cost_budget_for_a_model_without_a_price_refuses_to_start(
    tmp_path: Path, fake_model
) -> None:
    config = make_workspace(tmp_path, [row("pass", a, 3) for a in range(2, 6)])
    done = osmosis(
        "eval", "run", str(config), "-y", "--json", "--max-cost-usd", "1",
        cwd=tmp_path, env=model_env(fake_model),
    )  # fmt: skip
    assert done.returncode == 1
    error = json.loads(done.stderr)["error"]
    assert error["code"] == "VALIDATION"
    assert "max_cost_usd needs a price for openai/fake-model" in error["message"]
    assert "input_usd_per_mtok" in json.dumps(error)
