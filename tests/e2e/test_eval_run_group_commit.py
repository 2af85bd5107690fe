"""Group commit under SIGKILL: with 64 attempts in flight and journal writes batched on a
writer thread, every attempt the engine counted is on disk, none twice, and a resume
completes the run exactly once."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.e2e.conftest import CLI, model_env, osmosis, read_jsonl
from tests.e2e.workspace import make_workspace, row

pytestmark = pytest.mark.slow

ROWS = 400
_PROGRESS = re.compile(r"eval (\d+)/(\d+)")


def test_sigkill_under_group_commit_keeps_every_counted_attempt_exactly_once(
    tmp_path: Path, fake_model
) -> None:
    # 0.5 s per rollout: seven waves of 64 take >= 3.5 s, while progress lines come at most
    # once a second, so the kill lands mid-run however fast the engine gets.
    rows = [row("pass", a % 90 + 2, 7, sleep=0.5) for a in range(ROWS)]
    config = make_workspace(tmp_path, rows, batch_size=64)
    env = model_env(fake_model, MAX_CONCURRENT="64")
    process = subprocess.Popen(
        [*CLI, "eval", "run", str(config), "--name", "grouped", "-y"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    counted = _wait_for_progress(process, at_least=ROWS // 4)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)
    assert process.stdout is not None
    process.stdout.close()

    journal = tmp_path / ".osmosis" / "evals" / "grouped" / "events.jsonl"
    before = Counter((e["row_index"], e["run_index"]) for e in _complete_lines(journal))
    # Every attempt the engine had counted (and printed) was already durable, and none twice.
    assert sum(before.values()) >= counted
    assert max(before.values()) == 1
    assert len(before) < ROWS, "the run finished before the kill; nothing was tested"

    resumed = osmosis("eval", "run", str(config), "--name", "grouped", "-y", cwd=tmp_path, env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    after = Counter((e["row_index"], e["run_index"]) for e in read_jsonl(journal))
    assert sorted(after) == [(r, 0) for r in range(ROWS)]
    assert set(after.values()) == {1}


def _wait_for_progress(process: subprocess.Popen[str], *, at_least: int) -> int:
    """Read `eval N/M` progress lines until N >= at_least; returns that N."""
    assert process.stdout is not None
    deadline = time.monotonic() + 120
    for line in process.stdout:
        match = _PROGRESS.search(line)
        if match and int(match[1]) >= at_least:
            return int(match[1])
        assert time.monotonic() < deadline, "no progress line in time"
    raise AssertionError(f"eval run ended before reporting {at_least} attempts")


def _complete_lines(journal: Path) -> list[dict]:
    # A line the kill cut short is not a record (the engine drops it on resume too).
    data = journal.read_bytes()
    return [json.loads(line) for line in data[: data.rfind(b"\n") + 1].splitlines()]
