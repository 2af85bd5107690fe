"""`eval submit`'s pre-flight import, started at the command's entry (issue 30).

    begin(["eval", "submit", "configs/eval/smoke.toml", "-y"])  # started, if the line allows
    ...                                                          # typer, the checks, requests
    take(Path("configs/eval/smoke.toml"))                        # the command adopts it
    end()                                                        # closed, if nobody took it

The pre-flight (a child interpreter importing the entrypoint, ~0.5 s) is what a submit waits
for last. Started by the command itself, it came after typer's parse of the line (pydantic's
import and one TypeAdapter per option, ~0.25 s); started here, the two overlap. `begin` reads
the line with the standard library alone and starts only for `eval submit CONFIG` with a
config under `<workspace>/configs/eval/` and the command's own options (no `--help`, no
`--env-file`: its variables must reach the child). The command checks the config as always
and adopts the early child only when it imports what the checked config names
(`submit._preflight_for`); anything else, or any doubt, and the command starts its own.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from osmosis.cli.early_line import read_line

if TYPE_CHECKING:
    from osmosis.cli.eval.preflight import Preflight

# `eval submit` options that leave the pre-flight alone (`--json`, `--plain`: `early_line`).
_FLAGS = frozenset({"-y", "--yes", "--wait"})
_VALUED = frozenset(
    {"--secrets-file", "--min-pass-rate", "--min-mean-reward", "--model", "-n", "--limit",
     "--cache", "--replay-from", "--platform", "--workspace"}
)  # fmt: skip

_started: tuple[Path, Preflight] | None = None


def begin(argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> None:
    """Start the pre-flight `argv` (the command line, without the program) will wait for,
    when its config is known now; otherwise do nothing. Never raises: the command reports
    any problem."""
    global _started
    try:
        config = _config(argv, environ)
        if config is None:
            return
        from osmosis.cli.eval.preflight import early_preflight

        preflight = early_preflight(config, config.parents[2])
    except Exception:  # an unreadable path, a link loop: the command starts its own
        return
    if preflight is not None:
        _started = (config, preflight)


def take(config: Path) -> Preflight | None:
    """The pre-flight `begin` started for `config` (the command's argument), now the
    caller's to close; None when it started none for that file."""
    global _started
    if _started is None:
        return None
    path, preflight = _started
    try:
        same = config.resolve() == path
    except OSError:
        same = False
    if not same:
        return None
    _started = None
    return preflight


def end() -> None:
    """Close the early pre-flight if the command did not take it (an error before, --help).
    Idempotent."""
    global _started
    if _started is not None:
        _started[1].close()
        _started = None


def _config(argv: Sequence[str], environ: Mapping[str, str]) -> Path | None:
    """The resolved config of a plain `eval submit CONFIG ...` line, else None."""
    line = read_line(argv, ("eval", "submit"), flags=_FLAGS, valued=_VALUED, environ=environ)
    return line.config if line is not None else None
