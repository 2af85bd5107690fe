"""`osmosis doctor [PATH] [--fix]`: check the workspace layout, and create what is missing.

It checks what osmosis-ai's doctor checks, so a workspace that passes here passes there:
`rollouts/`, `configs/training/`, `configs/eval/` and `data/` under the git top level, and
the agent notes `AGENTS.md`, `CLAUDE.md` and `configs/AGENTS.md`. It also warns when git
would commit `.osmosis/` (run results, dataset cache) or a virtual environment.

Local only: `--fix` creates the missing directories (each with a `.gitkeep`) and writes the
missing notes, never overwriting a file, and without touching the network; a missing
`.gitignore` is written, an existing one only gets a warning.
"""

from __future__ import annotations

from pathlib import Path

import typer

# Paths git should ignore in a workspace, and a sample of each to ask `git check-ignore`.
_IGNORED = {".osmosis/": ".osmosis/evals/x", "virtual environments": "rollouts/x/.venv/bin/python"}


def doctor(
    path: Path = typer.Argument(
        Path("."), help="A path inside the workspace (default: the current directory)."
    ),
    fix: bool = typer.Option(
        False, "--fix", help="Create what is missing; existing files are never overwritten."
    ),
) -> None:
    """Check this workspace's layout as osmosis-ai does; --fix creates what is missing."""
    from osmosis.cli.output import CLIError, output
    from osmosis.templates import AGENT_FILES, WORKSPACE_DIRS, workspace_files, write_files
    from osmosis.workspace import WorkspaceError, find_top_level, resolve_workspace

    out = output()
    if not path.exists():
        raise CLIError(f"{path} does not exist", details={"path": str(path)})
    start = path if path.is_dir() else path.parent
    try:
        top = find_top_level(start).resolve()
    except WorkspaceError as error:
        raise CLIError(
            error.message,
            code=error.code,
            hint="osmosis init PATH creates a workspace (a git repository with the layout)",
        ) from None
    try:
        identity: str | None = resolve_workspace(top).identity
    except WorkspaceError as error:
        # The layout can be checked without an origin; only platform commands need one.
        identity = None
        out.warn(f"{error.message}; platform commands need one: {error.hint}")
    required = [f"{name}/" for name in WORKSPACE_DIRS] + list(AGENT_FILES)
    created: list[str] = []
    if fix:
        skeleton = workspace_files()
        wanted = {
            f"{name}/.gitkeep": skeleton[f"{name}/.gitkeep"]
            for name in WORKSPACE_DIRS
            if not (top / name).is_dir()
        }
        wanted.update({name: skeleton[name] for name in (*AGENT_FILES, ".gitignore")})
        written = write_files(top, wanted)
        created = [
            name[: -len(".gitkeep")] if name.endswith("/.gitkeep") else name
            for name in written.created
        ]
    missing = _missing(top, WORKSPACE_DIRS, AGENT_FILES)
    warnings = [
        f"git does not ignore {what} here: add `{pattern}` to .gitignore"
        for what, pattern in _not_ignored(top).items()
    ]
    sandbox = _sandbox()
    if sandbox.get("warning"):
        warnings.append(str(sandbox["warning"]))
    for warning in warnings:
        out.warn(warning)
    resource = {
        "workspace_directory": str(top),
        "identity": identity,
        "required": required,
        "missing": missing,
        "created": created,
        "warnings": warnings,
        "valid": not missing,
        "sandbox": sandbox,
    }
    if missing:
        raise CLIError(
            f"the workspace at {top} is missing {', '.join(missing)}",
            code="VALIDATION",
            details=resource,
            hint="osmosis doctor --fix creates them (existing files are never overwritten)",
        )
    message = (
        f"Created {', '.join(created)} in {top}." if created else f"Workspace layout OK at {top}."
    )
    out.operation("doctor.fix" if fix else "doctor", message=message, resource=resource)


def _sandbox() -> dict[str, object]:
    """Whether this machine's platform would sandbox workspace code (OSMOSIS_SANDBOX)."""
    import os

    from osmosis.eval.sites.sandbox.support import sandbox_report
    from osmosis.platform import Settings, SettingsError

    try:
        settings = Settings.from_env(os.environ)
    except SettingsError as error:
        return {"warning": str(error)}
    return sandbox_report(settings.sandbox, settings.sandbox_bwrap, executor=settings.executor)


def _missing(top: Path, directories: tuple[str, ...], notes: tuple[str, ...]) -> list[str]:
    absent = [f"{name}/" for name in directories if not (top / name).is_dir()]
    return absent + [name for name in notes if not (top / name).exists()]


def _not_ignored(top: Path) -> dict[str, str]:
    """{what: the .gitignore line that would fix it} for each path git would commit."""
    import subprocess

    patterns = {".osmosis/": ".osmosis/", "virtual environments": ".venv/"}
    found: dict[str, str] = {}
    for what, sample in _IGNORED.items():
        # --no-index: ask the ignore rules, whether or not such a path is tracked or exists.
        result = subprocess.run(
            ["git", "-C", str(top), "check-ignore", "-q", "--no-index", sample],
            capture_output=True,
            check=False,
        )
        if result.returncode == 1:  # 0 ignored, 1 not ignored, 128 git failed
            found[what] = patterns[what]
    return found
