"""How every command speaks: rich tables, plain tab-separated text, or JSON envelopes.

Commands build data and hand it to an `Output`; they never print directly. Tests inject a
`Console` that records, as Rich's own tests do.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TextIO

from osmosis._version import __version__

if TYPE_CHECKING:
    from rich.console import Console

SCHEMA_VERSION = 1


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

    # -- envelopes -------------------------------------------------------------------------
    def _write_json(self, payload: Mapping[str, Any], stream: TextIO | None = None) -> None:
        text = json.dumps({"schema_version": SCHEMA_VERSION, **payload}, default=str)
        if stream is None:
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            stream.write(text + "\n")

    def _write_plain(self, line: str) -> None:
        # Rich expands tabs to spaces; plain mode promises real tab-separated fields.
        self.console.file.write(line + "\n")
        self.console.file.flush()

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
    ) -> None:
        """Many resources: a table, tab-separated rows, or the list envelope."""
        if self.mode is Mode.JSON:
            self._write_json(
                {
                    "items": list(items),
                    "total_count": len(items) if total_count is None else total_count,
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

        table = Table(title=title)
        for position, column in enumerate(columns):
            # The first column names the thing (a run, a dataset): it is what users copy
            # into the next command, so it is never cut; the other columns give way.
            table.add_column(column.replace("_", " ").title(), no_wrap=position == 0)
        for item in items:
            table.add_row(*(_plain(item.get(c)) for c in columns))
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
        self.console.print(message, markup=False, highlight=False)

    def info(self, message: str) -> None:
        """A progress or stage line; silent in JSON mode so stdout stays one document."""
        if self.mode is Mode.JSON:
            return
        target = self.console if self.mode is Mode.RICH else self.err_console
        target.print(message, markup=False, highlight=False)

    def warn(self, message: str) -> None:
        if self.mode is Mode.JSON:
            return
        self.err_console.print(f"warning: {message}", markup=False, highlight=False, style="yellow")

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
        self.err_console.print(
            f"error: {error.message}", markup=False, highlight=False, style="red"
        )
        if error.hint:
            self.err_console.print(f"hint: {error.hint}", markup=False, highlight=False)


def _plain(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str)
    return str(value)
