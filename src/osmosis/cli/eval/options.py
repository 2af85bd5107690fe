"""Options spelled alike across the eval commands that take them (`submit`, `retry`, `stop`)."""

from __future__ import annotations

import typer

SecretsFileOption = typer.Option(
    None,
    "--secrets-file",
    help="dotenv file (NAME=value lines) with values for [secrets].required; '-' reads stdin. "
    "Values are sent for this run only, never stored.",
)
YesOption = typer.Option(False, "--yes", "-y", help="Skip the confirmation.")
