"""`osmosis template list|apply NAME`: add a worked example to this workspace.

    osmosis template list
    osmosis template apply add-tools     # rollouts/add-tools/, configs/eval/add-tools.toml,
                                         # data/add.jsonl (shared by the add templates)

Templates ship with osmosis (package data), so this works offline. As in osmosis-ai, the
rollout's paths must not exist unless `--force`; a shared file (the dataset) is written when
absent and otherwise kept.
"""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(help="Worked examples to start from.", no_args_is_help=True)


def workspace_root(start: Path | None = None) -> Path:
    """The git top level around `start` (default: here), or WORKSPACE_REQUIRED."""
    from osmosis.cli.output import CLIError
    from osmosis.workspace import WorkspaceError, find_top_level

    try:
        return find_top_level(start or Path.cwd()).resolve()
    except WorkspaceError as error:
        raise CLIError(
            error.message,
            code=error.code,
            hint="osmosis init PATH creates a workspace (a git repository with the layout)",
        ) from None


@app.command("list")
def list_command() -> None:
    """List the templates `osmosis template apply` can add."""
    from osmosis.cli.output import output
    from osmosis.templates import TEMPLATES

    output().listing(
        [{"name": t.name, "description": t.description} for t in TEMPLATES.values()],
        columns=["name", "description"],
        title="Templates",
    )


@app.command("apply")
def apply_command(
    name: str = typer.Argument(..., help="Template name (see `osmosis template list`)."),
    force: bool = typer.Option(False, "--force", "-f", help="Replace existing template files."),
) -> None:
    """Copy a template's rollout, config and data into this workspace."""
    from osmosis.cli.output import CLIError, output
    from osmosis.templates import TEMPLATES, template_files, write_files

    template = TEMPLATES.get(name)
    if template is None:
        raise CLIError(
            f"no template named {name!r}; templates: {', '.join(TEMPLATES)}",
            code="NOT_FOUND",
            details={"name": name, "templates": list(TEMPLATES)},
            hint="osmosis template list",
        )
    top = workspace_root()
    content = template_files(name)
    own = [path for path in content if path not in template.shared]
    # A file that already holds exactly what the template writes (after `osmosis init`, which
    # writes the `add` template) is no conflict; only a differing one is refused.
    existing = [path for path in own if _differs(top / path, content[path])]
    if existing and not force:
        raise CLIError(
            f"refusing to overwrite existing paths of template {name}: {', '.join(existing)}",
            code="CONFLICT",
            details={"existing": existing},
            hint=f"osmosis template apply {name} --force replaces them",
        )
    written = write_files(top, content, replace=set(own))
    out = output()
    for kept in written.kept:
        out.warn(f"kept the existing {kept} (shared by templates; not overwritten)")
    steps = list(template.next_steps)
    out.operation(
        "template.apply",
        message=f"Applied template {name} in {top}: "
        + ", ".join(written.created + written.replaced + written.unchanged)
        + ". Next: "
        + "  ·  ".join(steps),
        resource={
            "name": name,
            "workspace_directory": str(top),
            "created": written.created,
            "replaced": written.replaced,
            "unchanged": written.unchanged,
            "kept": written.kept,
        },
        next_steps=[{"command": step} for step in steps],
    )


def _differs(target: Path, text: str) -> bool:
    if target.is_symlink():
        return True
    if not target.exists():
        return False
    try:
        return not target.is_file() or target.read_text(encoding="utf-8") != text
    except (OSError, UnicodeDecodeError):
        return True
