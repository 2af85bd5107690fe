"""Secrets for a local run: read `--secrets-file` (dotenv) and resolve `[secrets].required`.

    values = resolve_secrets(["JUDGE_KEY"], file_values=read_dotenv(path), environ=os.environ)

Values never come from argv; they are injected into the rollout process and the bridge and
redacted everywhere they could be written. A value shorter than 8 characters is redacted only
where it stands alone as a word (`osmosis.eval.results.redact`), so `resolve_secrets` returns a
warning naming each such secret (`ResolvedSecrets.warnings`) for the run log.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from osmosis.eval.results.redact import SHORT_SECRET_LENGTH

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SecretsError(Exception):
    """A secrets file that does not parse, or required secrets that are missing."""

    def __init__(self, message: str, *, problems: Sequence[str] = (), missing: Sequence[str] = ()):
        super().__init__(message)
        self.problems = list(problems)
        self.missing = list(missing)


@dataclass(frozen=True)
class ResolvedSecrets:
    """Secret values by name, where each came from (`file` or `environment`), and a warning
    per secret too short to be redacted inside words (`short_secret_warnings`)."""

    values: Mapping[str, str] = field(repr=False)  # never in a log line or traceback
    sources: Mapping[str, str]
    warnings: tuple[str, ...] = ()


def short_secret_warnings(values: Mapping[str, str]) -> list[str]:
    """One warning per secret whose value is shorter than 8 characters, naming it (never its
    value): such a value is redacted only where it stands alone as a word.

        short_secret_warnings({"OPENAI_API_KEY": "x"})
        # ['secret OPENAI_API_KEY is only 1 character long: ...']
    """
    warnings = []
    for name, value in values.items():
        if value and not value.isspace() and len(value) < SHORT_SECRET_LENGTH:
            length = f"{len(value)} character{'s' if len(value) != 1 else ''}"
            warnings.append(
                f"secret {name} is only {length} long, so it is redacted only where it "
                "stands alone as a word, not inside longer words"
            )
    return warnings


def parse_dotenv(text: str, *, source: str = "<secrets>") -> dict[str, str]:
    """`NAME=value` lines; `export` prefix, `#` comments, one pair of quotes stripped.

    Every malformed line is reported at once, with its line number.
    """
    values: dict[str, str] = {}
    problems: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        name, sep, value = line.partition("=")
        name = name.strip()
        if not sep or not _NAME.match(name):
            problems.append(f"{source}:{number}: expected NAME=value, got {raw.strip()[:40]!r}")
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[name] = value
    if problems:
        raise SecretsError(f"cannot read secrets file {source}", problems=problems)
    return values


def read_dotenv(path: Path) -> dict[str, str]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SecretsError(f"cannot read secrets file {path}: {exc.strerror}") from None
    return parse_dotenv(text, source=str(path))


def resolve_secrets(
    required: Sequence[str], *, file_values: Mapping[str, str], environ: Mapping[str, str]
) -> ResolvedSecrets:
    """First hit wins: the secrets file, then a non-empty environment variable."""
    values: dict[str, str] = {}
    sources: dict[str, str] = {}
    missing: list[str] = []
    for name in required:
        if name in file_values:
            values[name], sources[name] = file_values[name], "file"
        elif environ.get(name):
            values[name], sources[name] = environ[name], "environment"
        else:
            missing.append(name)
    if missing:
        raise SecretsError(
            f"missing required secret(s): {', '.join(missing)}; put them in a file passed with "
            "--secrets-file (NAME=value lines) or export them in the environment",
            missing=missing,
        )
    return ResolvedSecrets(
        values=values, sources=sources, warnings=tuple(short_secret_warnings(values))
    )
