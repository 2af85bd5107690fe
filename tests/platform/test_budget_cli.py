"""`eval submit`'s confirmation names the pre-run estimate (issue 28, part 1): from the
workspace's copy of the dataset before the rollout ever ran here, from the local run after."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from osmosis.testing import FakeModelServer
from tests.e2e.conftest import model_env
from tests.platform.test_eval_cli import CONFIG, confirmation, eval_workspace
from tests.platform.test_workspaces import cli, cli_json


@pytest.fixture(scope="module")
def fake_model() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


@pytest.mark.slow
def test_the_submit_confirmation_shows_the_estimate(running_platform, fake_model, tmp_path):
    tree = eval_workspace(tmp_path)
    env = running_platform.env
    cli_json("dataset", "upload", "data/scripted.jsonl", "-y", env=env, cwd=tree)

    before = confirmation(tree, env)["details"]["summary"]
    assert before["Rows"].startswith("4 of 6")
    assert before["Estimate"].startswith("~") and before["Estimate"].endswith("(dataset)")
    assert "tokens" in before["Estimate"] and "range" in before["Estimate"]

    local = cli("eval", "run", CONFIG, "-y", "--name", "here", env=model_env(fake_model, **env),
                cwd=tree)  # fmt: skip
    assert local.returncode == 0, local.stderr
    after = confirmation(tree, env)["details"]["summary"]
    # The scripted model's answers cost the same every attempt: no range left to state.
    assert after["Estimate"].endswith("model calls (history)"), after["Estimate"]
    assert after["Estimate"] != before["Estimate"]
