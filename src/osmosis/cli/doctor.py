"""`osmosis doctor [--fix]`: check the workspace layout, and create what is missing.

Local only: `--fix` makes the missing directories (`rollouts/`, `configs/eval/`, `data/`)
under the git top level and touches no network.
"""

from __future__ import annotations

from pathlib import Path

import typer


def doctor(
    fix: bool = typer.Option(False, "--fix", help="Create the missing directories."),
) -> None:
    """Check that this git workspace has the required directories; --fix creates them."""
    from osmosis.cli.main import output
    from osmosis.cli.output import CLIError
    from osmosis.workspace import (
        REQUIRED_DIRS,
        WorkspaceError,
        create_missing_dirs,
        find_top_level,
        missing_dirs,
        resolve_workspace,
    )

    out = output()
    try:
        top = find_top_level(Path.cwd())
    except WorkspaceError as error:
        raise CLIError(error.message, code=error.code, hint=error.hint or None) from None
    try:
        identity: str | None = resolve_workspace(top).identity
    except WorkspaceError as error:
        # The layout can be checked without an origin; only platform commands need one.
        identity = None
        out.warn(f"{error.message}; platform commands need one: {error.hint}")
    required = [f"{name}/" for name in REQUIRED_DIRS]
    missing = [f"{name}/" for name in missing_dirs(top)]
    if missing and not fix:
        raise CLIError(
            f"the workspace at {top} is missing {', '.join(missing)}",
            code="VALIDATION",
            details={"workspace_directory": str(top), "missing": missing},
            hint="osmosis doctor --fix creates them",
        )
    created = [f"{name}/" for name in create_missing_dirs(top)] if fix else []
    message = (
        f"Created {', '.join(created)} in {top}." if created else f"Workspace layout OK at {top}."
    )
    out.operation(
        "doctor.fix" if fix else "doctor",
        message=message,
        resource={
            "workspace_directory": str(top),
            "identity": identity,
            "required": required,
            "missing": [],
            "created": created,
        },
    )
