"""`osmosis dataset`: validate dataset files, and upload and inspect a workspace's datasets.

osmosis dataset validate data/qa.jsonl       # offline
osmosis dataset upload data/qa.jsonl         # dataset "qa" of this repository's workspace
osmosis dataset download qa -o /tmp/qa.jsonl
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from osmosis.vocabulary import MAX_PAGE

if TYPE_CHECKING:
    from osmosis.cli.output import CLIError
    from osmosis.client import PlatformAPIError, PlatformClient
    from osmosis.eval.inputs.dataset import DatasetInfo
    from osmosis.wire.datasets import DatasetPublic
    from osmosis.workspace import Workspace

app = typer.Typer(help="Validate and manage datasets.", no_args_is_help=True)

DEFAULT_LIMIT = MAX_PAGE
_RULES_HINT = (
    "A dataset is a .csv, .jsonl or .parquet file with at least 4 rows and either user_prompt "
    "and ground_truth (or label) columns, or a metadata column holding a JSON object per row."
)

NameArgument = Annotated[str, typer.Argument(help="Dataset name: the uploaded file's stem.")]
VersionOption = Annotated[
    int | None,
    typer.Option("--version", min=1, help="A version number (default: the newest)."),
]


@app.command("validate")
def validate(
    file: Annotated[Path, typer.Argument(help="Dataset file: .csv, .jsonl or .parquet.")],
) -> None:
    """Check a dataset file locally, offline: format, columns, row count and every row.

    Prompt mode (no metadata column): every row needs user_prompt and ground_truth (or label).

    Metadata mode: every row needs a non-empty JSON object in its metadata column.

    Prints the rows, mode, columns and SHA-256, or each problem with its line, row and column.
    """
    from osmosis.cli.output import output

    out = output()
    info = _validated(file)
    for warning in info.warnings:
        out.warn(warning)
    data = {
        "valid": True,
        **_file_facts(file),
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


@app.command("upload")
def upload(
    file: Annotated[Path, typer.Argument(help="Dataset file: .csv, .jsonl or .parquet.")],
    overwrite: Annotated[
        bool,
        typer.Option("--overwrite", help="Upload a new version of an existing dataset."),
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Validate a file locally, then upload it as the dataset named by its stem.

    With --overwrite an existing dataset gets a new version; earlier versions are kept, and
    runs keep reading the version they started with.
    """
    from osmosis.cli.output import CLIError, output
    from osmosis.cli.workspace import git_context
    from osmosis.client import PlatformAPIError

    out = output()
    name = _check_name(file.stem, what=f"the file name {file.name}")
    with _session(name, check=False) as (workspace, client):
        # Ask about the name first: validating a large file takes minutes, and a clash (or a
        # platform that is down) would only be reported after them.
        try:
            existing: DatasetPublic | None = client.datasets.get(git=workspace.identity, name=name)
        except PlatformAPIError as error:
            if error.code != "NOT_FOUND":
                raise
            existing = None
        if existing is not None and existing.status != "error" and not overwrite:
            raise CLIError(
                f"dataset {name} already exists in workspace {workspace.identity} "
                f"(version {existing.version}, {existing.status})",
                code="CONFLICT",
                details={"existing_dataset_id": existing.id, "name": name},
                hint="pass --overwrite to upload a new version (earlier versions are kept)",
            )
        info = _validated(file)  # every problem, before anything leaves the machine
        for warning in info.warnings:
            out.warn(warning)
        if (
            existing is not None
            and overwrite
            and existing.status == "uploaded"
            and (existing.sha256, existing.format) == (info.sha256, file.suffix.lstrip("."))
        ):
            # The same bytes again: say so instead of making a version that changes nothing.
            out.operation(
                "dataset.upload",
                message=f"Dataset {name} is unchanged: version {existing.version} already holds "
                f"these bytes (sha256 {info.sha256[:12]}…); no new version.",
                resource={
                    **_row(existing),
                    "unchanged": True,
                    **git_context(workspace, client.base_url),
                },
            )
            return
        if existing is not None and overwrite:
            out.confirm(
                f"Dataset {name} exists (version {existing.version}, {existing.status}). "
                f"Upload {file} as version {existing.version + 1}?",
                yes=yes,
            )
        out.info(f"Uploading {file} ({info.size:,} bytes) as dataset {name}...")
        dataset = client.datasets.upload(
            git=workspace.identity,
            path=file,
            size=info.size,
            sha256=info.sha256,
            overwrite=overwrite,
        )
    out.operation(
        "dataset.upload",
        message=f"Uploaded {file} as dataset {name} version {dataset.version}: "
        f"{dataset.rows:,} rows, {dataset.mode} mode.",
        resource={**_row(dataset), **git_context(workspace, client.base_url)},
        next_steps=[{"command": f"osmosis dataset preview {name}"}],
    )


@app.command("list")
def list_datasets(
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=MAX_PAGE, help=f"Datasets per page (1-{MAX_PAGE}).")
    ] = DEFAULT_LIMIT,
    all_pages: Annotated[bool, typer.Option("--all", help="Every dataset, all pages.")] = False,
) -> None:
    """List this workspace's datasets with their newest version's status."""
    from osmosis.cli.output import byte_size, output, short_time
    from osmosis.cli.paging import check_limit, collect
    from osmosis.cli.workspace import git_context

    check_limit(limit, everything=all_pages)
    with _session(None) as (workspace, client):
        page = collect(
            lambda limit, offset: client.datasets.list(
                git=workspace.identity, limit=limit, offset=offset
            ),
            items=lambda page: page.datasets,
            limit=limit,
            everything=all_pages,
        )
    items = [_row(dataset) for dataset in page.items]
    output().listing(
        items,
        columns=["name", "status", "version", "format", "rows", "size_bytes", "updated_at"],
        headers={"version": "Ver", "size_bytes": "Size", "updated_at": "Updated"},
        cells={"size_bytes": byte_size, "updated_at": short_time},
        title=f"Datasets of {workspace.identity}",
        total_count=page.total_count,
        has_more=page.has_more,
        next_offset=page.next_offset,
        context=git_context(workspace, client.base_url),
    )


@app.command("info")
def info(name: NameArgument, version: VersionOption = None) -> None:
    """Show a dataset: status, file, format, rows, columns, size, SHA-256, uploader."""
    from osmosis.cli.output import output

    with _session(name) as (workspace, client):
        dataset = client.datasets.get(git=workspace.identity, name=name, version=version)
    data = _row(dataset)
    data["columns"] = dataset.columns
    data["version_count"] = dataset.version_count
    data["error"] = dataset.error
    out = output()
    if dataset.status == "error":
        data["hint"] = f"osmosis dataset logs {name}"
    out.detail(data, title=f"Dataset {name}")
    if dataset.status == "error":
        out.info(f"hint: `osmosis dataset logs {name}` shows why it failed")


@app.command("preview")
def preview(
    name: NameArgument,
    rows: Annotated[
        int, typer.Option("--rows", min=1, max=20, help="How many first rows (1-20).")
    ] = 5,
    version: VersionOption = None,
) -> None:
    """Show the first rows of an uploaded dataset."""
    from osmosis.cli.output import output

    with _session(name) as (workspace, client):
        shown = client.datasets.preview(
            git=workspace.identity, name=name, rows=rows, version=version
        )
    output().listing(
        shown.rows,
        columns=shown.columns,
        title=f"{name} (version {shown.version}): first {len(shown.rows)} of "
        f"{shown.total_rows:,} rows",
        total_count=shown.total_rows,
        has_more=len(shown.rows) < shown.total_rows,
        context={"name": name, "version": shown.version},
    )


@app.command("download")
def download(
    name: NameArgument,
    output_path: Annotated[
        str | None,
        typer.Option(
            "--output",
            "-o",
            metavar="PATH",
            help="File or directory to write (default: ./<file name>); a path ending in / is "
            "a directory, created if missing.",
        ),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace an existing file.")
    ] = False,
    version: VersionOption = None,
) -> None:
    """Download an uploaded dataset's file; its size and SHA-256 are verified."""
    from osmosis.cli.output import CLIError, output
    from osmosis.cli.workspace import git_context

    with _session(name) as (workspace, client):
        dataset = client.datasets.get(git=workspace.identity, name=name, version=version)
        # `-o dir/` names a directory even before it exists (Path() would drop the slash
        # and write a file called `dir`).
        if output_path is not None and output_path.endswith(("/", os.sep)):
            Path(output_path).mkdir(parents=True, exist_ok=True)
        target = _target(Path(output_path) if output_path else None, dataset.file_name)
        if target.exists() and not target.is_file():
            # The download is renamed over the target: a device or a FIFO would be replaced.
            raise CLIError(
                f"{target} exists and is not a regular file",
                details={"path": str(target)},
                hint="pass -o with a file or directory path",
            )
        if target.exists() and not overwrite:
            raise CLIError(
                f"{target} already exists",
                code="CONFLICT",
                details={"path": str(target)},
                hint="pass --overwrite to replace it, or -o PATH to write elsewhere",
            )
        size = client.datasets.download(
            git=workspace.identity, name=name, dest=target, version=dataset.version
        )
    output().operation(
        "dataset.download",
        message=f"Downloaded dataset {name} version {dataset.version} to {target} "
        f"({size:,} bytes, sha256 verified).",
        resource={
            **_row(dataset),
            "path": str(target),
            **git_context(workspace, client.base_url),
        },
    )


@app.command("logs")
def logs(
    name: NameArgument,
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=200, help="Lines per page (1-200).")
    ] = DEFAULT_LIMIT,
    cursor: Annotated[
        str | None, typer.Option("--cursor", help="Read on from an earlier page's cursor.")
    ] = None,
) -> None:
    """Show a dataset's processing logs, oldest first."""
    from osmosis.cli.output import output, short_time

    with _session(name) as (workspace, client):
        page = client.datasets.logs(git=workspace.identity, name=name, limit=limit, cursor=cursor)
    out = output()
    out.listing(
        [
            {
                "timestamp": line.timestamp.isoformat(timespec="seconds"),
                "version": line.version,
                "level": line.level,
                "step": line.step,
                "message": line.message,
            }
            for line in page.logs
        ],
        columns=["timestamp", "version", "level", "step", "message"],
        # At 80 columns the message needs the room more than the headers do.
        headers={"timestamp": "Time", "version": "Ver"},
        cells={"timestamp": lambda value: short_time(value, seconds=True)},
        title=f"Logs of dataset {name}",
        has_more=page.next_cursor is not None,
        total_known=False,  # cursor paging: the total is not known, the page size is not it
        context={"next_cursor": page.next_cursor},
    )
    if page.next_cursor:
        out.info(f"more: osmosis dataset logs {name} --cursor {page.next_cursor}")


# -- helpers ---------------------------------------------------------------------------------
@contextmanager
def _session(name: str | None, *, check: bool = True) -> Iterator[tuple[Workspace, PlatformClient]]:
    """This repository's workspace and a client; platform errors become `CLIError`s with the
    hint that fixes them for dataset `name` (checked first, unless `check` is False)."""
    from osmosis.cli.credentials import open_client
    from osmosis.cli.workspace import current_workspace
    from osmosis.client import PlatformAPIError

    if name is not None and check:
        _check_name(name, what="the dataset name")
    workspace = current_workspace()
    with open_client(None) as client:
        try:
            yield workspace, client
        except PlatformAPIError as error:
            raise _cli_error(error, name) from None


def _validated(file: Path) -> DatasetInfo:
    """`validate_dataset(file)`, or a VALIDATION error listing every problem found."""
    from osmosis.cli.output import CLIError
    from osmosis.eval.inputs.dataset import DatasetError, validate_dataset

    try:
        return validate_dataset(file)
    except DatasetError as error:
        details = {
            **_file_facts(file),
            "valid": False,
            "errors": [problem.format(error.path) for problem in error.problems],
            "problems": [problem.as_dict() for problem in error.problems],
            "total_problems": error.total,
            "warnings": [],
        }
        # The format rules are no help when there is no file to apply them to.
        hint = _RULES_HINT if file.is_file() else f"check the path: {file.absolute()}"
        raise CLIError(str(error), code="VALIDATION", details=details, hint=hint) from None


def _check_name(name: str, *, what: str) -> str:
    from osmosis.cli.output import CLIError
    from osmosis.wire.datasets import name_problem

    problem = name_problem(name)
    if problem is not None:
        raise CLIError(f"{what} is not usable: {problem}", details={"name": name})
    return name


def _target(output_path: Path | None, file_name: str) -> Path:
    """Where a download goes: `-o` (a file, or a directory to put the file in), else ./name.

    The file name comes from the server; only a bare, safe name is used.
    """
    from osmosis.cli.output import CLIError
    from osmosis.wire.datasets import name_problem

    if output_path is None or output_path.is_dir():
        # Only a plain, safe name is joined to a directory: never a path of the server's.
        if name_problem(file_name) is not None or Path(file_name).name != file_name:
            raise CLIError(
                f"the platform sent an unsafe file name {file_name[:200]!r}",
                code="PLATFORM_ERROR",
                hint="pass -o PATH to choose the file name yourself",
            )
        return (output_path or Path.cwd()) / file_name
    parent = output_path.parent
    if not parent.is_dir():
        why = "is not a directory" if parent.exists() else "does not exist"
        raise CLIError(
            f"cannot write {output_path}: {parent} {why}",
            details={"path": str(output_path)},
            hint=f"mkdir -p {parent}" if not parent.exists() else None,
        )
    return output_path


def _cli_error(error: PlatformAPIError, name: str | None) -> CLIError:
    """The platform's error with the hint that fixes it for dataset commands."""
    from osmosis.cli.credentials import as_cli_error

    converted = as_cli_error(error)
    if error.code == "CONFLICT" and "existing_dataset_id" in error.details:
        converted.hint = "pass --overwrite to upload a new version (earlier versions are kept)"
    elif error.code == "CONFLICT" and name and error.details.get("status") == "error":
        converted.hint = f"osmosis dataset logs {name} shows why it failed"
    elif error.code == "VALIDATION" and name and "problems" in error.details:
        converted.hint = f"osmosis dataset logs {name}"
    elif error.code == "NOT_FOUND" and name:
        converted.hint = "osmosis dataset list shows this workspace's datasets"
    elif error.code == "PAYLOAD_TOO_LARGE":
        converted.hint = "the server's limit is OSMOSIS_MAX_UPLOAD_BYTES"
    return converted


def _row(dataset: DatasetPublic) -> dict[str, Any]:
    return {
        "name": dataset.name,
        "id": dataset.id,
        "status": dataset.status,
        "version": dataset.version,
        "file_name": dataset.file_name,
        "format": dataset.format,
        "rows": dataset.rows,
        "mode": dataset.mode,
        "size_bytes": dataset.size_bytes,
        "sha256": dataset.sha256,
        "created_by": dataset.created_by,
        "updated_at": dataset.updated_at.isoformat(timespec="seconds"),
    }


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
