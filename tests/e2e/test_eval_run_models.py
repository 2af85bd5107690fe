"""`eval run --model A --model B -n --limit` (issue 27, part 4): the command line overrides the
config's model, attempts and rows; several models run one evaluation each over the same rows
and print one table."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import model_env, osmosis, read_jsonl
from tests.e2e.workspace import make_workspace, row

pytestmark = pytest.mark.slow

ROWS = [row("pass", a, 3) for a in range(2, 8)]


def test_two_models_run_over_the_same_rows_and_print_one_table(tmp_path, fake_model):
    config = make_workspace(tmp_path, ROWS)
    done = osmosis(
        "eval", "run", str(config), "--name", "matrix", "-y", "--json",
        "--model", "openai/model-a", "--model", "openai/model-b", "-n", "2", "--limit", "3",
        cwd=tmp_path, env=model_env(fake_model),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    listing = json.loads(done.stdout)
    items = listing["items"]
    assert [item["model"] for item in items] == ["openai/model-a", "openai/model-b"]
    assert all(item["status"] == "finished" for item in items), items
    for item, slug in zip(items, ("openai-model-a", "openai-model-b"), strict=True):
        assert item["run"] == f"matrix-{slug}"
        run_dir = tmp_path / ".osmosis" / "evals" / item["run"]
        metrics = json.loads((run_dir / "metrics.json").read_text())
        assert metrics["eval_run"]["model_name"] == item["model"]
        records = read_jsonl(run_dir / "index.jsonl")
        # --limit 3 and -n 2: the same three rows, twice each, for both models.
        assert sorted((r["row_index"], r["run_index"]) for r in records) == [
            (r, i) for r in range(3) for i in range(2)
        ]
        assert item["outcomes"]["passed"] == 6 and item["pass_rate"].startswith("100.0%")


def test_one_model_flag_and_overrides_change_a_single_run(tmp_path, fake_model):
    config = make_workspace(tmp_path, ROWS)
    done = osmosis(
        "eval", "run", str(config), "--name", "one", "-y", "--json",
        "--model", "openai/other-model", "-n", "3", "--limit", "2",
        cwd=tmp_path, env=model_env(fake_model),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    resource = json.loads(done.stdout)["resource"]
    assert resource["total_work_items"] == 6
    metrics = json.loads((tmp_path / ".osmosis/evals/one/metrics.json").read_text())
    assert metrics["eval_run"]["model_name"] == "openai/other-model"


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["-n", "0"], "must be positive: -n 0"),
        (["--limit", "-1"], "must be positive: --limit -1"),
        (["--model", "a", "--model", "a"], "each --model once"),
        (["--model", "a", "--model", "b", "--junit", "j.xml"], "--junit takes one run"),
    ],
)
def test_bad_overrides_are_refused_naming_the_flag(tmp_path, fake_model, flags, said):
    config = make_workspace(tmp_path, ROWS)
    done = osmosis(
        "eval", "run", str(config), "-y", "--json", *flags,
        cwd=tmp_path, env=model_env(fake_model),
    )  # fmt: skip
    assert done.returncode != 0
    assert said in json.loads(done.stderr.strip().splitlines()[-1])["error"]["message"]


def test_the_resume_line_of_a_run_with_overrides_carries_them(tmp_path, fake_model):
    """A halted run says how to resume it: with the same --model, -n and --limit, or the
    resume would run another evaluation."""
    config = make_workspace(tmp_path, ROWS)
    done = osmosis(
        "eval", "run", str(config), "--name", "halted", "-y", "--json",
        "--model", "openai/other-model", "-n", "2", "--limit", "3", "--max-model-calls", "2",
        cwd=tmp_path, env=model_env(fake_model),
    )  # fmt: skip
    assert done.returncode == 1, done.stderr + done.stdout
    steps = [s["command"] for s in json.loads(done.stdout)["next_steps_structured"]]
    assert any(
        step.endswith("--name halted --model openai/other-model -n 2 --limit 3") for step in steps
    ), steps
