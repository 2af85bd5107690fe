"""`--help` says what each option takes and prints its text as written (issue 17.6): typer
showed `<bool>` beside every flag and `<str>` beside every text option, and read help text as
Rich markup, so `[secrets]` vanished from a sentence."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys

import pytest

CLI = [sys.executable, "-c", "from osmosis.cli.main import run; run()"]


@functools.cache
def help_of(*command: str) -> str:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
    done = subprocess.run(
        [*CLI, *command, "--help"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def option_line(text: str, option: str) -> str:
    (line,) = [line for line in text.splitlines() if re.match(rf"^\W*{option}\s", line)]
    return " ".join(line.strip("│ ").split())


def test_bracketed_words_in_help_text_survive():
    assert "with the [secrets] values" in help_of("eval", "run")
    assert "values for [secrets].required" in help_of("eval", "submit")


@pytest.mark.parametrize(
    ("command", "option", "shown"),
    [
        (("eval", "run"), "--fresh", "--fresh Archive"),  # a flag takes no value
        (("eval", "run"), "--yes", "--yes -y Skip"),
        (("eval", "run"), "--name", "--name TEXT Run name"),
        (("eval", "run"), "--max-in-flight", "--max-in-flight INTEGER"),
        (("eval", "run"), "--dataset-file", "--dataset-file PATH"),
        (("dataset", "download"), "--output", "--output -o PATH"),
        (("secret", "set"), "--scope", "--scope <personal|workspace>"),
        (("secret", "set"), "--env", "--env VAR"),
        (("dev", "fake-model"), "--verdict", "--verdict TEXT=SCORE"),
        (("eval", "compare"), "runs...", "* runs... TEXT Two or more"),  # not LIST[STR]
    ],
)
def test_options_show_what_they_take(command, option, shown):
    assert option_line(help_of(*command), option).startswith(shown)


def test_no_option_anywhere_shows_a_python_type_name():
    for command in (("eval", "run"), ("eval", "submit"), ("dataset", "upload"), ("init",)):
        text = help_of(*command)
        assert "<bool>" not in text and "<str>" not in text and "<int>" not in text, command


def test_eval_run_help_names_its_exit_codes():
    text = " ".join(help_of("eval", "run").split())
    assert "5 every attempt errored" in text
    assert "3 below --min-pass-rate" in text
