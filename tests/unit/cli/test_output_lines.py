"""Message lines are printed as written off a terminal: a resume or `--retry-failed` command
in a CI log is one line that can be copied whole, not hard-wrapped at 80 columns."""

from __future__ import annotations

import io
import subprocess
import sys

from rich.console import Console

from osmosis.cli.output import CLIError, Mode, Output

COMMAND = (
    "osmosis eval run configs/eval/a-rather-long-config-name.toml --name "
    "a-rather-long-run-name-20261201-120000 --retry-failed --output /tmp/some/where/deep"
)


def output(*, terminal: bool) -> tuple[Output, io.StringIO]:
    buffer = io.StringIO()
    console = Console(file=buffer, width=80, force_terminal=terminal, color_system=None)
    out = Output(mode=Mode.RICH)
    out.console = console
    out.err_console = console
    return out, buffer


def test_off_a_terminal_lines_are_not_hard_wrapped():
    out, buffer = output(terminal=False)
    out.info(f"resume with: {COMMAND}")
    out.warn(f"1 attempt failed; re-run it with: {COMMAND}")
    out.error(CLIError("interrupted", hint=f"resume with: {COMMAND}"))
    out.operation("eval.run", message=f"Run incomplete; {COMMAND}")
    lines = buffer.getvalue().splitlines()
    assert lines == [
        f"resume with: {COMMAND}",
        f"warning: 1 attempt failed; re-run it with: {COMMAND}",
        "error: interrupted",
        f"hint: resume with: {COMMAND}",
        f"Run incomplete; {COMMAND}",
    ]


def test_on_a_terminal_rich_still_wraps_to_the_window():
    out, buffer = output(terminal=True)
    out.info(f"resume with: {COMMAND}")
    assert all(len(line) <= 80 for line in buffer.getvalue().splitlines())
    assert len(buffer.getvalue().splitlines()) > 1


def test_a_real_command_in_a_pipe_prints_its_hint_on_one_line(tmp_path):
    config = tmp_path / "configs" / "eval" / ("x" * 90 + ".toml")  # does not exist
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from osmosis.cli.main import run; run()",
            "eval",
            "run",
            str(config),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 1
    error = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "x" * 90 in error[0]
