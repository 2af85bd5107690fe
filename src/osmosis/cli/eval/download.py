"""`osmosis eval download NAME`: a platform run's files into the fixed local layout.

    osmosis eval download smoke-brave-otter-1a2b --type all
    osmosis eval download smoke-brave-otter-1a2b --rows 3,7 -o runs/

The transfer itself (verified, resumable, a few files at once) is `transfer.py`'s; this module
asks, shows progress, and reports. Light at module level: typer and this package's helpers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from osmosis.cli.eval.context import envelope_context, optional_workspace, runs_root
from osmosis.vocabulary import format_bytes

if TYPE_CHECKING:
    from osmosis.cli.output import Output
    from osmosis.client import PlatformClient


def download_command(
    name: str = typer.Argument(..., help="Run name or id."),
    types: str | None = typer.Option(
        None,
        "--type",
        help="metrics, trajectories, artifacts, logs (comma-separated) or all; replaces the "
        "default metrics,trajectories.",
    ),
    rows: str | None = typer.Option(
        None, "--rows", help="Rows of trajectories/artifacts, e.g. '3,7,10-20' (every run)."
    ),
    output_root: Path | None = typer.Option(
        None, "--output", "-o", help="Write under ROOT/<run>/ (default .osmosis/evals/<run>/)."
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Fetch every file again, even those already up to date."
    ),
    yes: bool = typer.Option(False, "--yes", "-y", help="Skip the size confirmation."),
) -> None:
    """Download a run's metrics, trajectories, artifacts and logs into the fixed layout."""
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.eval.transfer import CONFIRM_BYTES, parse_types, plan_transfer, run_dir_name
    from osmosis.cli.output import CLIError, output
    from osmosis.eval.inputs.dataset import RowSpecError, parse_row_spec

    out = output()
    try:
        selected = parse_types(types)
    except ValueError as error:
        raise CLIError(str(error), details={"type": types}) from None
    if rows is not None:
        try:
            parse_row_spec(rows)
        except RowSpecError as error:
            raise CLIError(
                f"--rows: {error}", details={"rows": rows}, hint="--rows 3,7,10-20"
            ) from None
    root = runs_root(output_root)
    with platform_errors(), open_client(None) as client:
        run = client.runs.get(name).eval_run
        if run.status == "pending":
            raise CLIError(
                f"evaluation run {run.name} is pending: nothing to download yet",
                code="CONFLICT",
                details={"name": run.name, "status": run.status},
                hint=f"osmosis eval info {run.name}",
            )
        run_dir = root / run_dir_name(run.name, run.id)
        if (run_dir / "manifest.json").is_file():
            # The local run this platform run was uploaded from: never mix files into it.
            raise CLIError(
                f"{run_dir} is a local run directory (the run {run.name} was uploaded from "
                "it); downloading there would overwrite its files",
                code="CONFLICT",
                details={"name": run.name, "output_path": str(run_dir)},
                hint=f"osmosis eval download {run.name} -o <another directory>",
            )
        manifest = client.runs.files(run.id, types=selected, rows=rows)
        plan = plan_transfer(manifest.files, run_dir, selected_types=selected, overwrite=overwrite)
        remaining = plan.remaining_bytes
        out.info(
            f"Download plan: {len(plan.to_fetch)} files, {format_bytes(remaining)} "
            f"({len(plan.skipped)} already up to date) -> {run_dir}"
        )
        if remaining > CONFIRM_BYTES:
            out.confirm(
                f"Download {len(plan.to_fetch)} files ({format_bytes(remaining)}) to {run_dir}?",
                yes=yes,
                default=False,
                details={
                    "files": len(plan.to_fetch),
                    "bytes": remaining,
                    "output_path": str(run_dir),
                },
            )
        result = _run_transfer(out, client, run.id, plan)
        context = envelope_context(optional_workspace(), client)
    status = "partial" if result.failed else "success"
    resource = {
        "eval_run": {"id": run.id, "name": run.name},
        "status": status,
        "selected_types": list(selected),
        "files_downloaded": len(result.downloaded),
        "files_skipped": len(plan.skipped),
        "files_failed": result.failed,
        "bytes_downloaded": result.bytes_downloaded,
        "total_files": len(plan.files),
        "total_bytes": plan.total_bytes,
        "breakdown": plan.breakdown(),
        "manifest_totals": manifest.totals.model_dump(mode="json"),
        "output_path": str(run_dir),
        "rows": rows,
        **context,
    }
    if result.failed:
        message = (
            f"Downloaded {len(result.downloaded)} of {len(plan.to_fetch) + len(plan.rejected)} "
            f"files to {run_dir}; {len(result.failed)} failed. Run the same command again to "
            "fetch only what is missing."
        )
    else:
        message = (
            f"Downloaded {len(result.downloaded)} files ({format_bytes(result.bytes_downloaded)}), "
            f"{len(plan.skipped)} already up to date: {run_dir}"
        )
    if out.mode.value != "json":
        for failure in result.failed:
            out.warn(f"{failure['path']}: {failure['error']}")
    out.operation("eval.download", message=message, status=status, resource=resource)
    if result.failed:
        raise typer.Exit(1)


def fetcher(client: PlatformClient, run_id: str) -> Callable[[str, Path], int]:
    """The transfer engine's fetch: one file of the run through the platform client."""

    def fetch(path: str, dest: Path) -> int:
        from osmosis.cli.eval.transfer import FetchError
        from osmosis.client import PlatformAPIError

        try:
            return client.runs.download_file(run_id, path, dest)
        except PlatformAPIError as error:
            # A network fault, a 5xx or a 429 may pass; any other 4xx will not.
            status = error.status_code
            raise FetchError(error.message, retryable=status in (0, 429) or status >= 500) from None

    return fetch


def _run_transfer(out: Output, client: PlatformClient, run_id: str, plan: Any) -> Any:
    """The transfer, with a byte progress bar in an interactive rich terminal."""
    from osmosis.cli.eval.transfer import transfer

    fetch = fetcher(client, run_id)
    if not plan.to_fetch or out.mode.value != "rich" or not out.console.is_terminal:
        return transfer(plan, fetch)
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    with Progress(
        TextColumn("[bold]download"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=out.console,
    ) as progress:
        task = progress.add_task("download", total=plan.remaining_bytes)
        return transfer(plan, fetch, on_file=lambda item, ok: progress.advance(task, item.size))
