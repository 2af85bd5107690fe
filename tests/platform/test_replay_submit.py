"""`replay_from` and `cache` of a submit (issue 28, part 2, on the platform): the API takes a
source run only from the submitting workspace and only when it recorded model calls, stores
what it decided with the run, and the detail view names it. In-process app, no worker: the
runs stay pending."""

from __future__ import annotations

import hashlib
import json

import httpx
import pytest

from osmosis.eval.model.bridge_record import RECORD_FILE
from tests.platform.conftest import LocalPlatform
from tests.platform.test_eval_cli import CONFIG as EVAL_CONFIG
from tests.platform.test_eval_cli import eval_workspace, offline_env
from tests.platform.test_workspaces import cli_error

__all__ = ["offline_env"]  # a fixture, shared with test_eval_cli

DATA = b"".join(
    json.dumps({"user_prompt": f"What is {a} * 3?", "ground_truth": str(a * 3)}).encode() + b"\n"
    for a in range(2, 6)
)
CONFIG = """[experiment]
rollout = "scripted"
entrypoint = "main.py"
model_path = "openai/fake-model"
dataset = "scripted"

[evaluation]
n = 1
limit = 2

[secrets]
required = []
"""


def _git(workspace: str) -> dict[str, str]:
    return {"X-Osmosis-Git": f"example-org/{workspace}"}


def _body(workspace: str = "ws", config: str = CONFIG, **changes: object) -> dict:
    payload: dict = {
        "experiment_config": {
            "rollout": "scripted",
            "entrypoint": "main.py",
            "model_path": "openai/fake-model",
            "dataset": "scripted",
        },
        "config_path": "configs/eval/scripted.toml",
        "config_toml": config,
        "repository": {
            "origin_url": f"git@github.com:example-org/{workspace}.git",
            "commit_sha": "a" * 40,
        },
    }
    payload.update(changes)
    return payload


async def _dataset(api: httpx.AsyncClient, workspace: str) -> None:
    params = {
        "file_name": "scripted.jsonl",
        "size": len(DATA),
        "sha256": hashlib.sha256(DATA).hexdigest(),
    }
    answer = await api.post("/api/datasets", params=params, headers=_git(workspace), content=DATA)
    assert answer.status_code in (200, 201), answer.text


async def _submit(api: httpx.AsyncClient, workspace: str = "ws", **body: object) -> httpx.Response:
    return await api.post("/api/eval-runs", headers=_git(workspace), json=_body(workspace, **body))


def _record(platform: LocalPlatform, run_id: str) -> None:
    """What a worker leaves in the run's directory once its rollouts called the model."""
    directory = platform.settings.runs_dir / run_id
    directory.mkdir(parents=True, exist_ok=True)
    line = {"v": 1, "key": {"row": 0, "run": 0, "call": 0}, "digest": "sha256:00",
            "request": {}, "response": {"choices": []}, "source": "provider"}  # fmt: skip
    (directory / RECORD_FILE).write_text(json.dumps(line) + "\n")


@pytest.fixture
async def source(api: httpx.AsyncClient, local_platform: LocalPlatform) -> dict:
    """A run of workspace `ws` with a record of model calls."""
    await _dataset(api, "ws")
    created = await _submit(api)
    assert created.status_code == 201, created.text
    _record(local_platform, created.json()["id"])
    return dict(created.json())


async def test_a_replay_of_a_recorded_run_is_stored_and_shown_with_its_source(api, source):
    by_name = await _submit(api, replay_from=source["name"])
    assert by_name.status_code == 201, by_name.text
    detail = (await api.get(f"/api/eval-runs/{by_name.json()['name']}")).json()
    # No --cache and a config saying off: --replay-from means replay, as in `eval run`.
    assert detail["cache"] == {
        "mode": "replay",
        "replay_from": source["name"],
        "replay_from_id": source["id"],
        "hits": None,  # the worker has not run it yet
        "misses": None,
    }

    by_id = await _submit(api, replay_from=source["id"], cache="use")
    assert by_id.status_code == 201, by_id.text
    shown = (await api.get(f"/api/eval-runs/{by_id.json()['id']}")).json()["cache"]
    assert (shown["mode"], shown["replay_from"]) == ("use", source["name"])

    plain = (await api.get(f"/api/eval-runs/{source['id']}")).json()["cache"]
    assert plain == {
        "mode": "off",
        "replay_from": None,
        "replay_from_id": None,
        "hits": None,
        "misses": None,
    }


async def test_a_run_of_another_workspace_is_not_found_naming_replay_from(api, source):
    await _dataset(api, "other")
    refused = await _submit(api, "other", replay_from=source["name"])
    assert refused.status_code == 404, refused.text
    error = refused.json()["error"]
    assert error["code"] == "NOT_FOUND"
    assert error["message"].startswith(f"replay_from: eval run {source['name']!r} not found")
    assert "example-org/other" in error["message"]
    assert error["details"]["replay_from"] == source["name"]
    listed = (await api.get("/api/eval-runs", headers=_git("other"))).json()
    assert listed["total_count"] == 0  # nothing was stored


@pytest.mark.parametrize("ref", ["no-such-run", "nul\x00run"])  # PostgreSQL refuses NUL
async def test_an_unknown_source_run_is_not_found(api, source, ref):
    refused = await _submit(api, replay_from=ref)
    assert refused.status_code == 404, refused.text
    assert refused.json()["error"]["details"]["replay_from"] == ref


async def test_a_source_run_that_recorded_no_calls_is_refused(api, source):
    unrecorded = await _submit(api)
    assert unrecorded.status_code == 201, unrecorded.text
    name = unrecorded.json()["name"]
    refused = await _submit(api, replay_from=name)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "NO_MODEL_CALLS"
    assert f"eval run {name!r} recorded no model calls" in error["message"]
    assert error["details"]["replay_from"] == name


SOURCE = "<the recorded run>"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"cache": "off", "replay_from": SOURCE}, "it needs cache use or replay, not off"),
        # A new run's own record is empty: replay without a source would miss every call.
        ({"config": CONFIG.replace("n = 1", 'n = 1\ncache = "replay"')}, "name one with"),
        ({"cache": "replay"}, "name one with replay_from"),
    ],
)
async def test_a_cache_mode_that_cannot_work_is_a_validation_error(api, source, body, message):
    body = {k: source["name"] if v == SOURCE else v for k, v in body.items()}
    refused = await _submit(api, **body)
    assert refused.status_code == 422, refused.text
    assert message in refused.json()["error"]["message"]


async def test_an_unknown_cache_mode_is_refused_by_the_schema(api, source):
    refused = await _submit(api, cache="sometimes", replay_from=source["name"])
    assert refused.status_code == 422, refused.text


# -- the CLI's checks, before any request -------------------------------------------------------
def test_submit_refuses_cache_flags_that_cannot_work_before_any_request(tmp_path, offline_env):
    tree = eval_workspace(tmp_path)
    flags = ("--cache", "sometimes", "--replay-from", " ", "--model", "openai/a", "--model",
             "openai/b")  # fmt: skip
    error = cli_error("eval", "submit", EVAL_CONFIG, "-y", *flags, env=offline_env, cwd=tree)
    assert error["code"] == "VALIDATION"
    assert error["details"]["problems"] == [
        "--cache must be off, use or replay, got 'sometimes'",
        "--replay-from must name a run of this workspace (its name or id)",
        "--replay-from takes one run: give one --model",
    ]
    off = cli_error("eval", "submit", EVAL_CONFIG, "-y", "--cache", "off", "--replay-from",
                    "smoke-1", env=offline_env, cwd=tree)  # fmt: skip
    assert off["message"] == (
        "--replay-from reads another run's model calls: it needs --cache use or replay"
    )
