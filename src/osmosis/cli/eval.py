"""`osmosis eval`: evaluate a rollout locally (`run`) or on the platform (`submit`, ...)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from osmosis.cli.output import Output
    from osmosis.cli.progress import EvalProgress
    from osmosis.eval.local_plan import LocalRunPlan
    from osmosis.eval.local_run import LocalRunReport

app = typer.Typer(help="Evaluate rollouts.", no_args_is_help=True)


@app.command("run")
def run_command(
    config: Path = typer.Argument(..., help="Eval config under configs/eval/ (TOML)."),
    name: str | None = typer.Option(None, "--name", help="Run name; re-using a name resumes it."),
    output_root: Path | None = typer.Option(
        None, "--output", "-o", help="Run output root (default <workspace>/.osmosis/evals)."
    ),
    dataset_file: Path | None = typer.Option(
        None, "--dataset-file", help="Local CSV/JSONL/Parquet file instead of data/<dataset>."
    ),
    secrets_file: Path | None = typer.Option(
        None, "--secrets-file", help="dotenv file (NAME=value) with the [secrets] values."
    ),
    rows: str | None = typer.Option(
        None, "--rows", help="Source rows to run, e.g. '3,7,10-20' (overrides limit)."
    ),
    fresh: bool = typer.Option(False, "--fresh", help="Archive this name's results; start clean."),
    retry_failed: bool = typer.Option(
        False, "--retry-failed", help="Also re-run failed and skipped attempts."
    ),
    max_in_flight: int | None = typer.Option(
        None, "--max-in-flight", help="Concurrency override (attempts in flight at once)."
    ),
    yes: bool = typer.Option(False, "--yes", "-y", help="Skip the confirmation."),
    verbose: bool = typer.Option(False, "--verbose", help="Stream log lines to the terminal."),
) -> None:
    """Run an evaluation on this machine and write results under .osmosis/evals/<name>/."""
    import asyncio

    from osmosis.cli.main import output
    from osmosis.cli.output import CLIError
    from osmosis.eval.local_plan import LocalRunOptions, PlanError, plan_local_run
    from osmosis.eval.local_run import RunFailed, run_local
    from osmosis.eval.run_dir import ResumeRefused, RunLocked

    out = output()
    if max_in_flight is not None and max_in_flight < 1:
        raise CLIError(
            "--max-in-flight must be at least 1", details={"max_in_flight": max_in_flight}
        )
    options = LocalRunOptions(
        name=name,
        output=output_root,
        dataset_file=dataset_file,
        secrets_file=secrets_file,
        rows=rows,
        fresh=fresh,
        retry_failed=retry_failed,
        max_in_flight=max_in_flight,
    )
    try:
        plan = plan_local_run(config, options)
    except PlanError as error:
        raise CLIError(str(error), details=error.details, hint=error.hint or None) from None
    _show_plan(out, plan)
    _confirm(out, plan, yes)
    reporter = _reporter(out, verbose)
    try:
        report = asyncio.run(run_local(plan, reporter))
    except (ResumeRefused, RunLocked) as error:
        raise CLIError(
            str(error), code="CONFLICT" if isinstance(error, RunLocked) else "VALIDATION"
        ) from None
    except RunFailed as error:
        raise CLIError(str(error), code=error.code, hint=error.hint or None) from None
    finally:
        reporter.close()
    _show_report(out, plan, report)
    if report.status != "finished":
        raise typer.Exit(1)


# -- presentation ---------------------------------------------------------------------------
def _show_plan(out: Output, plan: LocalRunPlan) -> None:
    if out.mode.value != "rich":
        return
    experiment = plan.config.experiment
    rows = f"{len(plan.selection)} of {plan.selection.total_rows}"
    if plan.selection.method == "sample":
        rows += f" (random 10 % sample, seed {plan.selection.seed})"
    out.detail(
        {
            "Rollout": experiment.rollout,
            "Entrypoint": experiment.entrypoint,
            "Model": experiment.model_path,
            "Dataset": f"{plan.dataset.name} ({plan.dataset_source})",
            "Rows": rows,
            "Runs Per Row": plan.n,
            "Work Items": plan.total_work_items,
            "Output": str(plan.run_dir),
        },
        title="osmosis eval run",
    )


def _confirm(out: Output, plan: LocalRunPlan, yes: bool) -> None:
    from osmosis.cli.output import CLIError

    if yes:
        return
    prompt = (
        f"{plan.total_work_items} rollouts x model {plan.config.experiment.model_path} — continue?"
    )
    if not out.interactive:
        raise CLIError(
            "Use --yes to confirm in non-interactive mode.",
            code="INTERACTIVE_REQUIRED",
            details={"prompt": prompt},
        )
    if not typer.confirm(prompt, default=True):
        raise typer.Abort()


def _show_report(out: Output, plan: LocalRunPlan, report: LocalRunReport) -> None:
    metrics = report.metrics
    resource = {
        "run_name": report.run_name,
        "local_run_id": report.local_run_id,
        "output_path": str(report.output_path),
        "dataset_source": plan.dataset_source,
        "total_work_items": report.total_work_items,
        "dispatched": report.dispatched,
        "succeeded": metrics.get("total_samples", 0)
        - metrics.get("failed", 0)
        - metrics.get("skipped", 0),
        "failed": metrics.get("failed", 0),
        "skipped": metrics.get("skipped", 0),
        "resumed": report.resumed,
        "halted": report.halted,
        "duration_ms": report.duration_ms,
        "metrics": metrics,
        "failed_rows": report.failed_rows,
    }
    status = "success" if report.status == "finished" else "partial"
    if out.mode.value == "json":
        out.operation("eval.run", message=_headline(report), status=status, resource=resource)
        return
    if report.failed_rows and out.mode.value == "rich":
        out.info("Failed rows")
        for row in report.failed_rows[:20]:
            out.info(
                f"  row {row['row_index']} run {row['run_index']}: "
                f"error_type={row['error_type']} -> {row['rollout_dir']}"
            )
        if len(report.failed_rows) > 20:
            out.info(f"  … and {len(report.failed_rows) - 20} more (see index.jsonl)")
    out.detail(results_table(report), title="Results")
    out.info(_headline(report))


def results_table(report: LocalRunReport) -> dict[str, Any]:
    """The rows of the results table (also what `--plain` prints)."""
    m = report.metrics
    scored = m.get("completed_samples", 0)
    table: dict[str, Any] = {
        "Run": report.run_name,
        "Work Items": (
            f"{m.get('total_samples', 0)}/{report.total_work_items} complete · "
            f"{m.get('total_samples', 0) - m.get('failed', 0) - m.get('skipped', 0)} ok · "
            f"{m.get('failed', 0)} failed · {m.get('skipped', 0)} skipped"
        ),
        "Pass Rate": (
            f"{m.get('pass_rate', 0.0):.1%} ({m.get('passed', 0)}/{scored} scored, "
            f"threshold {m.get('pass_threshold', 1.0):g})" + _interval(m, "pass_rate")
        ),
    }
    stats = m.get("reward_stats")
    if stats:
        table["Reward"] = (
            f"mean {stats['mean']:.3f}, median {stats['median']:.3f}, "
            f"min {stats['min']:.3f}, max {stats['max']:.3f}" + _interval(m, "mean_reward")
        )
    if m.get("pass_at_k"):
        table["pass@k"] = ", ".join(f"@{p['k']} {p['value']:.3f}" for p in m["pass_at_k"])
    if m.get("pass_hat_k"):
        table["pass^k"] = ", ".join(f"^{p['k']} {p['value']:.3f}" for p in m["pass_hat_k"])
    table["Tokens Used"] = f"{m.get('tokens_used', 0):,}"
    if m.get("cost_usd") is not None:
        table["Cost"] = f"${m['cost_usd']:.4f}"
    if m.get("errors_by_type"):
        table["Errors"] = ", ".join(f"{k}: {v}" for k, v in m["errors_by_type"].items())
    table["Duration"] = f"{report.duration_ms / 1000:.1f}s"
    table["Output"] = str(report.output_path)
    return table


def _interval(metrics: dict[str, Any], key: str) -> str:
    interval = (metrics.get("confidence_intervals") or {}).get(key)
    if not interval:
        return ""
    level = interval.get("level", 0.95)
    return f"  [{level:.0%} CI {interval['low']:.3f} to {interval['high']:.3f}]"


def _headline(report: LocalRunReport) -> str:
    if report.nothing_to_do:
        return f"Run '{report.run_name}' was already complete; nothing ran."
    if report.status == "finished":
        return f"Run '{report.run_name}' finished: {report.output_path}"
    reason = report.halted or ("interrupted" if report.interrupted else "work items pending")
    return (
        f"Run '{report.run_name}' is incomplete ({reason}); run it again with "
        f"--name {report.run_name} to resume."
    )


def _reporter(out: Output, verbose: bool) -> EvalProgress:
    from osmosis.cli.progress import EvalProgress

    return EvalProgress(out, verbose=verbose)


def _register_rubric() -> None:
    # `eval rubric` has its own module, which imports only typer at module level.
    from osmosis.cli import eval_rubric

    app.command("rubric")(eval_rubric.rubric_command)


_register_rubric()


def _register_platform() -> None:
    # submit/list/info/logs/stop/retry/download: evaluation runs on the platform.
    from osmosis.cli import eval_platform

    eval_platform.register(app)


_register_platform()

__all__ = ["app", "results_table"]
