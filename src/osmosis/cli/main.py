"""The `osmosis` command: global options, command groups, and the error/exit-code policy.

Start-up stays light: this module imports typer only; rich loads when something prints, and
each command imports what it needs (FastAPI, pyarrow, litellm, ...) inside its own body.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING

import typer

# typer 0.29 vendors click; its exceptions are only reachable here.
from typer._click import exceptions as click_exceptions

from osmosis._version import __version__
from osmosis.cli.output import CLIError, Mode, Output

if TYPE_CHECKING:
    from rich.console import Console

_output: ContextVar[Output] = ContextVar("osmosis_cli_output")

app = typer.Typer(
    name="osmosis",
    help="Evaluate LLM agent rollouts on your machine or a self-hosted platform.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def output() -> Output:
    """The `Output` of the running command (set up by `main`)."""
    try:
        return _output.get()
    except LookupError:  # a command invoked directly, e.g. by typer's test runner
        out = Output()
        _output.set(out)
        return out


def _version_callback(value: bool) -> None:
    if value:
        output().console.print(f"osmosis {__version__}", markup=False, highlight=False)
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False,
        "--version",
        "-V",
        callback=_version_callback,
        is_eager=True,
        help="Print the version.",
    ),
    json_output: bool = typer.Option(
        False, "--json", help="Structured JSON output (anywhere on the line)."
    ),
    plain: bool = typer.Option(
        False, "--plain", help="Low-noise text; tab-separated rows for lists."
    ),
) -> None:
    """Evaluate LLM agent rollouts on your machine or a self-hosted platform."""


def _register_groups() -> None:
    # Each group module imports only typer at module level, so `osmosis --help` stays fast.
    from osmosis.cli import admin, auth, dataset, dev, eval, server

    app.add_typer(dataset.app, name="dataset")
    app.add_typer(dev.app, name="dev")
    app.add_typer(eval.app, name="eval")
    app.add_typer(server.app, name="server")
    app.add_typer(auth.app, name="auth")
    app.add_typer(admin.app, name="admin")


_register_groups()

_GLOBAL_FLAGS = {"--json": Mode.JSON, "--plain": Mode.PLAIN}


def _split_global_flags(argv: Sequence[str]) -> tuple[list[str], Mode]:
    """Pull `--json`/`--plain` from anywhere on the line (before a bare `--`)."""
    mode = Mode.RICH
    rest: list[str] = []
    passthrough = False
    for arg in argv:
        if not passthrough and arg in _GLOBAL_FLAGS:
            mode = _GLOBAL_FLAGS[arg]
            continue
        passthrough = passthrough or arg == "--"
        rest.append(arg)
    return rest, mode


def main(argv: Sequence[str] | None = None, *, console: Console | None = None) -> int:
    """Run the CLI and return its exit code: 0 success, 1 error or partial, 130 interrupted."""
    args, mode = _split_global_flags(sys.argv[1:] if argv is None else argv)
    out = Output(mode=mode, command=" ".join(a for a in args if not a.startswith("-"))[:80])
    if console is not None:
        out.console = console
        out.err_console = console
    token = _output.set(out)
    try:
        result = app(args=args, prog_name="osmosis", standalone_mode=False)
        return result if isinstance(result, int) else 0
    except CLIError as error:
        out.error(error)
        return error.exit_code
    except typer.Abort:
        return 130
    except KeyboardInterrupt:
        out.err_console.print("interrupted", markup=False)
        return 130
    except click_exceptions.ClickException as error:
        if mode is Mode.JSON:
            out.error(CLIError(error.format_message(), code="VALIDATION"))
        else:
            error.show()
        return 2 if isinstance(error, click_exceptions.UsageError) else 1
    finally:
        _output.reset(token)


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
