"""`osmosis rollout init NAME`: scaffold a rollout and its configs in this workspace.

    osmosis rollout init my-rollout      # rollouts/my-rollout/{main.py,README.md},
                                         # configs/{eval,training}/my-rollout.toml,
                                         # data/my-rollout.jsonl (five sample rows)

As in osmosis-ai: the name is lowercase letters, digits and hyphens; existing paths are a
CONFLICT listing each one, and `--force` replaces them. The scaffold works as written (one
model call, an exact-match grader), so `eval run` can follow at once. A sample data file that
exists is kept even with `--force`: it is the user's data.
"""

from __future__ import annotations

import typer

app = typer.Typer(help="Create rollouts.", no_args_is_help=True)


@app.command("init")
def init_command(
    name: str = typer.Argument(..., help="Rollout name: lowercase letters, digits, hyphens."),
    force: bool = typer.Option(False, "--force", "-f", help="Replace existing rollout files."),
) -> None:
    """Create rollouts/NAME with a working main.py, and its eval and training configs."""
    import shutil

    from osmosis.cli.output import CLIError, output
    from osmosis.cli.template import workspace_root
    from osmosis.templates import rollout_files, rollout_name_problem, write_files

    problem = rollout_name_problem(name)
    if problem:
        raise CLIError(problem, details={"name": name})
    top = workspace_root()
    content = rollout_files(name)
    owned = [f"rollouts/{name}", f"configs/eval/{name}.toml", f"configs/training/{name}.toml"]
    existing = [path for path in owned if (top / path).exists() or (top / path).is_symlink()]
    if existing and not force:
        raise CLIError(
            f"refusing to overwrite existing rollout paths: {', '.join(existing)}",
            code="CONFLICT",
            details={"existing": existing},
            hint=f"osmosis rollout init {name} --force replaces them",
        )
    rollout_dir = top / "rollouts" / name
    if force and rollout_dir.is_dir() and not rollout_dir.is_symlink():
        shutil.rmtree(rollout_dir)  # --force replaces the directory, stale files included
    written = write_files(top, content, replace={path for path in content if path in owned[1:]})
    steps = [
        f"edit rollouts/{name}/main.py",
        f"osmosis eval run configs/eval/{name}.toml",
    ]
    output().operation(
        "rollout.init",
        message=f"Created rollout {name} in {top}: "
        + ", ".join(written.created + written.replaced)
        + ". Next: "
        + "  ·  ".join(steps),
        resource={
            "name": name,
            "workspace_directory": str(top),
            "created": written.created,
            "replaced": written.replaced,
            "kept": written.kept,
        },
        next_steps=[{"command": step} for step in steps],
    )
