"""The `osmosis` command: global options, command groups, and the error/exit-code policy.

Start-up stays light: this module imports typer only; rich loads when something prints, and
each command imports what it needs (FastAPI, pyarrow, litellm, ...) inside its own body. The
command tree holds only the branch the line names (`build_app`), so `osmosis eval run` neither
imports nor builds the other commands.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

# typer 0.29 vendors click; its exceptions are only reachable here.
from typer._click import exceptions as click_exceptions

from osmosis._version import __version__
from osmosis.cli.credentials import use_platform, use_workspace
from osmosis.cli.output import (
    CLIError,
    Mode,
    Output,
    install_help_rendering,
    output,
    speaking_through,
)

if TYPE_CHECKING:
    from rich.console import Console


def _version_callback(value: bool) -> None:
    if value:
        output().console.print(f"osmosis {__version__}", markup=False, highlight=False)
        raise typer.Exit()


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
    env_file: str | None = typer.Option(
        None,
        "--env-file",
        help="Load a dotenv file first (anywhere on the line; OSMOSIS_ENV_FILE).",
    ),
    platform: str | None = typer.Option(
        None,
        "--platform",
        help="Platform base URL (anywhere on the line; default: OSMOSIS_PLATFORM_URL, the "
        "saved login, or the local server).",
    ),
    workspace: str | None = typer.Option(
        None,
        "--workspace",
        help="Act on this workspace (its name, e.g. owner/repo) instead of the current "
        "checkout's; sent as X-Osmosis-Workspace (anywhere on the line).",
    ),
) -> None:
    """Evaluate LLM agent rollouts on your machine or a self-hosted platform."""


# What `osmosis` holds, in the order help lists it (typer lists commands before groups).
_COMMANDS = ("doctor", "init")
_GROUPS = ("dataset", "dev", "eval", "server", "auth", "admin", "secret", "workspace", "rollout",
           "template")  # fmt: skip


def build_app(args: Sequence[str] = ()) -> typer.Typer:
    """The `osmosis` command tree for a command line (global options already taken out).

    A line that names a command or group gets that branch alone (`eval run` builds no other
    `eval` command): typer turns every command it holds into a click command on each call,
    after its module is imported. Any other line (no command, `osmosis --help`, a typo) gets
    the whole tree, so click can list every command or suggest the nearest.

        build_app(["eval", "run", "configs/eval/x.toml"])  # osmosis > eval > run only
    """
    root = typer.Typer(
        name="osmosis",
        help="Evaluate LLM agent rollouts on your machine or a self-hosted platform.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    root.callback()(_root)
    named = args[0] if args and args[0] in (*_COMMANDS, *_GROUPS) else None
    below = args[1] if named and len(args) > 1 else None
    for name in _COMMANDS:
        if named in (None, name):
            root.command(name)(_command(name))
    for name in _GROUPS:
        if named in (None, name):
            root.add_typer(_group(name, below), name=name)
    return root


def _command(name: str) -> Callable[..., Any]:
    # Each module imports only typer at module level; its commands import the rest.
    if name == "doctor":
        from osmosis.cli import doctor

        return doctor.doctor
    from osmosis.cli import init  # `init`, `rollout init`, `template`: issue 17

    return init.init_command


def _group(name: str, command: str | None) -> typer.Typer:
    """Group `name`'s typer, its module imported now; `eval` holds only `command` when it has
    one so named (its commands are modules of their own)."""
    match name:
        case "eval":
            from osmosis.cli import eval

            return eval.group(command)
        case "dataset":
            from osmosis.cli import dataset

            return dataset.app
        case "dev":
            from osmosis.cli import dev

            return dev.app
        case "server":
            from osmosis.cli import server

            return server.app
        case "auth":
            from osmosis.cli import auth

            return auth.app
        case "admin":
            from osmosis.cli import admin

            return admin.app
        case "secret":
            from osmosis.cli import secret

            return secret.app
        case "workspace":
            from osmosis.cli import workspace

            return workspace.app
        case "rollout":
            from osmosis.cli import rollout

            return rollout.app
    from osmosis.cli import template

    return template.app


@cache
def _whole_app() -> typer.Typer:
    return build_app()


def __getattr__(name: str) -> typer.Typer:
    # `app`: the whole command tree, built once when asked for (tools that read every command);
    # `main` builds the branch its line names.
    if name == "app":
        return _whole_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


install_help_rendering()

_GLOBAL_FLAGS = {"--json": Mode.JSON, "--plain": Mode.PLAIN}
# Global options that take a value: flag -> GlobalOptions field.
_GLOBAL_VALUES = {"--env-file": "env_file", "--platform": "platform", "--workspace": "workspace"}
_VALUE_HINTS = {
    "--env-file": "--env-file .env",
    "--platform": "--platform https://host:8765",
    "--workspace": "--workspace owner/repo",
}


@dataclass(frozen=True)
class GlobalOptions:
    """What was said anywhere on the line before the command parser sees it."""

    args: list[str]
    mode: Mode = Mode.RICH
    env_file: str | None = None
    platform: str | None = None
    workspace: str | None = None


def _split_global_flags(argv: Sequence[str]) -> GlobalOptions:
    """Pull `--json`/`--plain`, `--env-file FILE`, `--platform URL` and `--workspace NAME`
    from anywhere on the line (before a bare `--`), so each works in any position, as the
    reference CLI allows."""
    mode = Mode.RICH
    values: dict[str, str] = {}
    rest: list[str] = []
    passthrough = False
    items = iter(argv)
    for arg in items:
        flag, has_value, inline = arg.partition("=")
        if passthrough or (arg not in _GLOBAL_FLAGS and flag not in _GLOBAL_VALUES):
            passthrough = passthrough or arg == "--"
            rest.append(arg)
        elif arg in _GLOBAL_FLAGS:
            mode = _GLOBAL_FLAGS[arg]
        else:
            value = inline if has_value else next(items, None)
            if not value:
                raise CLIError(f"{flag} needs a value", hint=_VALUE_HINTS[flag], exit_code=2)
            values[_GLOBAL_VALUES[flag]] = value
    return GlobalOptions(args=rest, mode=mode, **values)


def _command_path(args: Sequence[str]) -> str:
    """The command named on the line ("dataset upload", "admin user create"), without the
    arguments and option values that follow it: the `command` of a JSON error envelope."""
    if not args or args[0] not in (*_COMMANDS, *_GROUPS):
        return ""  # names nothing: no need to import every group to say so
    path: list[str] = []
    node = build_app(args)
    for arg in args:
        groups = {
            group.name: group.typer_instance
            for group in node.registered_groups
            if group.typer_instance is not None
        }
        commands = {
            command.name or getattr(command.callback, "__name__", "").replace("_", "-")
            for command in node.registered_commands
        }
        if arg in groups:
            path.append(arg)
            node = groups[arg]
            continue
        if arg in commands:
            path.append(arg)
        break
    return " ".join(path)


def load_env_file(path: str, environ: MutableMapping[str, str]) -> None:
    """Add a dotenv file's variables to `environ`; variables already set win (as in shells
    that `source` a file, the explicit environment is the user's last word)."""
    from osmosis.eval.inputs.secrets import SecretsError, read_dotenv

    try:
        values = read_dotenv(Path(path))
    except SecretsError as error:
        raise CLIError(
            f"--env-file: {error}", details={"problems": error.problems, "file": path}
        ) from None
    for name, value in values.items():
        environ.setdefault(name, value)


def main(argv: Sequence[str] | None = None, *, console: Console | None = None) -> int:
    """Run the CLI and return its exit code: 0 success, 1 error or partial, 130 interrupted."""
    raw = list(sys.argv[1:] if argv is None else argv)
    mode = Mode.JSON if "--json" in raw else Mode.PLAIN if "--plain" in raw else Mode.RICH
    out = Output(mode=mode)
    if console is not None:
        out.console = console
        out.err_console = console
    with speaking_through(out):
        try:
            out.command = _command_path([a for a in raw if not a.startswith("-")])
            options = _split_global_flags(raw)
            out.command = _command_path(options.args)
            out.mode = options.mode
            env_file = options.env_file or os.environ.get("OSMOSIS_ENV_FILE")
            if env_file:
                load_env_file(env_file, os.environ)
            use_platform(options.platform)
            use_workspace(options.workspace)
            app = build_app(options.args)
            result = app(args=options.args, prog_name="osmosis", standalone_mode=False)
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
        except Exception as error:  # a bug: one line and the way to the traceback
            if os.environ.get("OSMOSIS_DEBUG"):
                raise
            out.error(
                CLIError(
                    f"unexpected error: {type(error).__name__}: {error}",
                    code="INTERNAL",
                    hint="this is a bug in osmosis; run again with OSMOSIS_DEBUG=1 for the "
                    "traceback",
                )
            )
            return 1


def run() -> None:
    """Console-script entry point. `eval run` may start its rollout server first, to overlap
    that server's start with this command's own (`osmosis.cli.prestart`); `eval submit` its
    pre-flight import (`osmosis.cli.eval.submit_early`)."""
    from osmosis.cli import prestart
    from osmosis.cli.eval import submit_early

    # httpx imports its own command line (click, pygments: ~0.05 s of CPU, a tenth of a
    # submit's) unless that import fails; httpx then only stubs `httpx.main`, never used here.
    # None in sys.modules is how an import is made to fail; typeshed types only modules.
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
    prestart.begin(sys.argv[1:])
    submit_early.begin(sys.argv[1:])
    try:
        code = main()
    finally:
        prestart.end()  # a server the run did not adopt (a plan error, Ctrl-C) goes now
        submit_early.end()
    _exit_now(code)


def _exit_now(code: int) -> NoReturn:
    """End the process without the interpreter's teardown: freeing a thousand imported
    modules one by one takes ~0.15 s, a tenth of a short `eval run`, and the OS frees all of
    it at once. What a command wrote is closed (and the journal synced) before `main`
    returns; the rest of a normal exit still happens here: other threads are waited for, the
    exit handlers run (logging and tracing flush), the standard streams are flushed."""
    import atexit
    import threading

    # What a normal exit does first: the thread pools' exit hooks (they tell their workers to
    # stop), then a join of every other non-daemon thread.
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`osmosis ... | head`)
            code = code or 1
    os._exit(code)
