"""`osmosis eval run --cache` (issue 28, part 2: record and replay): a run records every model
call; a replay of it into a new run with the model server stopped gives the same rewards per
attempt from 0 provider calls; a changed prompt in replay mode fails its attempts with the
named cache-miss error; `--cache use` keeps the n attempts of a row independent."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from osmosis.testing import ChatRequest, FakeModelServer, Reply, Rule
from tests.e2e.conftest import model_env, osmosis, read_jsonl
from tests.e2e.workspace import SCRIPTED_MAIN, make_workspace, row

pytestmark = pytest.mark.slow

CALLS = 2  # model calls per attempt: the record keys each by its sequence in the attempt
TWO_CALLS_MAIN = SCRIPTED_MAIN.replace(
    "        reply = await ctx.chat(ctx.prompt)\n",
    "".join(["        reply = await ctx.chat(ctx.prompt)\n"] * CALLS),
)
ROWS = 4


def _random_answer(rng: random.Random) -> Rule:
    """A model that answers each question right or wrong at random, with a random tag: no two
    calls are alike, so only a record can give the same answers twice."""

    def respond(request: ChatRequest) -> Reply | None:
        found = re.search(r"What is (\d+) \* (\d+)\?", request.text)
        if found is None:
            return None  # the pre-flight's "hi"
        right = int(found[1]) * int(found[2])
        value = right if rng.random() < 0.5 else right + 1
        return Reply(f"{value} (draw {rng.randrange(10**9)})")

    return Rule(respond=respond)


@pytest.fixture
def random_model() -> Iterator[FakeModelServer]:
    with FakeModelServer(script=[_random_answer(random.Random())]) as server:
        yield server


def _workspace(root: Path, n: int = 1) -> Path:
    rows = [row("pass", a, 3) for a in range(2, 2 + ROWS)]
    return make_workspace(root, rows, n=n, main=TWO_CALLS_MAIN)


def _run(root: Path, config: Path, env: dict[str, str], name: str, *flags: str) -> dict:
    done = osmosis(
        "eval", "run", str(config), "--name", name, "-y", "--json", *flags, cwd=root, env=env
    )  # fmt: skip
    assert done.stdout, done.stderr
    return json.loads(done.stdout)


def _run_dir(root: Path, name: str) -> Path:
    return root / ".osmosis" / "evals" / name


def _rewards(root: Path, name: str) -> dict[tuple[int, int], float | None]:
    journal = read_jsonl(_run_dir(root, name) / "events.jsonl")
    return {(r["row_index"], r["run_index"]): r["reward"] for r in journal}


def _answers(root: Path, name: str) -> dict[tuple[int, int, int], str]:
    record = read_jsonl(_run_dir(root, name) / "model_calls.jsonl")
    return {
        (e["key"]["row"], e["key"]["run"], e["key"]["call"]): e["response"]["choices"][0][
            "message"
        ]["content"]
        for e in record
    }


def _spent_calls(root: Path, name: str) -> int:
    metrics = json.loads((_run_dir(root, name) / "metrics.json").read_text())
    return int(metrics["eval_run"]["bridge"]["spent_calls"])


def test_a_replay_with_the_model_stopped_gives_the_same_rewards_from_no_call(
    tmp_path: Path,
) -> None:
    config = _workspace(tmp_path, n=2)
    with FakeModelServer(script=[_random_answer(random.Random())]) as server:
        env = model_env(server)
        first = _run(tmp_path, config, env, "first")
        served = server.stats().chat_completions
    assert first["resource"]["failed"] == 0, first
    record = read_jsonl(_run_dir(tmp_path, "first") / "model_calls.jsonl")
    assert len(record) == ROWS * 2 * CALLS == served - 1  # every call but the pre-flight
    assert all(e["source"] == "provider" and e["digest"].startswith("sha256:") for e in record)
    assert "sk-test-not-a-real-key" not in json.dumps(record)

    # The model server is gone: any provider call would fail (and the run would stall).
    replayed = _run(tmp_path, config, env, "replayed", "--replay-from", "first")
    assert replayed["resource"]["failed"] == 0, replayed
    assert _rewards(tmp_path, "replayed") == _rewards(tmp_path, "first")
    assert _answers(tmp_path, "replayed") == _answers(tmp_path, "first")
    assert _spent_calls(tmp_path, "replayed") == 0
    journal = read_jsonl(_run_dir(tmp_path, "replayed") / "events.jsonl")
    assert all(r["tokens"] == 0 for r in journal)

    # A changed prompt is a miss: the attempts fail naming it, and nothing calls the provider.
    data = tmp_path / "data" / "scripted.jsonl"
    data.write_text(data.read_text().replace("[pass]", "[pass, reworded]"))
    missed = _run(tmp_path, config, env, "missed", "--replay-from", "first", "--cache", "replay")
    assert missed["resource"]["failed"] == ROWS * 2, missed
    journal = read_jsonl(_run_dir(tmp_path, "missed") / "events.jsonl")
    assert len(journal) == ROWS * 2
    for attempt in journal:
        assert attempt["status"] == "failed"
        assert "cache_miss" in (attempt["error_message"] or ""), attempt
    assert _spent_calls(tmp_path, "missed") == 0


def test_cache_use_keeps_the_n_attempts_of_a_row_independent(
    tmp_path: Path, random_model: FakeModelServer
) -> None:
    n = 4
    config = _workspace(tmp_path, n=n)
    env = model_env(random_model)
    _run(tmp_path, config, env, "drawn", "--cache", "use")
    drawn = _answers(tmp_path, "drawn")
    assert len(drawn) == ROWS * n * CALLS
    for row_index in range(ROWS):
        firsts = {drawn[(row_index, run, 0)] for run in range(n)}
        assert len(firsts) > 1, firsts  # the same request, but four attempts: four draws

    # Used again: each attempt gets its own recorded answers, and the provider is not called.
    served = random_model.stats().chat_completions
    _run(tmp_path, config, env, "reused", "--cache", "use", "--replay-from", "drawn")
    assert _answers(tmp_path, "reused") == drawn
    assert _rewards(tmp_path, "reused") == _rewards(tmp_path, "drawn")
    assert random_model.stats().chat_completions == served + 1  # the pre-flight only
    assert _spent_calls(tmp_path, "reused") == 0


def test_replay_without_a_record_refuses_to_start(tmp_path: Path, fake_model) -> None:
    config = _workspace(tmp_path)
    done = osmosis(
        "eval", "run", str(config), "-y", "--json", "--cache", "replay",
        cwd=tmp_path, env=model_env(fake_model),
    )  # fmt: skip
    assert done.returncode != 0
    error = json.loads(done.stderr)["error"]
    assert "no record of model calls to replay" in error["message"]
    assert not (tmp_path / ".osmosis" / "evals").exists()  # refused before anything was written
