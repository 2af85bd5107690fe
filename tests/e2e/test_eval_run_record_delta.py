"""`osmosis eval run` of a ten-turn agent (issue 28, part 2): its record of model calls holds
each call's messages as a delta on the attempt's previous call, so it is a fraction of whole
lines; `--replay-from` it with the model server stopped gives the same rewards per attempt
from 0 provider calls."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from osmosis.eval.model.bridge_record import read_record
from osmosis.testing import FakeModelServer
from tests.e2e.conftest import model_env, read_jsonl
from tests.e2e.test_eval_run_cache import (
    _answers,
    _random_answer,
    _rewards,
    _run,
    _run_dir,
    _spent_calls,
)
from tests.e2e.workspace import SCRIPTED_MAIN, make_workspace, row

pytestmark = pytest.mark.slow

TURNS = 10
# Each turn resends the conversation with the answer and a ~2 KB tool output appended.
AGENT_MAIN = SCRIPTED_MAIN.replace(
    "        reply = await ctx.chat(ctx.prompt)\n",
    "        messages = list(ctx.prompt)\n"
    f"        for turn in range({TURNS}):\n"
    "            reply = await ctx.chat(messages)\n"
    "            output = f'$ check {turn}\\n' + 'ok ' * 660\n"
    "            messages = [*messages, reply, {'role': 'user', 'content': output}]\n",
)
ROWS = 4


def _whole_size(line: dict[str, Any], request: dict[str, Any]) -> int:
    """The bytes `line` takes written whole, as before deltas."""
    whole = {**{k: v for k, v in line.items() if k != "delta"}, "v": 1, "request": request}
    return len(json.dumps(whole, ensure_ascii=False, separators=(",", ":"))) + 1


def test_a_ten_turn_agent_replays_from_a_record_a_third_of_whole_lines(tmp_path: Path) -> None:
    assert AGENT_MAIN != SCRIPTED_MAIN
    rows = [row("pass", a, 3) for a in range(2, 2 + ROWS)]
    config = make_workspace(tmp_path, rows, n=2, main=AGENT_MAIN)
    with FakeModelServer(script=[_random_answer(random.Random())]) as server:
        env = model_env(server)
        first = _run(tmp_path, config, env, "first")
        served = server.stats().chat_completions
    assert first["resource"]["failed"] == 0, first
    path = _run_dir(tmp_path, "first") / "model_calls.jsonl"
    lines = read_jsonl(path)
    assert len(lines) == ROWS * 2 * TURNS == served - 1  # every call but the pre-flight
    assert sum(line["v"] == 1 for line in lines) == ROWS * 2  # each attempt's first call whole
    calls = list(read_record(path))
    assert [len(c.request["messages"]) for c in calls if c.key.call == TURNS - 1] == [
        1 + 2 * (TURNS - 1)
    ] * (ROWS * 2)
    whole = sum(_whole_size(line, call.request) for line, call in zip(lines, calls, strict=True))
    assert path.stat().st_size <= whole / 3, (path.stat().st_size, whole)

    # The model server is gone: any provider call would fail (and the run would stall).
    replayed = _run(tmp_path, config, env, "replayed", "--replay-from", "first")
    assert replayed["resource"]["failed"] == 0, replayed
    assert _rewards(tmp_path, "replayed") == _rewards(tmp_path, "first")
    assert _answers(tmp_path, "replayed") == _answers(tmp_path, "first")  # every draw again
    assert _spent_calls(tmp_path, "replayed") == 0
