"""`osmosis init [PATH]`: start a workspace that `osmosis doctor` and osmosis-ai accept.

    osmosis init my-workspace && cd my-workspace && osmosis eval run configs/eval/add.toml

Writes the required directories (`rollouts/`, `configs/eval/`, `configs/training/`, `data/`),
a `.gitignore` that keeps `.osmosis/` and virtual environments out of git, `AGENTS.md`,
`CLAUDE.md`, `configs/AGENTS.md`, and the `add` example (one model call on the local model,
so the first `eval run` needs no key). A directory that is not in a git repository yet gets
`git init`. Nothing that exists is overwritten: such files are listed as kept.
"""

from __future__ import annotations

from pathlib import Path

import typer


def init_command(
    path: Path = typer.Argument(
        Path("."), help="Directory of the new workspace (created if missing; default: here)."
    ),
    example: bool = typer.Option(
        True, "--example/--no-example", help="Add the add example (rollout, config, data)."
    ),
) -> None:
    """Create a workspace: the directory layout, .gitignore, AGENTS.md and a working example."""
    import subprocess

    from osmosis.cli.output import CLIError, output
    from osmosis.templates import EXAMPLE, TEMPLATES, template_files, workspace_files, write_files
    from osmosis.workspace import WorkspaceError, find_top_level

    out = output()
    target = path.expanduser().resolve()
    if target.exists() and not target.is_dir():
        raise CLIError(f"{target} exists and is not a directory", details={"path": str(target)})
    target.mkdir(parents=True, exist_ok=True)
    git_initialized = False
    try:
        top: Path | None = find_top_level(target).resolve()
    except WorkspaceError:
        top = None
    if top is None:
        done = subprocess.run(
            ["git", "init", "-q", "-b", "main", str(target)], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise CLIError(
                f"git init {target} failed: {done.stderr.strip()}",
                hint="a workspace is a git repository; install git, or `git init` it yourself",
            )
        git_initialized = True
    elif top != target:
        # The platform and osmosis-ai both take the repository's top level as the workspace.
        raise CLIError(
            f"{target} is inside the git repository at {top}; a workspace is the top level "
            "of its repository",
            details={"path": str(target), "repository": str(top)},
            hint=f"osmosis init {top}   (or choose a directory outside that repository)",
        )
    content = workspace_files()
    if example:
        content.update(template_files(EXAMPLE))
    written = write_files(target, content)
    for kept in written.kept:
        out.warn(f"kept the existing {kept} (not overwritten)")
    steps = ["osmosis doctor"]
    if example:
        steps += list(TEMPLATES[EXAMPLE].next_steps)
    steps += ["git add -A && git commit -m 'osmosis workspace'", "git remote add origin <url>"]
    where = "" if target == Path.cwd().resolve() else f"cd {path} && "
    out.operation(
        "init",
        message=f"Created an osmosis workspace in {target} ({len(written.created)} files"
        + (", git init" if git_initialized else "")
        + "). Next: "
        + where
        + "  ·  ".join(steps),
        resource={
            "workspace_directory": str(target),
            "git_initialized": git_initialized,
            "created": written.created,
            "unchanged": written.unchanged,
            "kept": written.kept,
            "example": EXAMPLE if example else None,
        },
        next_steps=[{"command": step} for step in steps],
    )
