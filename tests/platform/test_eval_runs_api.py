"""The eval-run routes' answers to requests that never reach a worker (in-process app)."""

from __future__ import annotations

import pytest

GIT = {"X-Osmosis-Git": "example-org/ws"}
CONFIG = """[experiment]
rollout = "scripted"
entrypoint = "main.py"
model_path = "openai/fake-model"
dataset = "scripted"

[evaluation]
n = 1
"""


def body(**changes: object) -> dict:
    payload: dict = {
        "experiment_config": {
            "rollout": "scripted",
            "entrypoint": "main.py",
            "model_path": "openai/fake-model",
            "dataset": "scripted",
        },
        "config_path": "configs/eval/scripted.toml",
        "config_toml": CONFIG,
        "repository": {"origin_url": "git@github.com:example-org/ws.git", "commit_sha": "a" * 40},
    }
    payload.update(changes)
    return payload


async def test_listing_needs_the_workspace_header_unless_all(api):
    missing = await api.get("/api/eval-runs")
    assert missing.status_code == 400
    assert missing.json()["error"]["code"] == "GIT_SCOPE_HEADER_REQUIRED"
    everything = await api.get("/api/eval-runs", params={"all": "true"})
    assert everything.json() == {
        "eval_runs": [],
        "total_count": 0,
        "has_more": False,
        "next_offset": None,
    }
    assert (await api.get("/api/eval-runs", headers=GIT)).json()["total_count"] == 0


@pytest.mark.parametrize(
    "path",
    ["", "/logs", "/files", "/files/metrics.json", "/attempts"],
)
async def test_an_unknown_run_is_not_found_on_every_route(api, path):
    response = await api.get(f"/api/eval-runs/no-such-run{path}")
    assert response.status_code == 404
    assert "not found among your workspaces" in response.json()["error"]["message"]


async def test_a_submit_lists_every_problem_with_its_code(api):
    response = await api.post(
        "/api/eval-runs",
        headers=GIT,
        json=body(
            config_path="../elsewhere.toml",
            config_toml=CONFIG.replace("n = 1", "n = 0\nlimt = 2"),
            experiment_config={
                "rollout": "other",
                "entrypoint": "main.py",
                "model_path": "openai/fake-model",
                "dataset": "scripted",
            },
        ),
    )
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "VALIDATION"
    problems = error["details"]["problems"]
    assert [p["code"] for p in problems] == ["VALIDATION", "NOT_FOUND"]  # config, then dataset
    keys = {issue["key"] for issue in error["details"]["issues"]}
    assert {"config_path", "evaluation.n", "evaluation.limt"} <= keys


async def test_a_submit_refuses_an_origin_of_another_repository(api):
    response = await api.post(
        "/api/eval-runs",
        headers=GIT,
        json=body(repository={"origin_url": "/srv/private.git", "commit_sha": "b" * 40}),
    )
    assert response.status_code == 422
    assert "not the origin of this workspace" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "change",
    [
        {"unknown": 1},
        {"repository": {"origin_url": "x", "commit_sha": "abc123"}},
        {"secrets": {"required": [], "provided": {"A": "1"}, "extra": True}},
    ],
)
async def test_a_malformed_submit_is_a_validation_error(api, change):
    response = await api.post("/api/eval-runs", headers=GIT, json=body(**change))
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "VALIDATION"


@pytest.mark.parametrize("offset", ["99999999999999999999", "2147483648", "-1"])
async def test_an_offset_beyond_any_listing_is_a_validation_error_not_a_crash(api, offset):
    # Unchecked, a number past 64 bits reaches SQLite and overflows there (a 500).
    response = await api.get(
        "/api/eval-runs", params={"offset": offset, "all": "true"}, headers=GIT
    )
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "VALIDATION"
