"""`osmosis eval list|logs|stop|retry`: evaluation runs on the platform.

A thin layer over `osmosis.client`: each command resolves what it needs locally, calls the
platform, and hands the answer to `Output`. `eval submit`, `eval info` and `eval download`
have modules of their own.

    osmosis eval list --all
    osmosis eval logs smoke-brave-otter-1a2b --limit 200
    osmosis eval retry smoke-brave-otter-1a2b --secrets-file .secrets

Only typer and this package's light helpers load at module level; the rest inside the
command bodies.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

import typer

from osmosis.cli.eval.context import envelope_context, optional_workspace, run_url, when
from osmosis.cli.eval.options import SecretsFileOption, YesOption
from osmosis.vocabulary import MAX_PAGE

MAX_LOG_PAGE = 200  # what the logs route serves at most per page


# -- list ------------------------------------------------------------------------------------
def _row(run: Any, *, with_workspace: bool = False) -> dict[str, Any]:
    reward = run.summary.avg_reward
    row = {
        "name": run.name,
        "status": run.status,
        "rollout": run.rollout,
        "reward": "-" if reward is None else f"{reward:.2f}",
        "submitted": when(run.created_at),
        "submitted_by": run.creator_name or run.creator_email,
    }
    if with_workspace:
        row["workspace"] = run.workspace
    return row


def list_command(
    limit: int = typer.Option(
        MAX_PAGE, "--limit", min=1, max=MAX_PAGE, help=f"Runs to show (1-{MAX_PAGE})."
    ),
    all_runs: bool = typer.Option(
        False, "--all", help="Every run of every workspace you belong to (all pages)."
    ),
) -> None:
    """List evaluation runs of this workspace, newest first."""
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.output import CLIError, output
    from osmosis.cli.paging import collect
    from osmosis.cli.workspace import current_workspace

    out = output()
    if all_runs and limit != MAX_PAGE:
        raise CLIError("--all and --limit cannot be combined", details={"limit": limit})
    workspace = optional_workspace() if all_runs else current_workspace()
    with platform_errors(), open_client(None) as client:
        git = None if all_runs or workspace is None else workspace.identity
        page = collect(
            lambda limit, offset: client.runs.list(
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


# -- logs ------------------------------------------------------------------------------------
def log_row(entry: Any) -> dict[str, Any]:
    return {
        "time": when(entry.timestamp),
        "level": entry.level,
        "step": entry.step,
        "message": entry.message,
    }


def logs_command(
    name: str = typer.Argument(..., help="Run name or id."),
    limit: int = typer.Option(50, "--limit", min=1, max=200, help="Entries per page (1-200)."),
    cursor: str | None = typer.Option(None, "--cursor", help="next_cursor of the previous page."),
    follow: bool = typer.Option(
        False,
        "--follow",
        "-f",
        help="Print entries as they are written until the run ends (with --json: one JSON "
        "object per line). Ctrl-C stops following, not the run.",
    ),
) -> None:
    """Show a run's log entries, oldest first, one page at a time."""
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.output import output

    out = output()
    if follow:
        _follow_logs(out, name, cursor=cursor)
        return
    with platform_errors(), open_client(None) as client:
        page = client.runs.logs(name, limit=limit, cursor=cursor)
    items = (
        [entry.model_dump(mode="json") for entry in page.logs]
        if out.mode.value == "json"
        else [log_row(entry) for entry in page.logs]
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


def _follow_logs(out: Any, name: str, *, cursor: str | None, poll_s: float = 1.0) -> None:
    """Print every entry from `cursor` on as it is written; return once the run has ended and
    everything it wrote is printed."""
    import json
    import time

    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.output import CLIError
    from osmosis.vocabulary import TERMINAL_RUN_STATUSES

    def show(entry: Any) -> None:
        if out.mode.value == "json":
            typer.echo(json.dumps(entry.model_dump(mode="json")))
        else:
            row = log_row(entry)
            step = f" [{row['step']}]" if row["step"] else ""
            typer.echo(f"{row['time']} {row['level']:<7}{step} {row['message']}")

    try:
        with platform_errors(), open_client(None) as client:
            ended = False
            while True:
                page = client.runs.logs(name, limit=MAX_LOG_PAGE, cursor=cursor)
                for entry in page.logs:
                    show(entry)
                cursor = page.next_cursor or page.end_cursor or cursor
                if page.next_cursor:
                    continue  # more is written already: no wait
                if ended:
                    return  # read to the end after the run had ended: that is all of it
                # The status is read before the last read, so nothing written is missed.
                ended = client.runs.get(name).eval_run.status in TERMINAL_RUN_STATUSES
                if not ended:
                    time.sleep(poll_s)
    except KeyboardInterrupt:
        raise CLIError(
            f"stopped following the logs of {name}; the run goes on",
            code="INTERRUPTED",
            details={"name": name, "cursor": cursor},
            hint=f"osmosis eval logs {name} --follow --cursor {cursor}" if cursor else None,
            exit_code=130,
        ) from None


# -- stop and retry --------------------------------------------------------------------------
def stop_command(
    name: str = typer.Argument(..., help="Run name or id."),
    yes: bool = YesOption,
) -> None:
    """Stop a pending or running evaluation run (asks first; default No)."""
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.output import CLIError, output
    from osmosis.vocabulary import TERMINAL_RUN_STATUSES

    out = output()
    with platform_errors(), open_client(None) as client:
        run = client.runs.get(name).eval_run
        if run.status in TERMINAL_RUN_STATUSES:
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
        stopped = client.runs.stop(run.id)
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
    max_tokens_total: int | None = typer.Option(
        None, "--max-tokens-total", min=1, help="Budget from now on: tokens of all model calls."
    ),
    max_cost_usd: float | None = typer.Option(
        None, "--max-cost-usd", min=0.000001, help="Budget from now on: USD of all model calls."
    ),
    max_model_calls: int | None = typer.Option(
        None, "--max-model-calls", min=1, help="Budget from now on: model calls forwarded."
    ),
) -> None:
    """Re-run the failed and skipped samples of a finished, failed or stopped run; resume a
    halted one (raise its budget with --max-tokens-total, --max-cost-usd, --max-model-calls)."""
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.eval.run_secrets import read_secrets_file, resolve_run_secrets, secret_prompt
    from osmosis.cli.output import CLIError, output
    from osmosis.vocabulary import TERMINAL_RUN_STATUSES

    out = output()
    file_values = read_secrets_file(secrets_file)
    with platform_errors(), open_client(None) as client:
        detail = client.runs.get(name)
        run = detail.eval_run
        if run.status not in TERMINAL_RUN_STATUSES:
            raise CLIError(
                f"evaluation run {run.name} is still {run.status}; only a finished, failed, "
                "stopped or halted run can be retried",
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
        retry = functools.partial(
            client.runs.retry,
            run.id,
            max_tokens_total=max_tokens_total,
            max_cost_usd=max_cost_usd,
            max_model_calls=max_model_calls,
        )
        try:
            retried = retry(secrets=secrets)
        except Exception as error:
            names = _secret_names(error)
            if not names or set(names) <= set(secrets):
                raise
            secrets |= resolve([n for n in names if n not in secrets])
            retried = retry(secrets=secrets)
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
    for line in retried.budget_clamped:  # a raised limit above a ceiling gets the ceiling
        message += f"\n{line[0].upper()}{line[1:]}."
    out.operation(
        "eval.retry",
        message=message,
        resource={
            "id": retried.id,
            "name": retried.name,
            "status": retried.status,
            "retryable_samples": count,
            "budget_clamped": retried.budget_clamped,
        },
        next_steps=[{"action": "eval_info", "name": retried.name}],
    )


def _secret_names(error: Exception) -> list[str]:
    details = getattr(error, "details", None) or {}
    names = details.get("run_secret_names") or details.get("missing") or []
    return [str(n) for n in names] if isinstance(names, list) else []
