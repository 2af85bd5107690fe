"""The CLI's global conventions: flags anywhere, envelopes, exit codes."""

import json
import subprocess
import sys

import pytest
from rich.console import Console

from osmosis._version import __version__
from osmosis.cli.main import _split_global_flags, main
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
    assert _split_global_flags(argv) == (rest, mode)


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
