"""A command line read before typer loads, for the work a command may start at its entry
(`osmosis.cli.prestart` for `eval run`, `osmosis.cli.eval.submit_early` for `eval submit`).

    line = read_line(argv, ("eval", "run"), flags=..., valued=..., environ=os.environ)
    line.config          # the one config under <workspace>/configs/eval/, resolved
    line.values["--model"], "-y" in line.flags

Standard library only. Anything it does not know for certain (another command, an unknown
option, --help, --env-file, --, a second positional, a config elsewhere) is None: the
command then starts what it needs itself, as it always did.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

MODES = frozenset({"--json", "--plain"})  # global flags that change only the output


@dataclass(frozen=True)
class EarlyLine:
    config: Path
    flags: frozenset[str]
    values: dict[str, list[str]]


def read_line(
    argv: Sequence[str],
    command: tuple[str, ...],
    *,
    flags: Collection[str],
    valued: Collection[str],
    environ: Mapping[str, str],
) -> EarlyLine | None:
    """`argv` (without the program) as `command CONFIG` with only `flags` and `valued`
    options (`--opt value` or `--opt=value`), else None."""
    args = [arg for arg in argv if arg not in MODES]
    if tuple(args[: len(command)]) != command or environ.get("OSMOSIS_ENV_FILE"):
        return None
    positional: list[str] = []
    seen: set[str] = set()
    values: dict[str, list[str]] = {}
    items = iter(args[len(command) :])
    for arg in items:
        if not arg.startswith("-"):
            positional.append(arg)
            continue
        flag, has_value, inline = arg.partition("=")
        if flag in flags and not has_value:
            seen.add(flag)
        elif flag in valued:
            value = inline if has_value else next(items, None)
            if value is None:
                return None
            values.setdefault(flag, []).append(value)
        else:
            return None
    if len(positional) != 1:
        return None
    config = Path(positional[0]).resolve()
    if config.suffix != ".toml" or config.parent.parts[-2:] != ("configs", "eval"):
        return None
    return EarlyLine(config, frozenset(seen), values)
