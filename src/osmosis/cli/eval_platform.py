"""`osmosis eval list|info|logs|stop|retry|download`: evaluation runs on the platform.

A thin layer over `osmosis.client`: each command resolves what it needs locally, calls the
platform, and hands the answer to `Output`. `eval submit` lives in `eval_submit`.

    osmosis eval submit configs/eval/smoke.toml --secrets-file .secrets
    osmosis eval info smoke-brave-otter-1a2b
    osmosis eval download smoke-brave-otter-1a2b --type all

Typer only at module level; everything else is imported inside the command bodies.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from osmosis.cli.output import Output
    from osmosis.client import PlatformClient
    from osmosis.wire.runs import EvalRunDetail
    from osmosis.workspace import Workspace

SCOPE_LABELS = {"user": "Personal", "workspace": "Workspace", "run": "Run"}

SecretsFileOption = typer.Option(
    None,
    "--secrets-file",
    help="dotenv file (NAME=value lines) with values for [secrets].required; '-' reads stdin. "
    "Values are sent for this run only, never stored.",
)
YesOption = typer.Option(False, "--yes", "-y", help="Skip the confirmation.")


# -- shared helpers --------------------------------------------------------------------------
def _aware(value: Any) -> Any:
    """A naive timestamp from the platform is UTC."""
    from datetime import UTC

    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def _when(value: Any) -> str | None:
    """A timestamp as local `YYYY-MM-DD HH:MM:SS`, or None."""
    if value is None:
        return None
    return str(_aware(value).astimezone().strftime("%Y-%m-%d %H:%M:%S"))


def _duration(run: Any) -> str | None:
    """The run's duration; while it runs, the time since it started."""
    from datetime import UTC, datetime

    ms = run.duration_ms
    if ms is None and run.started_at is not None:
        end = _aware(run.completed_at) if run.completed_at else datetime.now(UTC)
        ms = (end - _aware(run.started_at)).total_seconds() * 1000
    if ms is None:
        return None
    seconds = round(ms / 1000)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes}m {seconds}s"
    return f"{minutes}m {seconds}s" if minutes else f"{ms / 1000:.1f}s"


def run_url(base_url: str, name: str) -> str:
    """The run's page on the platform's dashboard."""
    from urllib.parse import quote

    return f"{base_url.rstrip('/')}/runs/{quote(name, safe='')}"


def optional_workspace() -> Workspace | None:
    from osmosis.workspace import WorkspaceError, resolve_workspace

    try:
        return resolve_workspace(Path.cwd())
    except WorkspaceError:
        return None


def envelope_context(workspace: Workspace | None, client: PlatformClient) -> dict[str, Any]:
    from osmosis.cli.workspace import git_context

    if workspace is None:
        return {"platform_url": client.base_url}
    return git_context(workspace, client.base_url)


def _runs_root(output_root: Path | None) -> Path:
    """Where run directories go: -o ROOT itself (as for `eval run -o`), else `.osmosis/evals`
    under the workspace's top level, else under the cwd."""
    if output_root is not None:
        return output_root
    workspace = optional_workspace()
    base = workspace.directory if workspace is not None else Path.cwd()
    return base / ".osmosis" / "evals"


# -- list ------------------------------------------------------------------------------------
def _row(run: Any, *, with_workspace: bool = False) -> dict[str, Any]:
    reward = run.summary.avg_reward
    row = {
        "name": run.name,
        "status": run.status,
        "rollout": run.rollout,
        "reward": "-" if reward is None else f"{reward:.2f}",
        "submitted": _when(run.created_at),
        "submitted_by": run.creator_name or run.creator_email,
    }
    if with_workspace:
        row["workspace"] = run.workspace
    return row


def list_command(
    limit: int = typer.Option(50, "--limit", min=1, max=50, help="Runs to show (1-50)."),
    all_runs: bool = typer.Option(
        False, "--all", help="Every run of every workspace you belong to (all pages)."
    ),
) -> None:
    """List evaluation runs of this workspace, newest first."""
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.main import output
    from osmosis.cli.output import CLIError
    from osmosis.cli.paging import collect
    from osmosis.cli.workspace import current_workspace

    out = output()
    if all_runs and limit != 50:
        raise CLIError("--all and --limit cannot be combined", details={"limit": limit})
    workspace = optional_workspace() if all_runs else current_workspace()
    with platform_errors(), open_client(None) as client:
        git = None if all_runs or workspace is None else workspace.identity
        page = collect(
            lambda limit, offset: client.list_eval_runs(
                git=git, limit=limit, offset=offset, all_workspaces=all_runs
            ),
            items=lambda page: page.eval_runs,
            limit=limit,
            everything=all_runs,
        )
        context = envelope_context(workspace, client)
        base_url = client.base_url
    runs = page.items
    columns = ["name", "status", "rollout", "reward", "submitted", "submitted_by"]
    if all_runs:
        columns.insert(1, "workspace")
    items = (
        [{**run.model_dump(mode="json"), "url": run_url(base_url, run.name)} for run in runs]
        if out.mode.value == "json"
        else [_row(run, with_workspace=all_runs) for run in runs]
    )
    out.listing(
        items,
        columns=columns,
        title="Evaluation runs",
        total_count=page.total_count,
        has_more=page.has_more,
        next_offset=page.next_offset,
        context=context,
    )
    if page.has_more and out.mode.value == "rich":
        out.info(f"Showing {len(runs)} of {page.total_count}; --all lists every run.")


# -- info ------------------------------------------------------------------------------------
def _config_line(config: Mapping[str, Any]) -> str:
    """`limit=…, n=…, …` in the reference's order, then the other keys."""
    from osmosis.eval.inputs.config_checks import EVALUATION_KEYS

    keys = [k for k in EVALUATION_KEYS if k in config]
    keys += sorted(k for k in config if k not in EVALUATION_KEYS and k != "model_path")
    return ", ".join(f"{k}={config[k]}" for k in keys if config[k] is not None) or "-"


def _results(detail: EvalRunDetail) -> dict[str, Any]:
    """The results the Results section shows (and JSON `results`)."""
    summary = detail.summary
    metrics = (detail.metrics or {}).get("summary") or {}
    return {
        "graded": summary.graded,
        "passed": summary.passed,
        "failed": summary.failed,
        "skipped": summary.skipped,
        "pass_rate": summary.pass_rate,
        "avg_reward": summary.avg_reward,
        "pass_threshold": summary.pass_threshold,
        "reward_stats": metrics.get("reward_stats"),
        "pass_at_k": metrics.get("pass_at_k"),
        "pass_hat_k": metrics.get("pass_hat_k"),
        "confidence_intervals": metrics.get("confidence_intervals"),
        "tokens_used": summary.total_tokens,
        "cost_usd": detail.cost_usd,
        "errors_by_type": detail.errors_by_type,
    }


def _dataset_stats(detail: EvalRunDetail) -> dict[str, Any]:
    """The dataset as the run used it: its rows, the rows selected, attempts per row."""
    n = detail.config.get("n") or 1
    total = detail.summary.progress.total
    return {
        "name": detail.dataset.name,
        "version": detail.dataset.version,
        "format": detail.dataset.format,
        "sha256": detail.dataset.sha256,
        "rows": detail.summary.dataset_rows or detail.dataset.rows,
        "selected_rows": total // n if total else None,
        "runs_per_row": n,
    }


def _dataset_line(detail: EvalRunDetail) -> str:
    """`qa (version 2, jsonl, 10 of 120 rows)`; rows selected once the worker planned it."""
    stats = _dataset_stats(detail)
    parts = [f"version {stats['version']}", stats["format"]]
    if stats["rows"] is not None:
        selected = stats["selected_rows"]
        parts.append(
            f"{selected:,} of {stats['rows']:,} rows" if selected else f"{stats['rows']:,} rows"
        )
    return f"{stats['name']} ({', '.join(p for p in parts if p)})"


def _results_rows(results: Mapping[str, Any]) -> dict[str, Any]:
    rows: dict[str, Any] = {
        "Samples": f"{results['graded']} graded, {results['passed']} passed, "
        f"{results['failed']} failed, {results['skipped']} skipped",
        "Pass Threshold": f"{results['pass_threshold']:g}",
    }
    stats = results.get("reward_stats")
    if stats:
        rows["Reward Stats"] = ", ".join(
            f"{key} {stats[key]:.4f}" for key in ("mean", "std", "min", "median", "max")
        )
    if results.get("pass_at_k"):
        rows["Pass@k"] = ", ".join(f"{p['k']}: {p['value']:.1%}" for p in results["pass_at_k"])
    if results.get("pass_hat_k"):
        # pass^k: every one of k attempts passes (consistency), next to pass@k (any of k).
        rows["Pass^k"] = ", ".join(f"{p['k']}: {p['value']:.1%}" for p in results["pass_hat_k"])
    intervals = results.get("confidence_intervals") or {}
    shown = []
    for key, label, fmt in (
        ("pass_rate", "pass rate", ".1%"),
        ("mean_reward", "mean reward", ".4f"),
    ):
        ci = intervals.get(key)
        if ci:
            shown.append(
                f"{label} {ci['low']:{fmt}} to {ci['high']:{fmt}} ({ci.get('level', 0.95):.0%})"
            )
    if shown:
        rows["Confidence"] = "; ".join(shown)
    rows["Tokens"] = f"{results['tokens_used']:,}"
    if results.get("cost_usd") is not None:
        rows["Cost"] = f"${results['cost_usd']:.4f}"
    if results.get("errors_by_type"):
        rows["Errors"] = ", ".join(f"{k}: {v}" for k, v in results["errors_by_type"].items())
    return rows


def _save_metrics(
    client: PlatformClient, detail: EvalRunDetail, root: Path
) -> tuple[str | None, str | None]:
    """Fetch metrics.json into the run's download directory: (path, warning)."""
    from osmosis.cli.eval_download import plan_transfer, run_dir_name, transfer
    from osmosis.client import PlatformAPIError

    run = detail.eval_run
    if run.status == "pending":
        return None, "metrics are not available while the run is pending"
    run_dir = root / run_dir_name(run.name, run.id)
    if (run_dir / "manifest.json").is_file():
        # A local run of the same name (uploaded as this run): its own metrics stay.
        return None, f"{run_dir} is a local run directory; its metrics.json is left as it is"
    try:
        manifest = client.eval_run_files(run.id, types=["metrics"])
    except PlatformAPIError as error:
        return None, f"could not list the run's files: {error.message}"
    plan = plan_transfer(manifest.files, run_dir, selected_types=("metrics",))
    if not plan.files:
        return None, "the run has no metrics.json yet"
    result = transfer(plan, _fetcher(client, run.id))
    if result.failed:
        return None, f"could not save metrics.json: {result.failed[0]['error']}"
    return str(run_dir / "metrics.json"), None


def info_command(
    name: str = typer.Argument(..., help="Run name or id."),
    output_root: Path | None = typer.Option(
        None,
        "--output",
        "-o",
        help="Save metrics.json under ROOT/<run>/ (default .osmosis/evals/<run>/).",
    ),
) -> None:
    """Show a run: status, progress, configuration, results and its latest log lines.

    NAME is looked up as a run directory (a path holding manifest.json) first, then on the
    platform (name or id), then, when the platform does not know it or cannot be reached, as
    a local run name under the runs root."""
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.local_runs import find_local_run, read_local_run, show_local_info
    from osmosis.cli.main import output
    from osmosis.cli.output import CLIError
    from osmosis.wire.runs import TERMINAL_STATUSES

    out = output()
    save = out.mode.value == "rich" or output_root is not None
    if Path(name).expanduser().joinpath("manifest.json").is_file():
        show_local_info(out, read_local_run(Path(name).expanduser().resolve()))
        return
    try:
        with platform_errors(), open_client(None) as client:
            detail = client.get_eval_run(name)
            output_path, save_warning = (
                _save_metrics(client, detail, _runs_root(output_root)) if save else (None, None)
            )
            url = run_url(client.base_url, detail.eval_run.name)
    except CLIError as error:
        local = find_local_run(name, root=_runs_root(output_root))
        if local is None or error.code not in ("NOT_FOUND", "NETWORK", "AUTH_REQUIRED"):
            raise
        show_local_info(out, read_local_run(local))
        return
    run, summary = detail.eval_run, detail.summary
    results = _results(detail)
    metrics_error = (
        None
        if detail.metrics_available
        else (
            "metrics are not available while the run is pending"
            if run.status == "pending"
            else "no metrics yet"
        )
    )
    if out.mode.value == "json":
        data = detail.model_dump(mode="json")
        data.update(
            results=results,
            model=run.model,
            rollout=run.rollout,
            dataset_df_stats=_dataset_stats(detail),
            metrics_error=metrics_error,
            output_path=output_path,
            save_warning=save_warning,
            url=url,
        )
        out.detail(data)
        return
    progress = summary.progress
    main = {
        "Name": run.name,
        "Status": run.status,
        "Progress": "Waiting to start..."
        if run.status == "pending"
        else f"{progress.completed} / {progress.total} {progress.unit}"
        + (f" ({progress.completed / progress.total:.0%})" if progress.total else ""),
        "Duration": _duration(run),
        "Pass Rate": None if summary.pass_rate is None else f"{summary.pass_rate:.1%}",
        "Tokens Used": f"{summary.total_tokens:,}",
        "Submitted": _when(run.created_at),
        "Submitted By": run.creator_name or run.creator_email,
        "Started": _when(run.started_at),
        "Completed": _when(run.completed_at),
        "Dataset": _dataset_line(detail),
        "Model": run.model,
        "Rollout": run.rollout,
    }
    if run.error:
        main["Error"] = run.error
    out.detail(main, title=f"Evaluation run {run.name}")
    scopes = detail.resolved_secret_scopes
    out.detail(
        {
            "Entrypoint": detail.entrypoint,
            "Config": _config_line(detail.config),
            "Branch": detail.branch,
            "Commit": detail.commit_sha[:7],
            "Secrets": ", ".join(
                f"{k} ({SCOPE_LABELS.get(v, v).lower()})" for k, v in scopes.items()
            )
            or "-",
            "Environment Variables": ", ".join(f"{k}={v}" for k, v in detail.env_config.items())
            or "-",
            # How many rollout servers served it (metrics.json, once the engine wrote it).
            "Replicas": ((detail.metrics or {}).get("eval_run") or {}).get("replicas"),
        },
        title="Configuration",
    )
    if run.status != "pending":
        out.detail(_results_rows(results), title="Results")
    if detail.recent_logs and out.mode.value == "rich":
        out.listing(
            [_log_row(entry) for entry in detail.recent_logs],
            columns=["time", "level", "step", "message"],
            title="Recent logs",
        )
    out.info(f"View: {url}")
    if run.status == "failed":
        out.info(f"See why: osmosis eval logs {run.name}")
    if run.status not in TERMINAL_STATUSES:
        out.info(f"Stop it: osmosis eval stop {run.name}")
    if output_path:
        out.info(f"Saved metrics to {output_path}")
    if save_warning:
        out.warn(save_warning)


# -- logs ------------------------------------------------------------------------------------
def _log_row(entry: Any) -> dict[str, Any]:
    return {
        "time": _when(entry.timestamp),
        "level": entry.level,
        "step": entry.step,
        "message": entry.message,
    }


def logs_command(
    name: str = typer.Argument(..., help="Run name or id."),
    limit: int = typer.Option(50, "--limit", min=1, max=200, help="Entries per page (1-200)."),
    cursor: str | None = typer.Option(None, "--cursor", help="next_cursor of the previous page."),
) -> None:
    """Show a run's log entries, oldest first, one page at a time."""
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.main import output

    out = output()
    with platform_errors(), open_client(None) as client:
        page = client.eval_run_logs(name, limit=limit, cursor=cursor)
    items = (
        [entry.model_dump(mode="json") for entry in page.logs]
        if out.mode.value == "json"
        else [_log_row(entry) for entry in page.logs]
    )
    out.listing(
        items,
        columns=["time", "level", "step", "message"],
        title=f"Logs of {name}",
        has_more=page.next_cursor is not None,
        total_known=False,  # cursor paging: the total is not known, the page size is not it
        context={"next_cursor": page.next_cursor},
    )
    if page.next_cursor and out.mode.value == "rich":
        out.info(f"More: osmosis eval logs {name} --cursor {page.next_cursor}")


# -- stop and retry --------------------------------------------------------------------------
def stop_command(
    name: str = typer.Argument(..., help="Run name or id."),
    yes: bool = YesOption,
) -> None:
    """Stop a pending or running evaluation run (asks first; default No)."""
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.main import output
    from osmosis.cli.output import CLIError
    from osmosis.wire.runs import TERMINAL_STATUSES

    out = output()
    with platform_errors(), open_client(None) as client:
        run = client.get_eval_run(name).eval_run
        if run.status in TERMINAL_STATUSES:
            raise CLIError(
                f"evaluation run {run.name} is already {run.status}",
                code="CONFLICT",
                details={"name": run.name, "status": run.status},
            )
        progress = run.summary.progress
        out.confirm(
            f"Stop evaluation run {run.name} ({run.status}, {progress.completed} / "
            f"{progress.total} samples)?",
            yes=yes,
            default=False,
            details={"name": run.name, "status": run.status},
        )
        stopped = client.stop_eval_run(run.id)
    out.operation(
        "eval.stop",
        message=stopped.message or f'Evaluation run "{stopped.name}" stopped.',
        resource={"id": stopped.id, "name": stopped.name, "status": stopped.status},
        next_steps=[{"action": "eval_info", "name": stopped.name}],
    )


def retry_command(
    name: str = typer.Argument(..., help="Run name or id."),
    yes: bool = YesOption,
    secrets_file: str | None = SecretsFileOption,
) -> None:
    """Re-run the failed and skipped samples of a finished, failed or stopped run."""
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.eval_submit import read_secrets_file, resolve_run_secrets, secret_prompt
    from osmosis.cli.main import output
    from osmosis.cli.output import CLIError
    from osmosis.wire.runs import TERMINAL_STATUSES

    out = output()
    file_values = read_secrets_file(secrets_file)
    with platform_errors(), open_client(None) as client:
        detail = client.get_eval_run(name)
        run = detail.eval_run
        if run.status not in TERMINAL_STATUSES:
            raise CLIError(
                f"evaluation run {run.name} is still {run.status}; only a finished, failed or "
                "stopped run can be retried",
                code="CONFLICT",
                details={"name": run.name, "status": run.status},
                hint=f"osmosis eval stop {run.name}",
            )
        # Values given at submit were for that run only: they must be supplied again.
        again = [k for k, scope in detail.resolved_secret_scopes.items() if scope == "run"]

        def resolve(names: Sequence[str]) -> dict[str, str]:
            # A stored secret does not stand in for a run-only value: the run was given one.
            provided, _ = resolve_run_secrets(
                names,
                file_values=file_values,
                environ=os.environ,
                stored=lambda: {},
                prompt=secret_prompt(out),
            )
            return provided

        secrets = resolve(again)
        out.confirm(
            f"Retry the failed and skipped samples of {run.name} ({run.status})?",
            yes=yes,
            default=True,
            details={"name": run.name, "status": run.status, "secrets": sorted(secrets)},
        )
        try:
            retried = client.retry_eval_run(run.id, secrets=secrets)
        except Exception as error:
            names = _secret_names(error)
            if not names or set(names) <= set(secrets):
                raise
            secrets |= resolve([n for n in names if n not in secrets])
            retried = client.retry_eval_run(run.id, secrets=secrets)
    count = retried.retryable_samples
    # A stopped (or failed) run also resumes the attempts it never ran.
    unrun = max(0, count - detail.summary.failed - detail.summary.skipped)
    if not count:
        message = f"Retrying {retried.name} from the start."
    elif unrun:
        message = (
            f"Retrying {count} samples in {retried.name}: {count - unrun} failed or skipped, "
            f"{unrun} not run yet."
        )
    else:
        message = f"Retrying {count} failed and skipped samples in {retried.name}."
    out.operation(
        "eval.retry",
        message=message,
        resource={
            "id": retried.id,
            "name": retried.name,
            "status": retried.status,
            "retryable_samples": count,
        },
        next_steps=[{"action": "eval_info", "name": retried.name}],
    )


def _secret_names(error: Exception) -> list[str]:
    details = getattr(error, "details", None) or {}
    names = details.get("run_secret_names") or details.get("missing") or []
    return [str(n) for n in names] if isinstance(names, list) else []


# -- download --------------------------------------------------------------------------------
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
    from osmosis.cli.eval_download import CONFIRM_BYTES, parse_types, plan_transfer, run_dir_name
    from osmosis.cli.main import output
    from osmosis.cli.output import CLIError
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
    root = _runs_root(output_root)
    with platform_errors(), open_client(None) as client:
        run = client.get_eval_run(name).eval_run
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
        manifest = client.eval_run_files(run.id, types=selected, rows=rows)
        plan = plan_transfer(manifest.files, run_dir, selected_types=selected, overwrite=overwrite)
        remaining = plan.remaining_bytes
        out.info(
            f"Download plan: {len(plan.to_fetch)} files, {_size(remaining)} "
            f"({len(plan.skipped)} already up to date) -> {run_dir}"
        )
        if remaining > CONFIRM_BYTES:
            out.confirm(
                f"Download {len(plan.to_fetch)} files ({_size(remaining)}) to {run_dir}?",
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
            f"Downloaded {len(result.downloaded)} files ({_size(result.bytes_downloaded)}), "
            f"{len(plan.skipped)} already up to date: {run_dir}"
        )
    if out.mode.value != "json":
        for failure in result.failed:
            out.warn(f"{failure['path']}: {failure['error']}")
    out.operation("eval.download", message=message, status=status, resource=resource)
    if result.failed:
        raise typer.Exit(1)


def _fetcher(client: PlatformClient, run_id: str) -> Callable[[str, Path], int]:
    """The transfer engine's fetch: one file of the run through the platform client."""

    def fetch(path: str, dest: Path) -> int:
        from osmosis.cli.eval_download import FetchError
        from osmosis.client import PlatformAPIError

        try:
            return client.download_eval_run_file(run_id, path, dest)
        except PlatformAPIError as error:
            # A network fault, a 5xx or a 429 may pass; any other 4xx will not.
            status = error.status_code
            raise FetchError(error.message, retryable=status in (0, 429) or status >= 500) from None

    return fetch


def _run_transfer(out: Output, client: PlatformClient, run_id: str, plan: Any) -> Any:
    """The transfer, with a byte progress bar in an interactive rich terminal."""
    from osmosis.cli.eval_download import transfer

    fetch = _fetcher(client, run_id)
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


def _size(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"


def register(app: typer.Typer) -> None:
    """Add the platform commands to the `eval` group."""
    from osmosis.cli.eval_submit import submit_command

    app.command("submit")(submit_command)
    app.command("list")(list_command)
    app.command("info")(info_command)
    app.command("logs")(logs_command)
    app.command("stop")(stop_command)
    app.command("retry")(retry_command)
    app.command("download")(download_command)
