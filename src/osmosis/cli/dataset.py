"""`osmosis dataset`: validate dataset files (and, with a platform, upload and inspect them)."""

from __future__ import annotations

import typer

app = typer.Typer(help="Validate and manage datasets.", no_args_is_help=True)
