"""`osmosis dev`: developer utilities (the scripted model server)."""

from __future__ import annotations

import typer

app = typer.Typer(help="Developer utilities.", no_args_is_help=True)
