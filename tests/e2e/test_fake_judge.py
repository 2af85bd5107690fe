"""`osmosis dev fake-model --judge`: a judge anyone can try with no key (issue 17.7).

The real `osmosis dev fake-model` process serves verdicts; the real `osmosis eval rubric`
judges against it offline, through `OPENAI_API_BASE` as the README says."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import CLI, osmosis

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture
def judge_url() -> Iterator[str]:
    verdicts = ["--verdict", "Paris=1", "--verdict", "Lyon=0.2", "--judge-score", "0.5"]
    process = subprocess.Popen(
        [*CLI, "dev", "fake-model", "--port", "0", "--judge", *verdicts],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        yield process.stdout.readline().strip()
    finally:
        process.terminate()
        process.communicate(timeout=10)


def test_eval_rubric_runs_offline_against_the_fake_judge(tmp_path, judge_url):
    data = tmp_path / "answers.jsonl"
    data.write_text(
        "".join(
            json.dumps(record) + "\n"
            for record in (
                {"id": "right", "solution_str": "The capital is Paris.", "ground_truth": "Paris"},
                {"id": "close", "solution_str": "Lyon, surely.", "ground_truth": "Paris"},
                {"id": "other", "solution_str": "I do not know.", "ground_truth": "Paris"},
            )
        )
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # no key, no provider settings
    env.update(OPENAI_API_BASE=judge_url, OPENAI_API_KEY="unused")
    done = osmosis(
        "--json",
        "eval",
        "rubric",
        "-d",
        str(data),
        "-r",
        "Reward naming the right capital.",
        "--model",
        "openai/judge",
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    records = json.loads(done.stdout)["resource"]["records"]
    scores = {record["label"]: record["scores"] for record in records}
    assert scores == {"right": [1.0], "close": [0.2], "other": [0.5]}


def test_verdicts_are_checked_and_need_judge(tmp_path):
    alone = osmosis("--json", "dev", "fake-model", "--verdict", "a=1", cwd=tmp_path, env={})
    assert alone.returncode == 1 and "need --judge" in alone.stderr
    bad = osmosis(
        "--json",
        "dev",
        "fake-model",
        "--judge",
        "--verdict",
        "x",
        "--verdict",
        "y=high",
        cwd=tmp_path,
        env={},
    )
    problems = json.loads(bad.stderr)["error"]["details"]["problems"]
    assert problems == [
        "--verdict 'x': expected TEXT=SCORE, e.g. Paris=1.0",
        "--verdict 'y=high': expected TEXT=SCORE, e.g. Paris=1.0",
    ]


def test_the_readme_documents_the_fake_judge():
    text = README.read_text()
    assert "osmosis dev fake-model --port 8001 --judge --verdict" in text
    assert "osmosis eval rubric" in text and "OPENAI_API_BASE=http://127.0.0.1:8001/v1" in text
