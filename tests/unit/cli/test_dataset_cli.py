"""`osmosis dataset validate`, run as a user runs it: a separate process, offline."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-c", "from osmosis.cli.main import run; run()"]


def osmosis(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    # A wide, colourless terminal so messages are not wrapped or styled.
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
    return subprocess.run(
        [*CLI, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def good_jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "multiply.jsonl"
    rows = [
        {"user_prompt": f"{i} x 2?", "ground_truth": str(i * 2), "notes": "n"} for i in range(5)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture
def bad_jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "broken.jsonl"
    lines = [
        '{"user_prompt": "a", "ground_truth": "1"}',
        '{"user_prompt": "b", "ground_truth": "2"}',
        '{"user_prompt": "", "ground_truth": "3"}',
        "not json",
        '{"user_prompt": "e", "ground_truth": null}',
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_valid_dataset_prints_its_summary(good_jsonl: Path) -> None:
    result = osmosis("dataset", "validate", good_jsonl.name, cwd=good_jsonl.parent)

    assert result.returncode == 0, result.stderr
    assert "multiply.jsonl is a valid dataset" in result.stdout
    assert "prompt" in result.stdout
    assert hashlib.sha256(good_jsonl.read_bytes()).hexdigest() in result.stdout
    assert "warning: columns ignored by eval: notes" in result.stderr


def test_json_mode_gives_the_detail_envelope(good_jsonl: Path) -> None:
    result = osmosis("--json", "dataset", "validate", good_jsonl, cwd=good_jsonl.parent)

    assert result.returncode == 0, result.stderr
    envelope = json.loads(result.stdout)
    assert envelope["schema_version"] == 1
    data = envelope["data"]
    assert data["valid"] is True and data["errors"] == []
    assert (data["rows"], data["mode"], data["format"]) == (5, "prompt", "jsonl")
    assert data["columns"] == ["user_prompt", "ground_truth", "notes"]
    assert data["sha256"] == hashlib.sha256(good_jsonl.read_bytes()).hexdigest()
    assert data["file_name"] == "multiply.jsonl" and data["dataset_name"] == "multiply"
    assert data["file_size"] == good_jsonl.stat().st_size
    assert data["warnings"] == ["columns ignored by eval: notes"]


def test_an_invalid_dataset_lists_every_problem_and_exits_1(bad_jsonl: Path) -> None:
    result = osmosis("dataset", "validate", bad_jsonl.name, cwd=bad_jsonl.parent)

    assert result.returncode == 1
    assert result.stdout == ""
    assert "error: Invalid dataset broken.jsonl (3 problems):" in result.stderr
    assert "broken.jsonl:3: row 2: user_prompt: must be a non-empty string" in result.stderr
    assert "broken.jsonl:4: row 3: invalid JSON" in result.stderr
    assert "broken.jsonl:5: row 4: ground_truth: needs a non-empty ground_truth" in result.stderr
    assert "hint: A dataset is a .csv, .jsonl or .parquet file" in result.stderr
    assert "Traceback" not in result.stderr


def test_json_mode_gives_the_error_envelope_on_stderr(bad_jsonl: Path) -> None:
    result = osmosis("dataset", "validate", bad_jsonl.name, "--json", cwd=bad_jsonl.parent)

    assert result.returncode == 1
    assert result.stdout == ""
    envelope = json.loads(result.stderr)
    assert envelope["schema_version"] == 1
    assert envelope["command"] == "dataset validate"
    error = envelope["error"]
    assert error["code"] == "VALIDATION"
    details = error["details"]
    assert details["valid"] is False and details["total_problems"] == 3
    assert details["problems"][0] == {
        "line": 3,
        "row": 2,
        "column": "user_prompt",
        "message": "must be a non-empty string (got str '')",
    }
    assert details["errors"][1].startswith("broken.jsonl:4: row 3: invalid JSON")


def test_unsupported_and_missing_files_are_validation_errors(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello\n", encoding="utf-8")
    unsupported = osmosis("--json", "dataset", "validate", "notes.txt", cwd=tmp_path)
    missing = osmosis("--plain", "dataset", "validate", "nope.csv", cwd=tmp_path)

    assert unsupported.returncode == 1
    message = json.loads(unsupported.stderr)["error"]["message"]
    assert "Unsupported file type '.txt'. Supported: csv, jsonl, parquet" in message
    assert missing.returncode == 1
    assert "nope.csv: file not found" in missing.stderr
    assert "at least 4 rows" not in missing.stderr  # the format rules do not help here


def test_parquet_validates_in_plain_mode(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "meta.parquet"
    pq.write_table(pa.table({"metadata": [{"a": i} for i in range(4)]}), path)

    result = osmosis("--plain", "dataset", "validate", path.name, cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    # Key and value per line (split on whitespace: the console may expand the tab).
    pairs = dict(line.split(None, 1) for line in result.stdout.splitlines())
    assert (pairs["rows"], pairs["mode"], pairs["format"]) == ("4", "metadata", "parquet")


def test_help_does_not_load_the_dataset_machinery(tmp_path: Path) -> None:
    probe = (
        "import sys\n"
        "from osmosis.cli.main import main\n"
        "main(['dataset', '--help'])\n"
        "heavy = ('pyarrow', 'osmosis.eval.inputs.dataset', 'osmosis.eval.inputs.config')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "validate" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "[]"
