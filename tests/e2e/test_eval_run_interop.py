"""A rollout written with the open-source osmosis-ai 0.3.x SDK runs under `osmosis eval run`
unchanged, and gives the same metrics as the same logic written with ours."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import model_env, osmosis
from tests.e2e.workspace import OSMOSIS_AI_MAIN, OSMOSIS_AI_PYPROJECT, make_workspace, row

pytestmark = [pytest.mark.slow, pytest.mark.interop]

ROWS = [
    row("pass"),
    {**row("wrong", 3, 3), "ground_truth": "0"},
    row("pass_first_1", 3, 9),
    row("grader_error", 2, 5),
    row("remove", 4, 4),
]


def evaluate(workspace, fake_model, **kwargs):
    config = make_workspace(workspace, ROWS, n=2, limit=5, **kwargs)
    if kwargs.get("main") is OSMOSIS_AI_MAIN:
        (workspace / "rollouts" / "scripted" / "pyproject.toml").write_text(OSMOSIS_AI_PYPROJECT)
    done = osmosis(
        "eval",
        "run",
        str(config),
        "--name",
        "same",
        "-y",
        "--json",
        cwd=workspace,
        env=model_env(fake_model),
        timeout=600,
    )
    return done


def _osmosis_ai_installable() -> bool:
    """`make install` builds .venv-interop with osmosis-ai when this machine can install it;
    when it did, any failure here is ours and must fail the test, not skip it."""
    python = Path(__file__).resolve().parents[2] / ".venv-interop" / "bin" / "python"
    if not python.exists():
        return False
    probe = subprocess.run([python, "-c", "import osmosis_ai"], capture_output=True)
    return probe.returncode == 0


def test_osmosis_ai_rollout_gives_the_same_metrics_as_ours(tmp_path, fake_model):
    ours = evaluate(tmp_path / "ours", fake_model)
    assert ours.returncode == 0, ours.stderr
    theirs = evaluate(tmp_path / "theirs", fake_model, main=OSMOSIS_AI_MAIN)
    if theirs.returncode != 0 and not _osmosis_ai_installable():
        pytest.skip(f"osmosis-ai cannot be installed on this machine: {theirs.stderr[-400:]}")
    assert theirs.returncode == 0, theirs.stderr
    ours_metrics = json.loads(ours.stdout)["resource"]["metrics"]
    theirs_metrics = json.loads(theirs.stdout)["resource"]["metrics"]
    assert theirs_metrics == ours_metrics
    assert ours_metrics["passed"] == 3 and ours_metrics["skipped"] == 2
    log = (tmp_path / "theirs" / ".osmosis" / "evals" / "same" / "logs.txt").read_text()
    assert "3.12" in log  # the osmosis-ai rollout got an interpreter it supports
