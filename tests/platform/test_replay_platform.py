"""Record and replay on the platform (issue 28, part 2): `osmosis eval submit --replay-from RUN`
answers a run's model calls from the record of an earlier run of the workspace, which the
worker reads from the blob store (a local directory, or an S3-compatible object store). With
the model server stopped, the replay gives every attempt the reward it had, from 0 provider
calls; a config that changed the prompt fails the attempts with `cache_miss` and calls no
provider; `eval info --json` names the cache mode, the source run and the hits and misses.
A real server process and worker, the CLI as a subprocess, the scripted model."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from osmosis.testing import ChatRequest, FakeModelServer, Reply, Rule
from tests.e2e.workspace import SCRIPTED_MAIN, row
from tests.platform.eval_world import (
    CONFIG_PATH,
    Repo,
    Server,
    all_logs,
    finished,
    make_repo,
    read_jsonl,
    run_body,
    run_dir,
    submit,
    upload_dataset,
)
from tests.platform.object_store_world import MotoServer
from tests.platform.test_workspaces import cli, cli_json

pytestmark = pytest.mark.slow

DATASET_ROWS, N, CALLS = 40, 2, 2
ROWS = 4  # no `limit`: the platform's seeded random 10 % sample, which a replay must take too
# Two calls per attempt (the record keys each by its sequence), and a system prompt from the
# config's [env] when it sets one: a config change that changes every request.
MAIN = SCRIPTED_MAIN.replace(
    "        reply = await ctx.chat(ctx.prompt)\n",
    "        system = os.environ.get('SYSTEM_PROMPT')\n"
    "        prompt = [{'role': 'system', 'content': system}, *ctx.prompt] if system else "
    "ctx.prompt\n" + "        reply = await ctx.chat(prompt)\n" * CALLS,
)


def _random_answers() -> Rule:
    """Right or wrong at random, with a random tag: only a record gives the same twice."""
    rng = random.Random()

    def respond(request: ChatRequest) -> Reply | None:
        found = re.search(r"What is (\d+) \* (\d+)\?", request.text)
        if found is None:
            return None  # the pre-flight's "hi"
        right = int(found[1]) * int(found[2])
        return Reply(f"{right if rng.random() < 0.5 else right + 1} (draw {rng.randrange(10**9)})")

    return Rule(respond=respond)


@pytest.fixture(params=["directory", "object"])
def store(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[dict[str, str]]:
    """The blob store's settings: the home's directory, or an object store (moto)."""
    if request.param == "directory":
        yield {}
        return
    with MotoServer.start(tmp_path_factory.mktemp("moto") / "moto.log") as moto:
        yield {**moto.env(), "OSMOSIS_BLOB_URL": moto.bucket()}


def _rewards(server: Server, run_id: str) -> dict[tuple[int, int], float | None]:
    """Each attempt's reward, by its row in the dataset file and its run index."""
    journal = read_jsonl(run_dir(server, run_id) / "events.jsonl")
    return {(r["source_row_index"], r["run_index"]): r["reward"] for r in journal}


def _info(server: Server, repo: Repo, name: str) -> dict:
    return dict(cli_json("eval", "info", name, env=server.env, cwd=repo.tree)["data"])


@pytest.mark.timeout(600)  # three runs, a server start
def test_a_replay_from_a_platform_run_gives_its_rewards_without_calling_the_model(
    tmp_path: Path, store: dict[str, str]
) -> None:
    model = FakeModelServer(script=[_random_answers()])
    model.start()
    server = Server.start(tmp_path / "platform", model, **store)
    try:
        rows = [row("pass", a, 3) for a in range(2, 2 + DATASET_ROWS)]
        repo = make_repo(tmp_path / "ws", rows, n=N, main=MAIN)
        upload_dataset(server, repo)
        with server.client() as client:
            first = finished(client, submit(client, repo).id)
            logs = "\n".join(all_logs(client, first.eval_run.id))
            assert first.eval_run.status == "finished", logs
            recorded = read_jsonl(run_dir(server, first.eval_run.id) / "model_calls.jsonl")
            assert len(recorded) == ROWS * N * CALLS
            assert first.cache.mode == "off"

            # A config whose prompt changed, replayed: every attempt fails naming the miss,
            # and the model (still up) is not called.
            served = model.stats().chat_completions
            changed = repo.config.read_text().replace(
                "[secrets]", '[env]\nSYSTEM_PROMPT = "Answer briefly."\n\n[secrets]'
            )
            body = run_body(repo, config_text=changed).model_copy(
                update={"replay_from": first.eval_run.name}
            )
            missed = finished(client, client.runs.submit(git=repo.git, body=body).id)
            assert model.stats().chat_completions == served
            journal = read_jsonl(run_dir(server, missed.eval_run.id) / "events.jsonl")
            assert len(journal) == ROWS * N
            for attempt in journal:
                assert attempt["status"] == "failed", attempt
                assert "cache_miss" in (attempt["error_message"] or ""), attempt
            assert (missed.cache.mode, missed.cache.hits) == ("replay", 0)
            assert missed.cache.misses == ROWS * N  # each attempt's first call; no second
            bridge = (missed.metrics or {})["eval_run"]["bridge"]
            assert bridge["spent_calls"] == 0

        # The model is gone: a provider call would fail. The CLI names the run to replay.
        model.stop()
        submitted = cli_json(
            "eval", "submit", CONFIG_PATH, "--replay-from", first.eval_run.name, "-y",
            env=server.env, cwd=repo.tree,
        )  # fmt: skip
        name = submitted["resource"]["name"]
        with server.client() as client:
            replayed = finished(client, name)
            logs = "\n".join(all_logs(client, name))
        assert replayed.eval_run.status == "finished", logs
        assert replayed.summary.failed == 0, logs
        assert _rewards(server, replayed.eval_run.id) == _rewards(server, first.eval_run.id)
        sampled = {row for row, _ in _rewards(server, first.eval_run.id)}
        assert len(sampled) == ROWS and sampled != set(range(ROWS))  # not the first rows
        assert (replayed.metrics or {})["eval_run"]["bridge"]["spent_calls"] == 0
        again = read_jsonl(run_dir(server, replayed.eval_run.id) / "model_calls.jsonl")
        assert {json.dumps(e["response"]) for e in again} == {
            json.dumps(e["response"]) for e in recorded
        }
        assert all(e["source"] == "record" for e in again)
        assert f"cache replay: {ROWS * N * CALLS} model calls answered from the record" in logs

        info = _info(server, repo, name)
        assert info["cache"] == {
            "mode": "replay",
            "replay_from": first.eval_run.name,
            "replay_from_id": first.eval_run.id,
            "hits": ROWS * N * CALLS,
            "misses": 0,
        }
        shown = cli("eval", "info", name, env={**server.env, "COLUMNS": "200"}, cwd=repo.tree)
        assert shown.returncode == 0, shown.stderr
        assert (
            f"replay from {first.eval_run.name} · {ROWS * N * CALLS} answered from the record, "
            "0 not in it"
        ) in shown.stdout
    finally:
        server.stop()
        model.stop()
