"""Options spelled alike across the eval commands that take them (`submit`, `retry`, `stop`)."""

from __future__ import annotations

from collections.abc import Sequence

import typer

SecretsFileOption = typer.Option(
    None,
    "--secrets-file",
    help="dotenv file (NAME=value lines) with values for [secrets].required; '-' reads stdin. "
    "Values are sent for this run only, never stored.",
)
YesOption = typer.Option(False, "--yes", "-y", help="Skip the confirmation.")


def model_problems(models: Sequence[str] | None) -> list[str]:
    """What is wrong with the `--model` flags of `eval run` and `eval submit`: each must name
    a model, and once (each model makes one run, named after it)."""
    problems = []
    if models is not None and any(not m.strip() for m in models):
        problems.append("--model must name a model, e.g. openai/gpt-5-mini")
    if models is not None and len(set(models)) != len(models):
        problems.append("each --model once: the same model twice would make the same run twice")
    return problems
