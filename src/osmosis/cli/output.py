"""How every command speaks: rich tables, plain tab-separated text, or JSON envelopes.

Commands build data and hand it to an `Output`; they never print directly. Tests inject a
`Console` that records, as Rich's own tests do.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from enum import StrEnum
from typing import IO, TYPE_CHECKING, Any

from osmosis._version import __version__

if TYPE_CHECKING:
    from rich.console import Console

SCHEMA_VERSION = 1
CONFIRM_HINT = "Use --yes to confirm in non-interactive mode."


class Mode(StrEnum):
    RICH = "rich"
    PLAIN = "plain"
    JSON = "json"


class CLIError(Exception):
    """An expected failure: printed as one line plus a hint, or as a JSON error envelope.

    `code` is one of the reference's error codes (VALIDATION, NOT_FOUND, CONFLICT, ...).
    """

    def __init__(
        self,
        message: str,
        *,
        code: str = "VALIDATION",
        details: Mapping[str, Any] | None = None,
        hint: str | None = None,
        exit_code: int = 1,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.details = dict(details or {})
        self.hint = hint
        self.exit_code = exit_code


@dataclass
class Output:
    """The single place that writes to the terminal for a command."""

    mode: Mode = Mode.RICH
    command: str = ""
    # Rich loads on first use: commands that print nothing (or JSON) never pay for it.
    _console: Console | None = field(default=None, repr=False)
    _err_console: Console | None = field(default=None, repr=False)

    @property
    def console(self) -> Console:
        if self._console is None:
            from rich.console import Console

            self._console = Console()
        return self._console

    @console.setter
    def console(self, console: Console) -> None:
        self._console = console

    @property
    def err_console(self) -> Console:
        if self._err_console is None:
            from rich.console import Console

            self._err_console = Console(stderr=True)
        return self._err_console

    @err_console.setter
    def err_console(self, console: Console) -> None:
        self._err_console = console

    @property
    def interactive(self) -> bool:
        return self.mode is Mode.RICH and self.console.is_terminal and sys.stdin.isatty()

    def confirm(
        self,
        prompt: str,
        *,
        yes: bool,
        details: Mapping[str, Any] | None = None,
        default: bool = False,
    ) -> None:
        """Ask `prompt` (Enter answers `default`); `yes` skips it. Without a terminal (or in
        --json and --plain) nothing is asked: the command fails with INTERACTIVE_REQUIRED,
        echoing the prompt in `details`. A No is a `typer.Abort` (exit 130)."""
        if yes:
            return
        if not self.interactive:
            raise CLIError(
                CONFIRM_HINT,
                code="INTERACTIVE_REQUIRED",
                details={"prompt": prompt, **(details or {})},
            )
        import typer

        if not typer.confirm(prompt, default=default):
            raise typer.Abort()

    # -- envelopes -------------------------------------------------------------------------
    def _write_json(self, payload: Mapping[str, Any], stream: IO[str] | None = None) -> None:
        text = json.dumps({"schema_version": SCHEMA_VERSION, **payload}, default=str)
        stream = self._stdout() if stream is None else stream
        stream.write(text + "\n")
        stream.flush()

    def _write_plain(self, line: str) -> None:
        # Rich expands tabs to spaces; plain mode promises real tab-separated fields.
        stream = self._stdout()
        stream.write(line + "\n")
        stream.flush()

    def _stdout(self) -> IO[str]:
        # JSON and plain lines go straight out: making a rich Console to print them imported
        # rich (~0.1 s of a short `eval run --json`). A console given in (tests) keeps its file.
        return self._console.file if self._console is not None else sys.stdout

    def detail(self, data: Mapping[str, Any], *, title: str | None = None) -> None:
        """One resource: a two-column table, `key<TAB>value` lines, or `{data}`."""
        if self.mode is Mode.JSON:
            self._write_json({"data": data})
            return
        if self.mode is Mode.PLAIN:
            for key, value in data.items():
                self._write_plain(f"{key}\t{_plain(value)}")
            return
        from rich.table import Table

        table = Table(title=title, show_header=False, box=None, pad_edge=False)
        table.add_column(style="bold")
        table.add_column()
        for key, value in data.items():
            table.add_row(str(key), _plain(value))
        self.console.print(table)

    def listing(
        self,
        items: Sequence[Mapping[str, Any]],
        *,
        columns: Sequence[str],
        title: str | None = None,
        total_count: int | None = None,
        has_more: bool = False,
        next_offset: int | None = None,
        context: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        cells: Mapping[str, Callable[[Any], str]] | None = None,
        total_known: bool = True,
    ) -> None:
        """Many resources: a table, tab-separated rows, or the list envelope.

        `total_count` defaults to the items shown; a cursor-paged listing (logs) that cannot
        know its total passes `total_known=False`, and JSON says `"total_count": null`
        rather than a page size posing as the total.

        `headers` and `cells` shape the rich table only (a shorter title, "313 B" for a byte
        count), so it stays readable at 80 columns; JSON and plain keep the raw values.
        """
        if self.mode is Mode.JSON:
            self._write_json(
                {
                    "items": list(items),
                    "total_count": (len(items) if total_count is None else total_count)
                    if total_known
                    else None,
                    "has_more": has_more,
                    "next_offset": next_offset,
                    **dict(context or {}),
                }
            )
            return
        if self.mode is Mode.PLAIN:
            for item in items:
                self._write_plain("\t".join(_plain(item.get(c)) for c in columns))
            return
        from rich.table import Table

        headers, cells = headers or {}, cells or {}
        table = Table(title=title)
        for position, column in enumerate(columns):
            # The first column names the thing (a run, a dataset): it is what users copy
            # into the next command, so it is never cut; the other columns give way.
            header = headers.get(column, column.replace("_", " ").title())
            table.add_column(header, no_wrap=position == 0)
        for item in items:
            table.add_row(*(cells.get(c, _plain)(item.get(c)) for c in columns))
        self.console.print(table)

    def operation(
        self,
        operation: str,
        *,
        message: str,
        status: str = "success",
        resource: Mapping[str, Any] | None = None,
        next_steps: Iterable[Mapping[str, Any]] = (),
    ) -> None:
        """The outcome of a command that did something."""
        if self.mode is Mode.JSON:
            payload: dict[str, Any] = {"status": status, "operation": operation, "message": message}
            if resource is not None:
                payload["resource"] = dict(resource)
            steps = list(next_steps)
            if steps:
                payload["next_steps_structured"] = steps
            self._write_json(payload)
            return
        _line(self.console, message)

    def info(self, message: str) -> None:
        """A progress or stage line; silent in JSON mode so stdout stays one document."""
        if self.mode is Mode.JSON:
            return
        target = self.console if self.mode is Mode.RICH else self.err_console
        _line(target, message)

    def warn(self, message: str) -> None:
        if self.mode is Mode.JSON:
            return
        _line(self.err_console, f"warning: {message}", style="yellow")

    def error(self, error: CLIError) -> None:
        """Errors go to stderr: one line and a hint, or the error envelope."""
        if self.mode is Mode.JSON:
            self._write_json(
                {
                    "command": self.command,
                    "cli_version": __version__,
                    "error": {
                        "code": error.code,
                        "message": error.message,
                        "details": error.details,
                    },
                },
                stream=sys.stderr,
            )
            return
        _line(self.err_console, f"error: {error.message}", style="red")
        # What the JSON envelope carries in `details` must reach a terminal user too: the
        # question a confirmation would have asked, and problems the message only counts.
        prompt = error.details.get("prompt")
        if isinstance(prompt, str):
            _line(self.err_console, f"  {prompt}")
        problems = error.details.get("problems")
        if isinstance(problems, list):
            for problem in problems:
                if isinstance(problem, str) and problem not in error.message:
                    _line(self.err_console, f"  {problem}")
        if error.hint:
            _line(self.err_console, f"hint: {error.hint}")


_current: ContextVar[Output] = ContextVar("osmosis_cli_output")


def output() -> Output:
    """The `Output` of the running command (set up by `osmosis.cli.main.main`).

    out = output()
    out.detail({"name": "qa"}, title="Dataset")
    """
    try:
        return _current.get()
    except LookupError:  # a command invoked directly, e.g. by typer's test runner
        out = Output()
        _current.set(out)
        return out


@contextmanager
def speaking_through(out: Output) -> Iterator[Output]:
    """Make `out` what `output()` returns inside the block (one command's run)."""
    token = _current.set(out)
    try:
        yield out
    finally:
        _current.reset(token)


def _line(console: Console, text: str, *, style: str | None = None) -> None:
    """One message line, printed as written. Off a terminal (a CI log, a pipe) it is not
    hard-wrapped at 80 columns, so a printed command (`--name X --retry-failed`) can be
    copied whole; on a terminal Rich wraps it to the window."""
    console.print(
        text, markup=False, highlight=False, style=style, soft_wrap=not console.is_terminal
    )


def short_time(value: Any, *, seconds: bool = False) -> str:
    """An ISO timestamp as local `YYYY-MM-DD HH:MM[:SS]` for a table cell (`-` if absent)."""
    from datetime import UTC, datetime

    if not value:
        return "-"
    try:
        moment = datetime.fromisoformat(str(value))
    except ValueError:
        return str(value)
    moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M")


def byte_size(value: Any) -> str:
    """A byte count as `313 B`, `4.2 KiB`, `1.3 GiB` for a table cell (`-` if absent)."""
    from osmosis.vocabulary import format_bytes

    return format_bytes(value) if isinstance(value, int) else _plain(value)


def _plain(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str)
    return str(value)


# -- help ------------------------------------------------------------------------------------
def install_help_rendering() -> None:
    """Make `--help` say what an option takes, and print help text as written.

    typer 0.29 shows `<bool>` beside every flag and `<str>` beside every text option, and
    parses help text as Rich markup, so `[secrets]` or `[env]` in a sentence vanished. Here a
    flag shows nothing (it takes no value), a value shows its kind as osmosis-ai's CLI does
    (TEXT, INTEGER, FLOAT, PATH; choices as `<a|b>`; an explicit metavar wins), and help text
    is literal. Cheap: nothing more is imported until help is rendered.
    """
    from typer import core

    if getattr(core.TyperOption, "_osmosis_help", False):
        return

    def kind(self: Any, ctx: Any, original: Callable[[Any, Any], str | None]) -> str | None:
        if self.metavar is not None:
            return str(self.metavar)
        if getattr(self, "is_flag", False) or getattr(self, "count", False):
            return None
        shown = original(self, ctx)
        if shown is None or getattr(self.type_descriptor, "is_choice", False):
            return shown  # the choices: <personal|workspace>
        bare = shown.strip("<>")
        if bare.startswith("list[") and bare.endswith("]"):
            bare = bare[5:-1]  # a variadic argument: typer already adds "..." to its name
        return _KINDS.get(bare, bare.upper())

    def patched(original: Callable[[Any, Any], str | None]) -> Callable[[Any, Any], str | None]:
        return lambda self, ctx: kind(self, ctx, original)

    for param in (core.TyperOption, core.TyperArgument):
        param.display_type_rich = patched(param.display_type_rich)  # type: ignore[method-assign,assignment]
    core.TyperOption._osmosis_help = True  # type: ignore[attr-defined]
    for command in (core.TyperCommand, core.TyperGroup):
        command.format_help = _literal_help(command.format_help)  # type: ignore[method-assign]


_KINDS = {
    "str": "TEXT",
    "int": "INTEGER",
    "int range": "INTEGER",
    "float": "FLOAT",
    "float range": "FLOAT",
    "path": "PATH",
    "bool": "BOOLEAN",
}


def _literal_help(format_help: Callable[..., None]) -> Callable[..., None]:
    def format_literal(self: Any, ctx: Any, formatter: Any) -> None:
        _literal_rich_text()
        format_help(self, ctx, formatter)

    return format_literal


def _literal_rich_text() -> None:
    """Render help strings as plain text (typer parses them as Rich markup)."""
    from typer import rich_utils

    if getattr(rich_utils, "_osmosis_literal", False):
        return
    make_rich_text = rich_utils._make_rich_text

    def literal(*, text: str, style: str = "", markup_mode: Any) -> Any:
        if markup_mode == "rich":
            from rich.markup import escape

            text = escape(text)
        return make_rich_text(text=text, style=style, markup_mode=markup_mode)

    rich_utils._make_rich_text = literal
    rich_utils._osmosis_literal = True  # type: ignore[attr-defined]
