"""A local `eval run` behaves like the reference's (issue 17.4): without `limit` it takes
every row, while the platform keeps its random 10 % sample; a missing local dataset is a
`DatasetNotFound` the CLI can answer with the platform's; the older `[secrets]` mapping form
gets an error that names the current one."""

from __future__ import annotations

from pathlib import Path

import pytest

from osmosis.eval.host.plan import DatasetNotFound, RunOptions, plan_run
from osmosis.eval.inputs.config import ConfigError, parse_eval_config
from osmosis.eval.inputs.dataset_select import SAMPLE_FRACTION, select_rows
from tests.e2e.workspace import make_workspace, row

ROWS = [row("pass", a % 9 + 1, 3) for a in range(30)]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return make_workspace(tmp_path, ROWS)  # no `limit` in [evaluation]


def test_without_limit_a_local_run_takes_every_row(config):
    plan = plan_run(config, RunOptions(environ={}))
    assert plan.selection.rows == tuple(range(30)) and plan.selection.method == "all"
    assert plan.provenance()["selection"]["method"] == "all"


def test_the_platforms_default_stays_a_seeded_ten_percent_sample(config):
    plan = plan_run(config, RunOptions(environ={}, sample_fraction=SAMPLE_FRACTION))
    assert plan.selection.method == "sample" and len(plan.selection) == 3  # ceil(30 * 0.1)
    again = select_rows(30, seed=plan.selection.seed)
    assert again.rows == plan.selection.rows


def test_limit_and_rows_win_over_either_default(config):
    limited = config.read_text().replace("n = 1", "n = 1\nlimit = 4")
    config.write_text(limited)
    assert len(plan_run(config, RunOptions(environ={})).selection) == 4
    chosen = plan_run(config, RunOptions(environ={}, rows="7,9"))
    assert chosen.selection.rows == (7, 9)


def test_a_missing_local_dataset_is_dataset_not_found_naming_both_ways_out(config):
    (config.parents[2] / "data" / "scripted.jsonl").unlink()
    with pytest.raises(DatasetNotFound) as caught:
        plan_run(config, RunOptions(environ={}))
    assert caught.value.details == {"dataset": "scripted"}
    assert "--dataset-file" in caught.value.hint and "log in" in caught.value.hint


def test_a_fetched_dataset_keeps_its_origin_in_the_plan(config, tmp_path):
    fetched = tmp_path / "cache" / "scripted.jsonl"
    fetched.parent.mkdir()
    fetched.write_bytes((config.parents[2] / "data" / "scripted.jsonl").read_bytes())
    options = RunOptions(environ={}, dataset_file=fetched, dataset_origin="cache")
    assert plan_run(config, options).dataset_source == "cache"


EXPERIMENT = (
    '[experiment]\nrollout = "r"\nentrypoint = "main.py"\nmodel_path = "m"\ndataset = "d"\n'
)


def test_the_older_secrets_mapping_form_names_the_current_form():
    old = EXPERIMENT + '\n[secrets]\nOPENAI_API_KEY = "openai-api-key"\nHF_TOKEN = "hf"\n'
    with pytest.raises(ConfigError) as caught:
        parse_eval_config(old, path="x.toml")
    (issue,) = caught.value.issues
    assert issue.line == 7 and issue.key == "secrets"
    assert 'older mapping form (OPENAI_API_KEY = "openai-api-key")' in issue.message
    assert 'required = ["OPENAI_API_KEY", "HF_TOKEN"]' in issue.message


def test_an_unknown_key_beside_required_is_still_unrecognized():
    mixed = EXPERIMENT + '\n[secrets]\nrequired = []\nextra = "x"\n'
    with pytest.raises(ConfigError) as caught:
        parse_eval_config(mixed, path="x.toml")
    assert [issue.key for issue in caught.value.issues] == ["secrets.extra"]
    assert "Unrecognized key" in caught.value.issues[0].message
