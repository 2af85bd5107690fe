"""`osmosis eval run --estimate` (issue 28, part 1): the model calls, tokens and cost a run
would spend, with a range, and nothing dispatched. Before any run of the rollout it is worked
out from the rows' prompts on a stated assumption; after one run of the rollout on a few rows,
the estimate for all of them is within 20 % of what that run then uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import model_env, osmosis
from tests.e2e.workspace import SCRIPTED_MAIN, make_workspace, row

pytestmark = pytest.mark.slow

ROWS = 20
CALLS = 2  # model calls per attempt, so that calls per attempt come from the earlier run
TWO_CALLS_MAIN = SCRIPTED_MAIN.replace(
    "        reply = await ctx.chat(ctx.prompt)\n",
    "".join(["        reply = await ctx.chat(ctx.prompt)\n"] * CALLS),
)
PRICE = "input_usd_per_mtok = 2.0\noutput_usd_per_mtok = 8.0\n"


def _eval_run(root: Path, config: Path, fake_model, *args: str) -> tuple[int, dict, str]:
    done = osmosis(
        "eval", "run", str(config), *args, cwd=root, env=model_env(fake_model)
    )  # fmt: skip
    data = json.loads(done.stdout) if "--json" in args and done.stdout.strip() else {}
    return done.returncode, data, done.stdout + done.stderr


def test_the_estimate_dispatches_nothing_and_after_one_run_is_within_20_percent(
    tmp_path: Path, fake_model
) -> None:
    # The first five rows are not all of them: their prompts differ a little in length.
    rows = [row("pass", a, 3) for a in range(2, 2 + ROWS)]
    config = make_workspace(tmp_path, rows, main=TWO_CALLS_MAIN)
    config.write_text(config.read_text().replace("[evaluation]\n", "[evaluation]\n" + PRICE, 1))
    runs = tmp_path / ".osmosis" / "evals"
    served = fake_model.stats().chat_completions

    code, first, _ = _eval_run(tmp_path, config, fake_model, "--estimate", "--json")
    assert code == 0
    estimate = first["data"]
    assert estimate["basis"] == "dataset"
    assert estimate["attempts"] == ROWS
    assert "assumed 1 model call per attempt" in estimate["source"]
    tokens = estimate["tokens"]
    assert 0 < tokens["low"] < tokens["expected"] < tokens["high"]
    assert estimate["cost_usd"]["expected"] > 0
    assert estimate["price_source"] == "the config's input_usd_per_mtok and output_usd_per_mtok"
    # Nothing was dispatched, nothing was written.
    assert fake_model.stats().chat_completions == served
    assert not runs.exists() or not any(runs.iterdir())

    code, _, output = _eval_run(tmp_path, config, fake_model, "--limit", "5", "--name", "few", "-y")
    assert code == 0, output

    code, after, _ = _eval_run(
        tmp_path, config, fake_model, "--estimate", "--json", "--name", "all"
    )
    assert code == 0
    estimate = after["data"]
    assert estimate["basis"] == "history"
    assert estimate["source"] == "earlier run few (5 attempts recorded)"
    assert estimate["attempts"] == ROWS
    assert estimate["calls"]["expected"] == pytest.approx(ROWS * CALLS)
    assert not (runs / "all").exists()

    code, done, output = _eval_run(tmp_path, config, fake_model, "--name", "all", "-y", "--json")
    assert code == 0, output
    actual = done["resource"]["metrics"]["tokens_used"]
    assert abs(estimate["tokens"]["expected"] - actual) <= 0.2 * actual, (estimate, actual)
    assert estimate["tokens"]["low"] <= actual <= estimate["tokens"]["high"], (estimate, actual)
    spent = json.loads((runs / "all" / "metrics.json").read_text())["eval_run"]["bridge"]
    assert spent["spent_calls"] == ROWS * CALLS

    # The table says the same, in words, and that nothing ran.
    code, _, output = _eval_run(tmp_path, config, fake_model, "--estimate", "--name", "more")
    assert code == 0, output
    assert "Estimate for more (nothing was run)" in output
    assert "earlier run" in output and "Tokens" in output and "$" in output


def test_estimate_takes_one_model(tmp_path: Path, fake_model) -> None:
    config = make_workspace(tmp_path, [row("pass", a, 3) for a in range(2, 6)])
    code, _, output = _eval_run(
        tmp_path, config, fake_model, "--estimate", "--model", "openai/a", "--model", "openai/b"
    )
    assert code == 1
    assert "--estimate takes one --model" in output
