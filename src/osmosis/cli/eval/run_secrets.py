"""Where a platform run's secrets come from, for `eval submit` and `eval retry`.

First hit wins: the `--secrets-file`, a non-empty environment variable, a secret stored on the
platform (then nothing is sent), a hidden prompt. Values found are sent for the one run only.

    provided, choices = resolve_run_secrets(["OPENAI_API_KEY"], file_values={}, environ=os.environ,
                                            stored=lambda: {}, prompt=None)

Typer only at module level; everything else is imported where it is used.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from osmosis.cli.output import Output
    from osmosis.client import PlatformClient


@dataclass(frozen=True)
class SecretChoice:
    """Where one required secret comes from: `scope` as the summary labels it, `source`."""

    name: str
    scope: str
    source: str


def read_secrets_file(value: str | None) -> dict[str, str]:
    """`--secrets-file PATH|-` as a mapping (empty when not given)."""
    from osmosis.cli.output import CLIError
    from osmosis.eval.inputs.secrets import SecretsError, parse_dotenv, read_dotenv

    if value is None:
        return {}
    try:
        if value == "-":
            return parse_dotenv(sys.stdin.read(), source="<stdin>")
        return read_dotenv(Path(value))
    except SecretsError as error:
        raise CLIError(
            f"--secrets-file: {error}",
            details={"file": value, "problems": error.problems},
            hint="one NAME=value per line; '#' starts a comment",
        ) from None


def _stored_label(scopes: set[str]) -> str:
    if {"user", "workspace"} <= scopes:
        return "Personal (overrides workspace)"
    return "Personal" if "user" in scopes else "Workspace"


def resolve_run_secrets(
    required: Sequence[str],
    *,
    file_values: Mapping[str, str],
    environ: Mapping[str, str],
    stored: Callable[[], Mapping[str, set[str]]],
    prompt: Callable[[str], str] | None,
) -> tuple[dict[str, str], list[SecretChoice]]:
    """Values to send and where each required secret comes from; first hit wins:
    the secrets file, a non-empty environment variable, a secret stored on the platform (then
    nothing is sent), a hidden prompt (only when `prompt` is given).

    Every name still unresolved is reported at once, as INTERACTIVE_REQUIRED.
    """
    from osmosis.cli.output import CLIError

    provided: dict[str, str] = {}
    choices: dict[str, SecretChoice] = {}
    for name in required:
        if file_values.get(name):
            provided[name] = file_values[name]
            choices[name] = SecretChoice(name, "Run", "secrets file")
        elif environ.get(name):
            provided[name] = environ[name]
            choices[name] = SecretChoice(name, "Run", "environment")
    if len(choices) < len(required):
        on_platform = stored()
        for name in required:
            if name not in choices and on_platform.get(name):
                choices[name] = SecretChoice(name, _stored_label(on_platform[name]), "platform")
    if prompt is not None:
        for name in required:
            if name not in choices:
                value = prompt(name)
                if value:
                    provided[name] = value
                    choices[name] = SecretChoice(name, "Run", "prompt")
    missing = [name for name in required if name not in choices]
    if missing:
        raise CLIError(
            f"required secret(s) not provided: {', '.join(missing)} (not in --secrets-file, "
            "the environment, or stored on the platform)",
            code="INTERACTIVE_REQUIRED",
            details={"missing": missing, "flags": ["--secrets-file"]},
            hint=f"pass --secrets-file FILE with NAME=value lines, export them, or store them: "
            f"osmosis secret set {missing[0]} (personal; add --scope workspace to share it)",
        )
    return provided, [choices[name] for name in required]


def stored_secrets(client: PlatformClient, git: str) -> Callable[[], Mapping[str, set[str]]]:
    def load() -> Mapping[str, set[str]]:
        from osmosis.cli.credentials import platform_errors
        from osmosis.cli.paging import collect
        from osmosis.vocabulary import MAX_PAGE

        scopes: dict[str, set[str]] = {}
        with platform_errors():
            stored = collect(
                lambda limit, offset: client.secrets.list(git=git, limit=limit, offset=offset),
                items=lambda page: page.secrets,
                limit=MAX_PAGE,
                everything=True,
            )
        for secret in stored.items:
            scopes.setdefault(secret.name, set()).add(secret.scope)
        return scopes

    return load


def secret_prompt(out: Output) -> Callable[[str], str] | None:
    if not out.interactive:
        return None
    return lambda name: str(
        typer.prompt(
            f"Value for {name} (used for this run only)",
            hide_input=True,
            default="",
            show_default=False,
        )
    )
