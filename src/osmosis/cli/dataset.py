"""`osmosis dataset`: validate dataset files (and, with a platform, upload and inspect them)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(help="Validate and manage datasets.", no_args_is_help=True)

_RULES_HINT = (
    "A dataset is a .csv, .jsonl or .parquet file with at least 4 rows and either user_prompt "
    "and ground_truth (or label) columns, or a metadata column holding a JSON object per row."
)


@app.command("validate")
def validate(
    file: Annotated[Path, typer.Argument(help="Dataset file: .csv, .jsonl or .parquet.")],
) -> None:
    """Check a dataset file locally, offline: format, columns, row count and every row.

    Prompt mode (no metadata column): every row needs user_prompt and ground_truth (or label).

    Metadata mode: every row needs a non-empty JSON object in its metadata column.

    Prints the rows, mode, columns and SHA-256, or each problem with its line, row and column.
    """
    # Imported here so `osmosis --help` does not pay for the dataset machinery.
    from osmosis.cli.main import output
    from osmosis.cli.output import CLIError
    from osmosis.eval.dataset import DatasetError, validate_dataset

    out = output()
    facts = _file_facts(file)
    try:
        info = validate_dataset(file)
    except DatasetError as error:
        details = {
            **facts,
            "valid": False,
            "errors": [problem.format(error.path) for problem in error.problems],
            "problems": [problem.as_dict() for problem in error.problems],
            "total_problems": error.total,
            "warnings": [],
        }
        raise CLIError(str(error), code="VALIDATION", details=details, hint=_RULES_HINT) from None
    for warning in info.warnings:
        out.warn(warning)
    data = {
        "valid": True,
        **facts,
        "dataset_name": info.name,
        "format": info.format,
        "mode": info.mode,
        "rows": info.rows,
        "columns": list(info.columns),
        "sha256": info.sha256,
        "errors": [],
        "warnings": list(info.warnings),
    }
    out.detail(data, title=f"{file} is a valid dataset")


def _file_facts(file: Path) -> dict[str, Any]:
    """What the file is, as the reference's `validate` result names it."""
    try:
        size: int | None = file.stat().st_size
    except OSError:
        size = None
    return {
        "file": str(file),
        "file_name": file.name,
        "extension": file.suffix.lower().lstrip("."),
        "file_size": size,
    }
