"""The example workspace runs in the suite, so it cannot rot."""

import json
import shutil
from pathlib import Path

import pytest

from tests.e2e.conftest import model_env, osmosis

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "workspace"


@pytest.fixture
def workspace(tmp_path):
    copy = tmp_path / "workspace"
    shutil.copytree(EXAMPLE, copy, ignore=shutil.ignore_patterns(".osmosis"))
    return copy


@pytest.mark.slow
def test_the_example_evaluates_every_row_against_the_scripted_model(workspace, fake_model):
    config = workspace / "configs" / "eval" / "multiply.toml"
    config.write_text(config.read_text().replace("local/smollm2-135m", "openai/fake-model"))
    done = osmosis(
        "eval",
        "run",
        "configs/eval/multiply.toml",
        "--name",
        "example",
        "-y",
        "--json",
        cwd=workspace,
        env=model_env(fake_model),
    )
    assert done.returncode == 0, done.stderr
    metrics = json.loads(done.stdout)["resource"]["metrics"]
    assert metrics["total_samples"] == 24
    assert metrics["pass_rate"] == 1.0  # the scripted model multiplies correctly


@pytest.mark.slow
def test_the_example_runs_on_the_local_model_with_no_key(workspace):
    pytest.importorskip("xllamacpp", reason="the local-model extra is not installed")
    done = osmosis(
        "eval",
        "run",
        "configs/eval/multiply.toml",
        "--name",
        "local",
        "-y",
        "--json",
        "--rows",
        "0-2",
        cwd=workspace,
        env={"PATH": "/usr/bin:/bin", "HOME": str(workspace)},
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    resource = json.loads(done.stdout)["resource"]
    assert resource["metrics"]["total_samples"] == 3
    assert resource["metrics"]["tokens_used"] > 0  # a real model answered, whatever it said
    trajectory = workspace / ".osmosis" / "evals" / "local" / "trajectories" / "row_0_run_0.json"
    steps = json.loads(trajectory.read_text())["steps"]
    assert steps[-1]["source"] == "agent" and steps[-1]["metrics"]["completion_tokens"] > 0
