"""Bad configs, datasets and flags given to `osmosis eval run`: each is refused with an error
that names the problem, exit code 1, and no run directory is created."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from osmosis.cli.main import main
from tests.e2e.workspace import make_workspace, row

ROWS = [row("pass", a, 3) for a in range(2, 8)]


def edit_config(old: str, new: str) -> Callable[[Path], list[str]]:
    def apply(ws: Path) -> list[str]:
        config = ws / "configs" / "eval" / "scripted.toml"
        text = config.read_text()
        assert old in text, old
        config.write_text(text.replace(old, new, 1))
        return []

    return apply


def write_data(lines: list[str]) -> Callable[[Path], list[str]]:
    def apply(ws: Path) -> list[str]:
        (ws / "data" / "scripted.jsonl").write_text("\n".join(lines) + "\n")
        return []

    return apply


def flags(*extra: str, secrets: str | None = None) -> Callable[[Path], list[str]]:
    def apply(ws: Path) -> list[str]:
        if secrets is not None:
            (ws / "s.env").write_text(secrets)
            return [*extra, "--secrets-file", str(ws / "s.env")]
        return list(extra)

    return apply


def remove(relative: str) -> Callable[[Path], list[str]]:
    def apply(ws: Path) -> list[str]:
        (ws / relative).unlink()
        return []

    return apply


GOOD = json.dumps({"user_prompt": "What is 2 * 2?", "ground_truth": "4"})

CASES: dict[str, tuple[Callable[[Path], list[str]], str]] = {
    "no [experiment]": (edit_config("[experiment]", "[experimentz]"), "experiment"),
    "unknown key": (edit_config("n = 1", "n = 1\nlimt = 3"), "evaluation.limt"),
    "n is zero": (edit_config("n = 1", "n = 0"), "evaluation.n"),
    "n is text": (edit_config("n = 1", 'n = "two"'), "evaluation.n"),
    "negative limit": (edit_config("n = 1", "n = 1\nlimit = -5"), "evaluation.limit"),
    "zero batch size": (edit_config("n = 1", "n = 1\nbatch_size = 0"), "evaluation.batch_size"),
    "nan threshold": (
        edit_config("n = 1", "n = 1\npass_threshold = nan"),
        "evaluation.pass_threshold",
    ),
    "zero timeout": (
        edit_config("agent_workflow_timeout_s = 30", "agent_workflow_timeout_s = 0"),
        "evaluation.agent_workflow_timeout_s",
    ),
    "branch and commit": (
        edit_config(
            'dataset = "scripted"', 'dataset = "scripted"\nbranch = "main"\ncommit_sha = "abcdef1"'
        ),
        "commit_sha",
    ),
    "bad commit sha": (
        edit_config('dataset = "scripted"', 'dataset = "scripted"\ncommit_sha = "xyz"'),
        "experiment.commit_sha",
    ),
    "rollout escapes": (
        edit_config('rollout = "scripted"', 'rollout = "../x"'),
        "experiment.rollout",
    ),
    "entrypoint escapes": (
        edit_config('entrypoint = "main.py"', 'entrypoint = "../../x.py"'),
        "experiment.entrypoint",
    ),
    "entrypoint missing": (remove("rollouts/scripted/main.py"), "main.py"),
    "unknown section": (edit_config("[secrets]", "[extras]\na = 1\n\n[secrets]"), "extras"),
    "lowercase env name": (
        edit_config("[secrets]", '[env]\nlower = "x"\n\n[secrets]'),
        "env.lower",
    ),
    "reserved env name": (
        edit_config("[secrets]", '[env]\n_OSMOSIS_ROLLOUT_PORT = "1"\n\n[secrets]'),
        "_OSMOSIS_ROLLOUT_PORT",
    ),
    "no [secrets]": (edit_config("[secrets]\nrequired = []", ""), "secrets"),
    "secret shadows env": (
        edit_config(
            "[secrets]\nrequired = []", '[env]\nTOKEN_X = "a"\n\n[secrets]\nrequired = ["TOKEN_X"]'
        ),
        "TOKEN_X",
    ),
    "toml syntax": (edit_config("n = 1", "n = = 1"), "scripted.toml"),
    "too few rows": (write_data([GOOD, GOOD, GOOD]), "rows"),
    "no user_prompt": (
        write_data([json.dumps({"prompt": "x", "ground_truth": "1"})] * 5),
        "user_prompt",
    ),
    "different keys": (
        write_data([GOOD] * 4 + [json.dumps({"user_prompt": "x", "ground_truth": "1", "z": 1})]),
        "scripted.jsonl:5",
    ),
    "broken json line": (write_data([GOOD] * 4 + ["{not json"]), "scripted.jsonl:5"),
    "empty dataset": (write_data([]), "scripted.jsonl"),
    "dataset missing": (remove("data/scripted.jsonl"), "dataset 'scripted' not found"),
    "dataset file missing": (flags("--dataset-file", "nope.jsonl"), "nope.jsonl"),
    "rows out of range": (flags("--rows", "2,99"), "99"),
    "rows malformed": (flags("--rows", "3-"), "--rows"),
    "secret missing": (
        edit_config("required = []", 'required = ["OSMOSIS_TEST_NEVER_SET_9Q"]'),
        "OSMOSIS_TEST_NEVER_SET_9Q",
    ),
    "secrets file malformed": (flags(secrets="this is not dotenv\n"), "s.env:1"),
    "zero in flight": (flags("--max-in-flight", "0"), "--max-in-flight"),
}


@pytest.mark.parametrize(("make_bad", "names"), CASES.values(), ids=list(CASES))
def test_bad_input_is_refused_before_anything_is_written(tmp_path, capsys, make_bad, names):
    config = make_workspace(tmp_path, ROWS)
    extra = make_bad(tmp_path)
    code = main(["eval", "run", str(config), "--name", "bad", "-y", "--json", *extra])
    err = capsys.readouterr().err
    assert code == 1, err
    error = json.loads(err)["error"]
    assert error["code"] == "VALIDATION"
    assert names in error["message"] + json.dumps(error["details"]), error
    assert not (tmp_path / ".osmosis" / "evals" / "bad").exists()


def test_there_are_at_least_25_cases():
    assert len(CASES) >= 25


def test_a_config_outside_configs_eval_is_refused(tmp_path, capsys):
    config = make_workspace(tmp_path, ROWS)
    moved = tmp_path / "elsewhere.toml"
    moved.write_text(config.read_text())
    assert main(["eval", "run", str(moved), "-y", "--json"]) == 1
    assert "configs/eval" in json.loads(capsys.readouterr().err)["error"]["message"]
    assert not (tmp_path / ".osmosis").exists()


def test_every_config_problem_is_reported_at_once(tmp_path, capsys):
    config = make_workspace(tmp_path, ROWS)
    config.write_text(config.read_text().replace("n = 1", "n = 0\nlimt = 1\nbatch_size = -1"))
    assert main(["eval", "run", str(config), "-y", "--json"]) == 1
    keys = [i["key"] for i in json.loads(capsys.readouterr().err)["error"]["details"]["issues"]]
    assert {"evaluation.n", "evaluation.limt", "evaluation.batch_size"} <= set(keys)
