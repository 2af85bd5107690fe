"""Which `osmosis eval run` lines start their rollout server at the command's entry
(`osmosis.cli.prestart`): only those whose launch is certain from the line and the config."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from osmosis.cli import prestart
from osmosis.eval.host.run_name import default_run_name
from tests.e2e.workspace import make_workspace, row


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return make_workspace(tmp_path, [row("pass", a) for a in range(2, 6)], env={"MODE": "fast"})


def _line(config: Path, *options: str) -> list[str]:
    return ["eval", "run", str(config), *options]


@pytest.mark.parametrize(
    "options",
    [
        ("-y",),
        ("--yes", "--name", "mine"),
        ("--json", "-y", "--name=mine", "--limit", "1", "-n", "2", "--model", "openai/x"),
        ("-y", "--replicas", "1", "--executor", "local", "--max-in-flight", "4", "--plain"),
    ],
)
def test_a_line_whose_launch_is_known_starts_early(config, options):
    early = prestart._early(prestart._read(_line(config, *options), {}))
    assert early is not None
    rollout_dir, entrypoint, env, _, run_dir, _ = early
    workspace = config.parents[2]
    assert rollout_dir == workspace / "rollouts" / "scripted"
    assert entrypoint == str(workspace / "rollouts" / "scripted" / "main.py")
    assert env == {"MODE": "fast"}  # [env] is plain config
    assert run_dir.parent == workspace / ".osmosis" / "evals"


@pytest.mark.parametrize(
    "options",
    [
        (),  # no --yes: the user has not said yes yet
        ("-y", "--executor", "ray"),
        ("-y", "--replicas", "2"),
        ("-y", "--output", "elsewhere"),
        ("-y", "--replay-from", "old"),
        ("-y", "--estimate"),
        ("-y", "--help"),
        ("-y", "--env-file", ".env"),
        ("-y", "--model", "a/b", "--model", "c/d"),  # one run per model, each its own name
        ("-y", "--name"),  # a flag missing its value: the parser says so
        ("-y", "--fresh"),
        ("-y", "--", "x"),
    ],
)
def test_a_line_that_may_change_the_launch_starts_nothing(config, options):
    assert prestart._early(prestart._read(_line(config, *options), {})) is None


def test_another_command_or_a_dotenv_file_starts_nothing(config):
    assert prestart._early(prestart._read(["eval", "submit", str(config), "-y"], {})) is None
    assert (
        prestart._early(prestart._read(_line(config, "-y"), {"OSMOSIS_ENV_FILE": ".env"})) is None
    )


@pytest.mark.parametrize(
    "change",
    ["secrets", "pyproject", "missing entrypoint", "linked rollout", "outside configs/eval",
     "env not a string"],
)  # fmt: skip
def test_a_config_or_rollout_the_engine_would_treat_otherwise_starts_nothing(
    tmp_path, config, change
):
    workspace = config.parents[2]
    rollout = workspace / "rollouts" / "scripted"
    line = _line(config, "-y")
    if change == "secrets":
        config.write_text(config.read_text().replace("required = []", 'required = ["TOKEN"]'))
    elif change == "pyproject":
        (rollout / "pyproject.toml").write_text('[project]\nname = "x"\n')
    elif change == "missing entrypoint":
        (rollout / "main.py").unlink()
    elif change == "linked rollout":
        real = tmp_path / "real-rollout"
        rollout.rename(real)
        rollout.symlink_to(real)
    elif change == "outside configs/eval":
        moved = workspace / "configs" / "scripted.toml"
        config.rename(moved)
        line = _line(moved, "-y")
    else:
        config.write_text(config.read_text().replace('MODE = "fast"', "MODE = 3"))
    assert prestart._early(prestart._read(line, {})) is None


def test_without_name_the_run_is_named_as_the_plan_would_name_it(config):
    early = prestart._early(prestart._read(_line(config, "-y"), {}))
    assert early is not None
    name, run_dir = early[3], early[4]
    assert name is not None and re.fullmatch(r"scripted-\d{8}-\d{6}", name)
    assert run_dir.name == name
    assert name[:-2] == default_run_name(config)[:-2]  # the shared format (seconds may tick)
    named = prestart._early(prestart._read(_line(config, "-y", "--name", "mine"), {}))
    assert named is not None and named[3] is None and named[4].name == "mine"
