"""The eval config loader: defaults, every rule, and issues that name file, line and key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from osmosis.eval.inputs.config import (
    DEFAULT_AGENT_WORKFLOW_TIMEOUT_S,
    DEFAULT_GRADER_TIMEOUT_S,
    ConfigError,
    EvalConfig,
    check_config_location,
    load_eval_config,
    parse_eval_config,
)

EXPERIMENT = """\
[experiment]
rollout = "multiply"
entrypoint = "main.py"
model_path = "openai/gpt-5-mini"
dataset = "multiply"
"""
SECRETS = """\
[secrets]
required = ["OPENAI_API_KEY"]
"""
VALID = EXPERIMENT + "\n" + SECRETS


def write_config(root: Path, text: str, name: str = "smoke.toml") -> Path:
    path = root / "configs" / "eval" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def issues_of(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_eval_config(text, path="configs/eval/x.toml")
    return str(caught.value)


# -- valid files ----------------------------------------------------------------------------------
def test_minimal_config_gets_the_documented_defaults(tmp_path: Path) -> None:
    config = load_eval_config(write_config(tmp_path, VALID))

    assert config.experiment.rollout == "multiply"
    assert config.experiment.model_path == "openai/gpt-5-mini"
    assert config.experiment.branch is None and config.experiment.commit_sha is None
    assert config.evaluation.n == 1
    assert config.evaluation.pass_threshold == 1.0
    assert config.evaluation.limit is None  # no limit: a 10 % sample
    assert config.evaluation.batch_size is None
    assert config.evaluation.agent_workflow_timeout_s == DEFAULT_AGENT_WORKFLOW_TIMEOUT_S == 450
    assert config.evaluation.grader_timeout_s == DEFAULT_GRADER_TIMEOUT_S == 150
    assert config.env == {} and config.advanced == {}
    assert config.secrets.required == ("OPENAI_API_KEY",)
    assert config.evaluation.model_fields_set == set()  # nothing was set by the file


def test_full_config_keeps_every_value(tmp_path: Path) -> None:
    text = (
        EXPERIMENT
        + 'commit_sha = "ABCDEF1"\n'
        + "[evaluation]\nlimit = 20\nn = 4\nbatch_size = 8\npass_threshold = 0\n"
        + "agent_workflow_timeout_s = 30\ngrader_timeout_s = 2.5\n"
        + '[advanced]\nanything = { goes = [1, 2] }\n[env]\nLOG_LEVEL = "DEBUG"\n_PRIVATE = "x"\n'
        + "[secrets]\nrequired = []\n"
    )
    config = load_eval_config(write_config(tmp_path, text))

    assert config.experiment.commit_sha == "ABCDEF1"
    assert (config.evaluation.limit, config.evaluation.n, config.evaluation.batch_size) == (
        20,
        4,
        8,
    )
    assert config.evaluation.pass_threshold == 0.0  # 0.0 is respected, not replaced by 1.0
    assert config.evaluation.agent_workflow_timeout_s == 30.0
    assert config.evaluation.grader_timeout_s == 2.5
    assert config.evaluation.model_fields_set == {
        "limit",
        "n",
        "batch_size",
        "pass_threshold",
        "agent_workflow_timeout_s",
        "grader_timeout_s",
    }
    assert config.advanced == {"anything": {"goes": [1, 2]}}
    assert config.env == {"LOG_LEVEL": "DEBUG", "_PRIVATE": "x"}
    assert config.secrets.required == ()
    assert config.entrypoint_path(tmp_path) == tmp_path / "rollouts" / "multiply" / "main.py"


def test_config_is_frozen_and_typed() -> None:
    config = parse_eval_config(VALID)
    with pytest.raises(ValidationError):
        config.evaluation.n = 3  # type: ignore[misc]
    with pytest.raises(ValidationError):
        EvalConfig.model_validate({"experiment": {"rollout": "r"}, "secrets": {}})


def test_entrypoint_may_sit_in_a_subdirectory_of_the_rollout() -> None:
    text = VALID.replace('"main.py"', '"src/serve.py"')
    assert parse_eval_config(text).experiment.entrypoint == "src/serve.py"


# -- every issue, with its line and key -----------------------------------------------------------
def with_experiment(key: str, value: str) -> str:
    """VALID with one [experiment] key replaced (or added) as `key = value` on line 2."""
    lines = [line for line in EXPERIMENT.splitlines() if not line.startswith(f"{key} ")]
    return "\n".join([lines[0], f"{key} = {value}", *lines[1:]]) + "\n\n" + SECRETS


def with_evaluation(body: str) -> str:
    return VALID + "\n[evaluation]\n" + body + "\n"  # [evaluation] is line 10, body line 11


MALFORMED_CONFIGS = [
    ("unknown section", VALID + "\n[extra]\n", "x.toml:10: extra: Unrecognized section"),
    ("typo in section", VALID + "\n[evaluaton]\n", "evaluaton: Unrecognized section (did you mean"),
    ("unknown key", with_evaluation("limt = 5"), "x.toml:11: evaluation.limt: Unrecognized key"),
    ("missing experiment", SECRETS, "experiment: Missing required section [experiment]"),
    (
        "missing required key",
        VALID.replace('model_path = "openai/gpt-5-mini"\n', ""),
        "x.toml:1: experiment.model_path: Field required",
    ),
    (
        "experiment not a table",
        'experiment = "x"\n' + SECRETS,
        "x.toml:1: experiment: must be a table",
    ),
    (
        "rollout with slash",
        with_experiment("rollout", '"a/b"'),
        "x.toml:2: experiment.rollout: must be a single",
    ),
    (
        "rollout dot-dot",
        with_experiment("rollout", '".."'),
        "experiment.rollout: must be a single directory",
    ),
    ("rollout absolute", with_experiment("rollout", '"/etc"'), "x.toml:2: experiment.rollout"),
    (
        "rollout not a string",
        with_experiment("rollout", "3"),
        "experiment.rollout: must be a string, got 3",
    ),
    (
        "entrypoint escapes",
        with_experiment("entrypoint", '"../other/main.py"'),
        "x.toml:2: experiment.entrypoint: must be a file path inside rollouts/multiply/",
    ),
    (
        "entrypoint absolute",
        with_experiment("entrypoint", '"/tmp/x.py"'),
        "experiment.entrypoint: must be",
    ),
    (
        "entrypoint backslash",
        with_experiment("entrypoint", r'"..\\x.py"'),
        "experiment.entrypoint: must be",
    ),
    (
        "empty model",
        with_experiment("model_path", '""'),
        "x.toml:2: experiment.model_path: must not be empty",
    ),
    (
        "dataset is a path",
        with_experiment("dataset", '"data/x.jsonl"'),
        "experiment.dataset: must be a platform dataset name",
    ),
    (
        "bad commit sha",
        with_experiment("commit_sha", '"xyz"'),
        "x.toml:2: experiment.commit_sha: must be 7-40 hexadecimal",
    ),
    (
        "short commit sha",
        with_experiment("commit_sha", '"abc12"'),
        "experiment.commit_sha: must be 7-40",
    ),
    (
        "branch with space",
        with_experiment("branch", '"my branch"'),
        "x.toml:2: experiment.branch: must be a non-empty branch",
    ),
    (
        "branch and commit",
        with_experiment("branch", '"main"').replace(
            "[secrets]", 'commit_sha = "abcdef0"\n[secrets]'
        ),
        "experiment.commit_sha: branch and commit_sha are mutually exclusive",
    ),
    ("n zero", with_evaluation("n = 0"), "x.toml:11: evaluation.n: must be an integer >= 1, got 0"),
    (
        "n string",
        with_evaluation('n = "two"'),
        "evaluation.n: must be an integer >= 1, got 'two' (string)",
    ),
    (
        "n bool",
        with_evaluation("n = true"),
        "evaluation.n: must be an integer >= 1, got True (boolean)",
    ),
    (
        "n float",
        with_evaluation("n = 2.0"),
        "evaluation.n: must be an integer >= 1, got 2.0 (float)",
    ),
    (
        "limit negative",
        with_evaluation("limit = -5"),
        "x.toml:11: evaluation.limit: must be an integer >= 1",
    ),
    (
        "batch_size zero",
        with_evaluation("batch_size = 0"),
        "evaluation.batch_size: must be an integer >= 1",
    ),
    (
        "threshold nan",
        with_evaluation("pass_threshold = nan"),
        "evaluation.pass_threshold: must be a finite number",
    ),
    (
        "threshold string",
        with_evaluation('pass_threshold = "1"'),
        "evaluation.pass_threshold: must be a finite number",
    ),
    (
        "timeout zero",
        with_evaluation("grader_timeout_s = 0"),
        "evaluation.grader_timeout_s: must be a positive finite",
    ),
    (
        "timeout inf",
        with_evaluation("agent_workflow_timeout_s = inf"),
        "evaluation.agent_workflow_timeout_s: must be a positive",
    ),
    (
        "env lower-case",
        VALID + '[env]\nlog_level = "x"\n',
        "x.toml:10: env.log_level: invalid variable name",
    ),
    (
        "env reserved prefix",
        VALID + '[env]\n_OSMOSIS_X = "1"\n',
        "env._OSMOSIS_X: names starting with _OSMOSIS_ are reserved",
    ),
    (
        "env supervisor var",
        VALID + '[env]\n_OSMOSIS_ROLLOUT_PORT = "1"\n',
        "env._OSMOSIS_ROLLOUT_PORT: is set by the supervisor",
    ),
    (
        "env not a string",
        VALID + "[env]\nDEBUG = 1\n",
        'x.toml:10: env.DEBUG: must be a string (quote it: DEBUG = "...")',
    ),
    ("missing secrets", EXPERIMENT, "secrets: Missing required section [secrets]"),
    (
        "secrets without required",
        EXPERIMENT + "[secrets]\n",
        "x.toml:6: secrets.required: Field required",
    ),
    (
        "secrets unknown key",
        VALID + "optional = []\n",
        "x.toml:9: secrets.optional: Unrecognized key",
    ),
    (
        "secrets not a list",
        EXPERIMENT + '[secrets]\nrequired = "KEY"\n',
        "secrets.required: must be a list of secret names",
    ),
    (
        "secret bad name",
        EXPERIMENT + '[secrets]\nrequired = ["1KEY"]\n',
        "x.toml:7: secrets.required: '1KEY' is not a valid secret name",
    ),
    (
        "secret underscore start",
        EXPERIMENT + '[secrets]\nrequired = ["_KEY"]\n',
        "'_KEY' is not a valid secret name",
    ),
    (
        "duplicate secret",
        EXPERIMENT + '[secrets]\nrequired = [\n  "KEY",\n  "KEY",\n]\n',
        "x.toml:9: secrets.required: 'KEY' is listed more than once",
    ),
    (
        "secret also in env",
        EXPERIMENT + '[env]\nKEY = "v"\n[secrets]\nrequired = ["KEY"]\n',
        "x.toml:9: secrets.required: 'KEY' is also set in [env]",
    ),
    (
        "toml syntax",
        VALID + "\n[evaluation]\nn = \n",
        "x.toml:11: Invalid TOML: Invalid value (line 11, column 5)",
    ),
    (
        "duplicate key",
        VALID.replace("[secrets]", 'dataset = "again"\n[secrets]'),
        "x.toml:7: Invalid TOML: Cannot overwrite a value (line 7, column 18)",
    ),
]


@pytest.mark.parametrize(
    ("text", "expected"),
    [pytest.param(text, expected, id=name) for name, text, expected in MALFORMED_CONFIGS],
)
def test_malformed_config_names_the_problem(text: str, expected: str) -> None:
    assert expected in issues_of(text)


def test_every_issue_is_reported_at_once_in_line_order() -> None:
    text = (
        "[experiment]\n"  # 1
        'rollout = "../up"\n'  # 2
        'entrypoint = "main.py"\n'  # 3
        'model_path = "m"\n'  # 4
        'dataset = "d"\n'  # 5
        "\n"  # 6
        "[evaluation]\n"  # 7
        "limt = 5\n"  # 8
        "n = 0\n"  # 9
        "[env]\n"  # 10
        "bad = 1\n"  # 11
        "[secrets]\n"  # 12
        'required = ["lower"]\n'  # 13
        "[mystery]\n"  # 14
    )
    with pytest.raises(ConfigError) as caught:
        parse_eval_config(text, path="configs/eval/x.toml")
    error = caught.value

    assert [(issue.line, issue.key) for issue in error.issues] == [
        (2, "experiment.rollout"),
        (8, "evaluation.limt"),
        (9, "evaluation.n"),
        (11, "env.bad"),
        (13, "secrets.required"),
        (14, "mystery"),
    ]
    assert str(error).splitlines()[0] == "Invalid eval config configs/eval/x.toml:"
    assert (
        "  configs/eval/x.toml:8: evaluation.limt: Unrecognized key (did you mean 'limit'?)"
        in str(error).splitlines()
    )
    details = error.details()
    assert details["error"] == "Invalid eval config"
    assert {"line": 8, "key": "evaluation.limt", "message": error.issues[1].message} in details[
        "issues"
    ]


def test_unterminated_string_names_its_line_or_the_last_line() -> None:
    one_line = issues_of(VALID + '[env]\nA = "open\n')
    assert "x.toml:10: Invalid TOML: Illegal character" in one_line
    assert "(line 10, column 10)" in one_line
    # A multi-line string open to the end has no position in tomllib's message: the last line.
    at_end = issues_of(VALID + '[env]\nA = """open\nstill open\n')
    assert "x.toml:11: Invalid TOML: Unterminated string (at end of document)" in at_end


def test_dotted_and_inline_keys_still_get_a_line() -> None:
    text = (
        'experiment = { rollout = "a/b", entrypoint = "m.py", model_path = "m", dataset = "d" }\n'
    )
    message = issues_of(text + SECRETS)
    assert "x.toml:1: experiment.rollout: must be a single directory name" in message


# -- files and paths ------------------------------------------------------------------------------
def test_missing_and_non_utf8_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        load_eval_config(tmp_path / "configs" / "eval" / "nope.toml")
    path = write_config(tmp_path, "")
    path.write_bytes(b'[experiment]\nrollout = "\xff"\n')
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_eval_config(path)


@pytest.mark.skipif(os.name == "nt", reason="symlinks")
def test_symlinked_rollout_outside_rollouts_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (tmp_path / "rollouts").mkdir()
    (tmp_path / "rollouts" / "multiply").symlink_to(outside)
    path = write_config(tmp_path, VALID)

    with pytest.raises(ConfigError) as caught:
        load_eval_config(path)  # workspace root inferred from configs/eval/
    assert "smoke.toml:2: experiment.rollout: rollouts/multiply resolves outside rollouts/" in str(
        caught.value
    )


def test_config_location_must_be_configs_eval_toml(tmp_path: Path) -> None:
    good = write_config(tmp_path, VALID)
    assert check_config_location(good) == tmp_path
    assert check_config_location(good, workspace_root=tmp_path) == tmp_path
    nested = write_config(tmp_path, VALID, name="team/smoke.toml")
    assert check_config_location(nested, workspace_root=tmp_path) == tmp_path

    elsewhere = tmp_path / "configs" / "training" / "smoke.toml"
    with pytest.raises(ConfigError, match=r"must live under .*configs/eval/"):
        check_config_location(elsewhere, workspace_root=tmp_path)
    with pytest.raises(ConfigError, match="must live under configs/eval/"):
        check_config_location(tmp_path / "smoke.toml")
    with pytest.raises(ConfigError, match=r"must end in \.toml, got 'smoke\.yaml'"):
        check_config_location(tmp_path / "configs" / "eval" / "smoke.yaml")
