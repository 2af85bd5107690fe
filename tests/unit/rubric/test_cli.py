"""`osmosis eval rubric` in-process: what a terminal user sees, and input errors."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from osmosis.cli.main import main
from osmosis.testing import FakeModelServer, JudgeScript


@pytest.fixture
def judge(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeModelServer]:
    script = JudgeScript({"Paris": 1.0, "garbage": "nope", "wide": 9.0}, default=0.5)
    with FakeModelServer(script=script.rules()) as server:
        # The command reads the provider settings from the process environment, as LiteLLM does.
        monkeypatch.setenv("OPENAI_API_BASE", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
        yield server


def run(tmp_path: Path, *args: str, terminal: bool = True) -> tuple[int, str]:
    console = Console(file=io.StringIO(), force_terminal=terminal, width=160, color_system=None)
    code = main(
        ["eval", "rubric", "--model", "openai/judge", "--cache-dir", str(tmp_path / "c"), *args],
        console=console,
    )
    assert isinstance(console.file, io.StringIO)
    return code, console.file.getvalue()


def data(tmp_path: Path, *candidates: str) -> str:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"solution_str": c}) + "\n" for c in candidates))
    return str(path)


def test_terminal_output(tmp_path: Path, judge: FakeModelServer) -> None:
    code, text = run(tmp_path, "-d", data(tmp_path, "Paris", "wide"), "-r", "R", "-n", "2")
    assert code == 0, text
    assert "record[0] (record 0, line 1)" in text
    assert "Run 01: score=1" in text and "Run 02: score=1" in text
    assert "explanation: scripted verdict" in text
    assert "flag: run 1 score 9 clamped to 1" in text
    assert "Summary: average=1 stdev=0 min=1 max=1" in text
    assert "Overall Statistics" in text and "Self-Consistency" in text
    assert "Judged 2 records x 2 (4 model calls, 0 cached)" in text


def test_errors_in_plain_mode(tmp_path: Path, judge: FakeModelServer) -> None:
    code, text = run(
        tmp_path, "-d", data(tmp_path, "Paris", "garbage"), "-r", "R", "--plain", terminal=False
    )
    assert code == 1
    lines = text.splitlines()
    assert lines[0].split("\t") == ["0", "record[0]", "1", "0", "1", "0"]
    assert lines[1].split("\t")[:2] == ["1", "record[1]"] and lines[1].endswith("\t1")
    assert "error: Rubric evaluation completed with errors." in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-r", "@missing.txt"], "cannot read the rubric file"),
        (["-r", "   "], "the rubric is empty"),
    ],
)
def test_bad_rubric(tmp_path: Path, judge: FakeModelServer, args: list[str], message: str) -> None:
    code, text = run(tmp_path, "-d", data(tmp_path, "Paris"), *args)
    assert code == 1 and message in text
    assert judge.stats().chat_completions == 0


def test_no_usable_record(tmp_path: Path, judge: FakeModelServer) -> None:
    (tmp_path / "data.jsonl").write_text('{"id": 1}\n')
    code, text = run(tmp_path, "-d", str(tmp_path / "data.jsonl"), "-r", "R")
    assert code == 1 and "has no record to judge" in text


def test_output_path_forms(tmp_path: Path, judge: FakeModelServer) -> None:
    source = data(tmp_path, "Paris")
    (tmp_path / "existing").mkdir()
    for given, written in [
        (str(tmp_path / "existing"), tmp_path / "existing" / "rubric_eval_result.json"),
        (str(tmp_path / "new") + "/", tmp_path / "new" / "rubric_eval_result.json"),
        (str(tmp_path / "named.json"), tmp_path / "named.json"),
    ]:
        code, text = run(tmp_path, "-d", source, "-r", "R", "-o", given)
        assert code == 0, text
        assert json.loads(written.read_text())["records"][0]["scores"] == [1.0]
