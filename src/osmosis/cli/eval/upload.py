"""`osmosis eval upload NAME|DIR` (and `eval run --upload`): a finished local run becomes a run
of its workspace on the platform.

The run directory is checked here first (`osmosis.eval.results.run_export`, the same checks the
server runs again), then the upload is opened: the server answers with the files it still
needs, so an interrupted upload sends only the rest when run again, and a run uploaded before
is answered at once. A run changed since its upload (`--retry-failed`) is refused unless
`--replace`, which replaces the platform run's results under the same name.

A directory the official osmosis-ai `eval run` wrote uploads too, as the official `eval upload`
sends it (`osmosis.eval.results.official_layout`); the server computes its metrics.

    osmosis eval upload try1            # .osmosis/evals/try1/
    osmosis eval upload ./out/try1 --replace

Typer only at module level; everything else is imported inside the command bodies.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from osmosis.cli.output import Output


def upload_command(
    run: str = typer.Argument(..., help="Local run name (under the runs root) or directory."),
    output_root: Path | None = typer.Option(
        None, "--output", "-o", help="Local runs root (default <workspace>/.osmosis/evals)."
    ),
    replace: bool = typer.Option(
        False,
        "--replace",
        help="Replace the results of an earlier upload of this run (after --retry-failed).",
    ),
) -> None:
    """Upload a finished local run to the platform as a run of its workspace."""
    from osmosis.cli.eval.context import runs_root
    from osmosis.cli.eval.local_runs import find_local_run
    from osmosis.cli.output import CLIError, output

    out = output()
    path = find_local_run(run, root=runs_root(output_root))
    if path is None:
        raise CLIError(
            f"no local run {run!r}: not a run directory, and not a run name under "
            f"{runs_root(output_root)}",
            code="NOT_FOUND",
            details={"run": run},
            hint="osmosis eval upload NAME (a directory of .osmosis/evals) or a path",
        )
    resource = upload_run(out, path, replace=replace)
    name = resource["eval_run_name"]
    sent, kept = resource["uploaded_files"], resource["skipped_files"]
    message = (
        f"Uploaded {path.name} as evaluation run {name}: {sent} file(s) sent, {kept} already "
        f"on the platform. Next: osmosis eval info {name}"
    )
    out.operation(
        "eval.upload",
        message=message,
        resource=resource,
        next_steps=[
            {"action": "eval_info", "name": name},
            {"action": "open_url", "url": resource["platform_url"]},
        ],
    )


def upload_run(out: Output, path: Path, *, replace: bool) -> dict[str, Any]:
    """Check `path`, upload what the platform does not hold yet, finalize; the resource."""
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.eval.context import run_url
    from osmosis.cli.eval.local_runs import read_local_run
    from osmosis.cli.output import CLIError
    from osmosis.cli.workspace import current_workspace
    from osmosis.eval.inputs.dataset_formats import sha256_file
    from osmosis.eval.results import official_layout
    from osmosis.eval.results.run_export import export_files, verify_run_dir
    from osmosis.wire.runs import ImportFileIn, ImportRunIn, RunImportCreate

    official = official_layout.is_official_run_dir(path)
    problems = official_layout.check(path) if official else verify_run_dir(path)
    if problems:
        raise CLIError(
            f"{path} cannot be uploaded: {'; '.join(problems[:3])}"
            + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""),
            details={"problems": problems, "run_dir": str(path)},
            hint="only a complete, finished run uploads: resume it with the same --name first",
        )
    local = read_local_run(path)
    # The run belongs to the workspace it was made in: the repository around its directory.
    workspace = current_workspace(path)
    files = official_layout.upload_files(path) if official else export_files(path)
    by_path = {f.path: f for f in files}
    inputs = local.inputs
    description = (
        official_layout.upload_run(path)
        if official
        else {
            "name": local.name,
            "model_path": inputs.get("model_path"),
            "dataset": inputs.get("dataset"),
            "evaluation_config": {
                "n": inputs.get("n"),
                "pass_threshold": inputs.get("pass_threshold"),
            },
        }
    )
    body = RunImportCreate(
        local_run_id=str(local.manifest["local_run_id"]),
        manifest_digest=sha256_file(path / "manifest.json"),
        run=ImportRunIn.model_validate(description),
        files=[ImportFileIn(path=f.path, size=f.size, sha256=f.sha256) for f in files],
        reimport=replace,
    )
    with platform_errors(), open_client(None) as client:
        session = client.imports.start(git=workspace.identity, body=body)
        pending = [f.path for f in session.files if f.state == "pending"]
        if session.status == "uploading":
            out.info(
                f"Uploading {len(pending)} of {len(files)} file(s) "
                f"({len(files) - len(pending)} already on the platform)"
            )
            for done, relative in enumerate(pending, start=1):
                item = by_path[relative]
                client.imports.upload_file(
                    session.session_id, relative, path / relative, size=item.size
                )
                if done % 100 == 0:
                    out.info(f"  {done}/{len(pending)} files sent")
            session = client.imports.finalize(session.session_id)
        base_url = client.base_url
    assert session.eval_run_name is not None  # a finalized session names its run
    return {
        "session_id": session.session_id,
        "eval_run_id": session.eval_run_id,
        "eval_run_name": session.eval_run_name,
        "status": session.status,
        "expected_files": session.expected_files,
        "uploaded_files": len(pending) if pending else 0,
        "skipped_files": session.expected_files - len(pending),
        "local_run_id": body.local_run_id,
        "output_path": str(path),
        "platform_url": run_url(base_url, session.eval_run_name),
    }
