"""The CLI's global conventions: flags anywhere, envelopes, exit codes."""

import json
import subprocess
import sys

import pytest
from rich.console import Console

from osmosis._version import __version__
from osmosis.cli.main import _split_global_flags, load_env_file, main
from osmosis.cli.output import Mode


def osmosis(*args):
    return subprocess.run(
        [sys.executable, "-c", "from osmosis.cli.main import run; run()", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("argv", "rest", "mode"),
    [
        (["--json", "dataset", "validate", "f"], ["dataset", "validate", "f"], Mode.JSON),
        (["dataset", "validate", "f", "--plain"], ["dataset", "validate", "f"], Mode.PLAIN),
        (["dataset", "--json", "validate", "f"], ["dataset", "validate", "f"], Mode.JSON),
        (["x", "--", "--json"], ["x", "--", "--json"], Mode.RICH),
    ],
)
def test_global_output_flags_are_taken_from_anywhere_before_double_dash(argv, rest, mode):
    options = _split_global_flags(argv)
    assert (options.args, options.mode) == (rest, mode)


@pytest.mark.parametrize(
    "argv",
    [
        ["--env-file", "x.env", "dataset", "validate", "f"],
        ["dataset", "validate", "f", "--env-file", "x.env"],
        ["dataset", "--env-file=x.env", "validate", "f"],
    ],
)
def test_env_file_is_taken_from_anywhere(argv):
    options = _split_global_flags(argv)
    assert options.args == ["dataset", "validate", "f"] and options.env_file == "x.env"


@pytest.mark.parametrize(
    "argv",
    [
        ["--platform", "https://p.example", "secret", "list"],
        ["secret", "--platform=https://p.example", "list"],
        ["secret", "list", "--platform", "https://p.example"],
    ],
)
def test_platform_is_taken_from_anywhere(argv):
    options = _split_global_flags(argv)
    assert options.args == ["secret", "list"] and options.platform == "https://p.example"


@pytest.mark.parametrize("argv", [["secret", "list", "--platform"], ["--platform=", "auth"]])
def test_platform_without_a_url_is_a_usage_error(argv, capsys):
    assert main(["--json", *argv]) == 2
    error = json.loads(capsys.readouterr().err)["error"]
    assert error["code"] == "VALIDATION" and "--platform needs a value" in error["message"]


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["--env-file", "none.env", "secret", "list"], "secret list"),
        (["dataset", "validate", "no-such-file.jsonl"], "dataset validate"),
        (["dataset", "--rows", "3", "validate", "x.jsonl", "--json"], "dataset"),
        # A value on the line may be a secret: it never reaches the envelope.
        (["auth", "login", "--token", "osm_secret-value", "--platform", "ftp://x"], "auth login"),
    ],
)
def test_the_error_envelope_names_the_command_not_its_arguments(argv, command, capsys, tmp_path):
    main(["--json", *argv])
    envelope = json.loads(capsys.readouterr().err)
    assert envelope["command"] == command
    assert not {"jsonl", "none.env", "osm_secret-value"} & set(envelope["command"].split())
    assert "osm_secret-value" not in json.dumps(envelope)


def test_env_file_adds_variables_without_overriding_the_environment(tmp_path):
    env_file = tmp_path / "x.env"
    env_file.write_text("export A=from-file\nB='quoted value'\n")
    environ = {"A": "from-shell"}
    load_env_file(str(env_file), environ)
    assert environ == {"A": "from-shell", "B": "quoted value"}


def test_a_missing_env_file_is_a_validation_error(tmp_path, capsys):
    assert main(["--json", "--env-file", str(tmp_path / "none.env"), "--version"]) == 1
    error = json.loads(capsys.readouterr().err)["error"]
    assert error["code"] == "VALIDATION" and "none.env" in error["message"]


def test_version_prints_the_installed_version():
    console = Console(record=True, width=100)
    assert main(["--version"], console=console) == 0
    assert console.export_text().strip() == f"osmosis {__version__}"


def test_usage_error_exits_2_with_a_json_error_envelope_on_stderr():
    done = osmosis("dataset", "validate", "--json")
    assert done.returncode == 2
    assert done.stdout == ""
    envelope = json.loads(done.stderr)
    assert envelope["schema_version"] == 1
    assert envelope["error"]["code"] == "VALIDATION"
    assert "Missing argument" in envelope["error"]["message"]


def test_usage_error_in_rich_mode_is_a_short_message_not_a_traceback():
    done = osmosis("dataset", "validate")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "Missing argument 'file'" in done.stderr
