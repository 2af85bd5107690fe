"""`osmosis eval run` against a provider that answers 429 above its rate limit: every attempt
passes, and the run says how often the provider pushed back and where the bridge's adaptive
limit settled — in the progress line, in metrics.json and in `eval info`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from osmosis.testing import FakeModelServer
from tests.e2e.conftest import model_env, osmosis
from tests.e2e.workspace import make_workspace, row

pytestmark = pytest.mark.slow


def test_a_rate_limited_provider_is_reported_in_progress_metrics_and_info(
    tmp_path: Path,
) -> None:
    rows = [row("pass", a, 3) for a in range(2, 26)]  # 24 attempts
    config = make_workspace(tmp_path, rows, batch_size=24)
    # 3 calls/s accepted, each taking 0.3 s: the rollout server's 4 workflows at once ask for
    # more than that, so the provider answers 429 until the bridge's limit settles.
    with FakeModelServer(rate_limit=3, latency=0.3, retry_after=1) as model:
        env = model_env(model)
        done = osmosis(
            "--plain", "eval", "run", str(config), "--name", "limited", "-y", cwd=tmp_path, env=env
        )
        refused = model.stats().rate_limited
    assert done.returncode == 0, done.stderr
    run_dir = tmp_path / ".osmosis" / "evals" / "limited"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["summary"]["failed"] == 0
    bridge = metrics["eval_run"]["bridge"]
    # What the attempts' calls got (the run's pre-flight call is not the bridge's).
    assert 1 <= bridge["throttled_calls"] <= refused
    assert isinstance(bridge["adaptive_limit"], int) and 1 <= bridge["adaptive_limit"] <= 24
    # Plain progress lines go to stderr, beside the stage lines.
    progress = [line for line in done.stderr.splitlines() if line.startswith("eval ")]
    assert progress and "in flight · 429s" in progress[-1], done.stderr

    info = osmosis("--plain", "eval", "info", str(run_dir), cwd=tmp_path, env=env)
    assert info.returncode == 0, info.stderr
    shown = f"429s {bridge['throttled_calls']:,} · limit {bridge['adaptive_limit']} in flight"
    assert shown in info.stdout, info.stdout
    as_json = osmosis("--json", "eval", "info", str(run_dir), cwd=tmp_path, env=env)
    assert json.loads(as_json.stdout)["data"]["metrics"]["eval_run"]["bridge"] == bridge
