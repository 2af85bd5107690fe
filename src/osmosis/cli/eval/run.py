"""`osmosis eval run CONFIG`: an evaluation on this machine, with live progress and a results table.

    osmosis eval run configs/eval/smoke.toml -y --min-pass-rate 0.8 --junit junit.xml

Typer only at module level; the engine, pyarrow and the providers load inside the command.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from osmosis.vocabulary import DEFAULT_PASS_THRESHOLD, OUTCOMES, describe_outcomes, format_rate

if TYPE_CHECKING:
    from osmosis.cli.eval.progress import EvalProgress
    from osmosis.cli.output import Output
    from osmosis.eval.host.plan import RunOptions, RunPlan
    from osmosis.eval.host.run import RunReport
    from osmosis.eval.sites.spec import SandboxSiteSpec


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
    model: list[str] | None = typer.Option(
        None,
        "--model",
        help="Model to evaluate instead of the config's model_path; repeat it to run one "
        "evaluation per model over the same rows and compare them in one table.",
    ),
    n: int | None = typer.Option(None, "-n", help="Attempts per row, instead of the config's n."),
    limit: int | None = typer.Option(
        None, "--limit", help="Run the first N rows, instead of the config's limit."
    ),
    fresh: bool = typer.Option(False, "--fresh", help="Archive this name's results; start clean."),
    retry_failed: bool = typer.Option(
        False, "--retry-failed", help="Also re-run failed and skipped attempts."
    ),
    max_in_flight: int | None = typer.Option(
        None, "--max-in-flight", help="Concurrency override (attempts in flight at once)."
    ),
    replicas: int | None = typer.Option(
        None,
        "--replicas",
        help="Rollout servers to start; attempts are balanced over them "
        "(default 1; with --executor ray, one per node).",
    ),
    executor: str = typer.Option(
        "local",
        "--executor",
        help="Where rollout servers run: local (this machine) or ray (a Ray cluster's nodes).",
    ),
    ray_address: str | None = typer.Option(
        None,
        "--ray-address",
        help="Ray cluster address host:port (default: RAY_ADDRESS, else the one running here).",
    ),
    bridge_host: str = typer.Option(
        "127.0.0.1", "--bridge-host", help="Address the model bridge listens on."
    ),
    bridge_url: str | None = typer.Option(
        None, "--bridge-url", help="The bridge's URL as rollouts reach it (default: bound address)."
    ),
    outage_wait: float | None = typer.Option(
        None, "--outage-wait", help="Seconds a provider outage may last before the run halts (300)."
    ),
    stall_after: float | None = typer.Option(
        None,
        "--stall-after",
        help="Seconds without any model answer, calls waiting, before an outage is declared (30).",
    ),
    max_tokens_total: int | None = typer.Option(
        None,
        "--max-tokens-total",
        help="Budget: halt (resumable) once the run's model calls used this many tokens.",
    ),
    max_cost_usd: float | None = typer.Option(
        None, "--max-cost-usd", help="Budget: halt (resumable) once model calls cost this (USD)."
    ),
    max_model_calls: int | None = typer.Option(
        None, "--max-model-calls", help="Budget: halt (resumable) after this many model calls."
    ),
    cache: str | None = typer.Option(
        None,
        "--cache",
        help="Model calls from the run's record: off, use (a recorded answer for the same "
        "attempt and request, else the model) or replay (the record only; a miss fails the "
        "call with cache_miss). Default: the config's cache (off).",
    ),
    replay_from: str | None = typer.Option(
        None,
        "--replay-from",
        help="Answer model calls from another run's record (its directory or name); implies "
        "--cache replay unless --cache says use.",
    ),
    estimate: bool = typer.Option(
        False,
        "--estimate",
        help="Print the model calls, tokens and cost the run would spend, with a range (from "
        "an earlier run of the rollout, else the dataset's prompt sizes), and run nothing.",
    ),
    yes: bool = typer.Option(False, "--yes", "-y", help="Skip the confirmation."),
    verbose: bool = typer.Option(False, "--verbose", help="Stream log lines to the terminal."),
    min_pass_rate: float | None = typer.Option(
        None, "--min-pass-rate", help="CI gate: exit 3 when the pass rate is below this (0-1)."
    ),
    min_mean_reward: float | None = typer.Option(
        None, "--min-mean-reward", help="CI gate: exit 3 when the mean reward is below this."
    ),
    report_file: Path | None = typer.Option(
        None, "--report", help="Write a Markdown summary here (CI job summary, PR comment)."
    ),
    junit_file: Path | None = typer.Option(
        None, "--junit", help="Write JUnit XML here: one test case per dataset row."
    ),
    upload: bool = typer.Option(
        False, "--upload", help="Upload the run to the platform when it finished."
    ),
    sandbox: bool = typer.Option(
        False,
        "--sandbox",
        help="Run the rollout servers under bubblewrap, as the platform does: no network but "
        "the model bridge, a clean environment, the workspace read-only.",
    ),
) -> None:
    """Run an evaluation on this machine and write results under .osmosis/evals/<name>/.

    Exit codes: 0 finished (wrong answers included), 1 an error or an incomplete run, 3 below
    --min-pass-rate or --min-mean-reward, 5 every attempt errored, 130 interrupted."""
    from osmosis.cli import prestart
    from osmosis.cli.eval.options import model_problems
    from osmosis.cli.eval.report import check_gate_options, conclude
    from osmosis.cli.output import CLIError, output
    from osmosis.eval.host.plan import (
        RunOptions,
    )

    out = output()
    if max_in_flight is not None and max_in_flight < 1:
        raise CLIError(
            "--max-in-flight must be at least 1", details={"max_in_flight": max_in_flight}
        )
    _check_positive(
        n=n,
        limit=limit,
        replicas=replicas,
        outage_wait=outage_wait,
        stall_after=stall_after,
        max_tokens_total=max_tokens_total,
        max_cost_usd=max_cost_usd,
        max_model_calls=max_model_calls,
    )
    if cache is not None and cache not in ("off", "use", "replay"):
        raise CLIError(f"--cache must be off, use or replay, got {cache!r}")
    if max_cost_usd is not None and not math.isfinite(max_cost_usd):
        raise CLIError("--max-cost-usd must be a finite number of dollars")
    _check_executor(executor, ray_address=ray_address, sandbox=sandbox)
    gate_problems = check_gate_options(min_pass_rate, min_mean_reward)
    if gate_problems:
        raise CLIError("; ".join(gate_problems), details={"problems": gate_problems})
    options = RunOptions(
        # Without --name: the one the rollout server started at the command's entry was
        # made for (`osmosis.cli.prestart`), if it started one; else the plan names the run.
        name=name if name is not None else prestart.run_name(),
        output=output_root,
        dataset_file=dataset_file,
        secrets_file=secrets_file,
        rows=rows,
        fresh=fresh,
        retry_failed=retry_failed,
        max_in_flight=max_in_flight,
        replicas=replicas if replicas is not None or executor == "ray" else 1,
        executor=executor,
        ray_address=ray_address,
        bridge_host=bridge_host,
        bridge_url=bridge_url,
        outage_wait_s=outage_wait,
        stall_after_s=stall_after,
        max_tokens_total=max_tokens_total,
        max_cost_usd=max_cost_usd,
        max_model_calls=max_model_calls,
        cache=cache,
        replay_from=replay_from,
        model=model[0] if model else None,
        n=n,
        limit=limit,
    )
    if problems := model_problems(model):
        raise CLIError("; ".join(problems), details={"problems": problems})
    if estimate:
        from osmosis.cli.eval.estimate import show_estimate

        if model is not None and len(model) > 1:
            raise CLIError("--estimate takes one --model: estimate each model on its own")
        show_estimate(out, _plan(config, options))
        return
    if model is not None and len(model) > 1:
        refused = {"--report": report_file, "--junit": junit_file, "--upload": upload or None}
        given = [flag for flag, value in refused.items() if value is not None]
        if given or replay_from is not None:
            raise CLIError(
                f"{', '.join(given or ['--replay-from'])} takes one run: give one --model, "
                "or run each model on its own",
            )
        _run_models(
            out,
            config,
            options,
            models=model,
            yes=yes,
            verbose=verbose,
            sandbox=sandbox,
            min_pass_rate=min_pass_rate,
            min_mean_reward=min_mean_reward,
        )
        return
    plan = _plan(config, options)
    _show_plan(out, plan)
    _confirm(
        out,
        f"{plan.total_work_items} rollouts x model {plan.config.experiment.model_path} — continue?",
        yes,
    )
    rerun = _rerun(config, plan.name, options)
    report = _evaluate(out, plan, verbose=verbose, sandbox=sandbox, rerun=rerun)
    _with_messages(report)
    # Gates, --report/--junit and --upload: what a CI job acts on (osmosis.cli.eval.report).
    outcome = conclude(
        out,
        report,
        rerun=rerun,
        min_pass_rate=min_pass_rate,
        min_mean_reward=min_mean_reward,
        report_file=report_file,
        junit_file=junit_file,
        upload=upload,
    )
    _show_report(out, plan, report, extra=outcome.resource, next_steps=outcome.next_steps)
    outcome.finish(out)


def _plan(config: Path, options: RunOptions) -> RunPlan:
    """`plan_run`, with the platform's dataset when no local file is found; a `CLIError`
    saying every problem otherwise."""
    from osmosis.cli.output import CLIError
    from osmosis.eval.host.plan import DatasetNotFound, PlanError, plan_run

    try:
        try:
            return plan_run(config, options)
        except DatasetNotFound as missing:  # no local file: the platform's, when configured
            from osmosis.cli.eval.dataset import with_platform_dataset

            return plan_run(config, with_platform_dataset(config, options, missing))
    except PlanError as error:
        raise CLIError(str(error), details=error.details, hint=error.hint or None) from None


def _run_models(
    out: Output,
    config: Path,
    options: RunOptions,
    *,
    models: list[str],
    yes: bool,
    verbose: bool,
    sandbox: bool,
    min_pass_rate: float | None,
    min_mean_reward: float | None,
) -> None:
    """One evaluation per model over the same rows (`<name>-<model>` each), then one table.
    Every plan is made before anything runs, so a problem with any model stops them all."""
    from dataclasses import replace

    from osmosis.eval.host.run_name import default_run_name

    base = options.name or default_run_name(config)
    plans = [_plan(config, replace(options, model=m, name=f"{base}-{_slug(m)}")) for m in models]
    if out.mode.value == "rich":
        out.detail(
            {p.config.experiment.model_path: f"{p.total_work_items} work items -> {p.run_dir}"
             for p in plans},
            title=f"osmosis eval run: {len(plans)} models over the same rows",
        )  # fmt: skip
    total = sum(p.total_work_items for p in plans)
    _confirm(out, f"{total} rollouts over {len(plans)} models — continue?", yes)
    reports = [
        _evaluate(
            out,
            plan,
            verbose=verbose,
            sandbox=sandbox,
            rerun=_rerun(
                config, plan.name, replace(options, model=plan.config.experiment.model_path)
            ),
        )
        for plan in plans
    ]
    rows = [_model_row(plan, report) for plan, report in zip(plans, reports, strict=True)]
    out.listing(
        rows,
        columns=["model", "status", "pass_rate", "pass_at_k", "tokens", "cost_usd", "duration_s",
                 "run"],
        title="Models side by side",
        cells={"cost_usd": lambda v: "-" if v is None else f"${v:.4f}",
               "tokens": lambda v: f"{v:,}"},
    )  # fmt: skip
    if any(report.status != "finished" for report in reports):
        raise typer.Exit(1)
    below = [
        row["model"]
        for row, report in zip(rows, reports, strict=True)
        if (min_pass_rate is not None and report.metrics.get("pass_rate", 0.0) < min_pass_rate)
        or (
            min_mean_reward is not None
            and (report.metrics.get("reward_stats") or {}).get("mean", 0.0) < min_mean_reward
        )
    ]
    if below:
        out.warn(f"below the gate: {', '.join(below)} (exit 3)")
        raise typer.Exit(3)


def _rerun(config: Path, name: str, options: RunOptions) -> str:
    """The `eval run` line that resumes run `name`, with the command line's own overrides
    (`options` as given, before a platform dataset stood in for a missing file)."""
    import shlex

    from osmosis.cli.eval.report import rerun_command

    line = rerun_command(config, name, options.output, options.dataset_file)
    for flag, value in (("--model", options.model), ("-n", options.n), ("--limit", options.limit)):
        if value is not None:
            line += f" {flag} {shlex.quote(str(value))}"
    return line


def _evaluate(out: Output, plan: RunPlan, *, verbose: bool, sandbox: bool, rerun: str) -> RunReport:
    """Run `plan` with a progress display; a host error or Ctrl-C as the CLI's error (the
    attempts that finished are recorded either way: `run_evaluation` writes on the way out)."""
    from osmosis.cli.output import CLIError
    from osmosis.eval.errors import HostError
    from osmosis.eval.host import event_loop
    from osmosis.eval.host.run import run_evaluation

    reporter = _reporter(out, verbose)
    new_run = not (plan.run_dir / "manifest.json").exists()
    try:
        return event_loop.run(run_evaluation(plan, reporter, site=_sandboxed(sandbox)))
    except HostError as error:  # the user's to fix: the same words the platform shows
        if new_run:
            _forget_if_nothing_ran(plan.run_dir)
        raise CLIError(str(error), code=error.code, hint=error.hint or None) from None
    except KeyboardInterrupt:
        raise CLIError(
            f"interrupted: the attempts that finished are recorded in {plan.run_dir}",
            code="INTERRUPTED",
            details={"run_name": plan.name, "resume": rerun},
            hint=f"resume with: {rerun}",
            exit_code=130,
        ) from None
    finally:
        reporter.close()


def _forget_if_nothing_ran(run_dir: Path) -> None:
    """A run this invocation created that failed before recording any attempt (a model
    pre-flight, a rollout that would not start) does not keep its name: the next run may use
    it with other inputs."""
    import shutil

    journal = run_dir / "events.jsonl"
    if run_dir.is_dir() and (not journal.exists() or journal.stat().st_size == 0):
        shutil.rmtree(run_dir, ignore_errors=True)


def _model_row(plan: RunPlan, report: RunReport) -> dict[str, Any]:
    """One model's line of the side-by-side table (JSON keeps the raw figures)."""
    m = report.metrics
    interval = (m.get("confidence_intervals") or {}).get("pass_rate") or {}
    shown = f"{m.get('pass_rate', 0.0):.1%}"
    if interval:
        shown += f" [{interval['low']:.1%}, {interval['high']:.1%}]"
    return {
        "model": plan.config.experiment.model_path,
        "status": report.status,
        "pass_rate": shown,
        "pass_at_k": ", ".join(
            f"@{p['k']} {format_rate(p['value'])}" for p in m.get("pass_at_k") or []
        ),
        "tokens": int(m.get("tokens_used", 0)),
        "cost_usd": m.get("cost_usd"),
        "duration_s": round(report.duration_ms / 1000, 1),
        "run": report.run_name,
        "outcomes": _outcomes(m),
    }


def _slug(model: str) -> str:
    """A model id as part of a run name: `openai/gpt-5-mini` -> `openai-gpt-5-mini`."""
    import re

    return re.sub(r"[^A-Za-z0-9_.-]+", "-", model).strip("-.") or "model"


def _sandboxed(sandbox: bool) -> SandboxSiteSpec | None:
    """`run_evaluation`'s site for `--sandbox`: the default policy and a rollout environment that
    inherits nothing but PATH-like basics and the locale. None: the plan's own site."""
    if not sandbox:
        return None
    import os

    from osmosis.eval.sites.sandbox import clean_base_env
    from osmosis.eval.sites.sandbox.layout import SANDBOX_HOME
    from osmosis.eval.sites.spec import SandboxSiteSpec

    return SandboxSiteSpec(base_env=clean_base_env(os.environ, home=SANDBOX_HOME))


def _check_executor(executor: str, *, ray_address: str | None, sandbox: bool) -> None:
    from osmosis.cli.output import CLIError

    if executor not in ("local", "ray"):
        raise CLIError(f"--executor {executor!r}: use local or ray", details={"executor": executor})
    if executor == "local" and ray_address is not None:
        raise CLIError("--ray-address needs --executor ray", details={"ray_address": ray_address})
    if executor == "ray" and sandbox:
        raise CLIError(
            "--sandbox runs rollout servers on this machine; it does not apply to --executor ray"
        )


def _check_positive(**values: float | None) -> None:
    from osmosis.cli.output import CLIError

    problems = {
        name: value
        for name, value in values.items()
        if value is not None and (value <= 0 or (name == "replicas" and value < 1))
    }
    if problems:
        flags = ", ".join(
            f"{'-n' if key == 'n' else '--' + key.replace('_', '-')} {value:g}"
            for key, value in problems.items()
        )
        raise CLIError(f"must be positive: {flags}", details=problems)


# -- presentation ---------------------------------------------------------------------------
def _show_plan(out: Output, plan: RunPlan) -> None:
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
            **({"Budget": plan.budget.describe()} if plan.budget.limited else {}),
            "Output": str(plan.run_dir),
        },
        title="osmosis eval run",
    )


def _confirm(out: Output, prompt: str, yes: bool) -> None:
    """Ask `prompt` (default yes) unless `--yes`; without a terminal, say to use `--yes`."""
    from osmosis.cli.output import CLIError

    if yes:
        return
    if not out.interactive:
        raise CLIError(
            "Use --yes to confirm in non-interactive mode.",
            code="INTERACTIVE_REQUIRED",
            details={"prompt": prompt},
        )
    if not typer.confirm(prompt, default=True):
        raise typer.Abort()


def _show_report(
    out: Output,
    plan: RunPlan,
    report: RunReport,
    *,
    extra: dict[str, Any] | None = None,
    next_steps: list[str] | None = None,
) -> None:
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
        # passed / not_passed / errored / skipped (osmosis.vocabulary.outcome); `succeeded` and
        # `failed` stay for scripts that read them.
        "outcomes": _outcomes(metrics),
        "resumed": report.resumed,
        "halted": report.halted,
        "duration_ms": report.duration_ms,
        "metrics": metrics,
        # What the model bridge saw: 429s (`throttled_calls`), its `adaptive_limit`, spend.
        "bridge": report.bridge,
        "failed_rows": report.failed_rows,
        **(extra or {}),
    }
    status = "success" if report.status == "finished" else "partial"
    if out.mode.value == "json":
        out.operation(
            "eval.run",
            message=_headline(report),
            status=status,
            resource=resource,
            next_steps=[{"action": "run", "command": step} for step in next_steps or []],
        )
        return
    if report.failed_rows and out.mode.value == "rich":
        out.info("Errored rows")
        for row in report.failed_rows[:20]:
            message = _first_line(row.get("error_message"))
            out.info(
                f"  row {row['row_index']} run {row['run_index']}: "
                f"error_type={row['error_type']}{': ' + message if message else ''} "
                f"-> {row['rollout_dir']}"
            )
        if len(report.failed_rows) > 20:
            out.info(f"  … and {len(report.failed_rows) - 20} more (see index.jsonl)")
    out.detail(results_table(report), title="Results")
    out.info(_headline(report))
    for step in next_steps or []:
        out.info(f"Next: {step}")


def results_table(report: RunReport) -> dict[str, Any]:
    """The rows of the results table (also what `--plain` prints)."""
    m = report.metrics
    scored = m.get("completed_samples", 0)
    table: dict[str, Any] = {
        "Run": report.run_name,
        "Work Items": (
            f"{m.get('total_samples', 0)}/{report.total_work_items} complete · "
            + describe_outcomes(_outcomes(m), sep=" · ")
        ),
        "Pass Rate": (
            f"{m.get('pass_rate', 0.0):.1%} ({m.get('passed', 0)}/{scored} scored, "
            f"threshold {m.get('pass_threshold', DEFAULT_PASS_THRESHOLD):g})"
            + _interval(m, "pass_rate", rate=True)
        ),
    }
    stats = m.get("reward_stats")
    if stats:
        table["Reward"] = (
            f"mean {stats['mean']:.3f}, median {stats['median']:.3f}, "
            f"min {stats['min']:.3f}, max {stats['max']:.3f}" + _interval(m, "mean_reward")
        )
    if m.get("pass_at_k"):
        table["pass@k"] = ", ".join(f"@{p['k']} {format_rate(p['value'])}" for p in m["pass_at_k"])
    if m.get("pass_hat_k"):
        table["pass^k"] = ", ".join(f"^{p['k']} {format_rate(p['value'])}" for p in m["pass_hat_k"])
    table["Tokens Used"] = f"{m.get('tokens_used', 0):,}"
    if m.get("cost_usd") is not None:
        table["Cost"] = f"${m['cost_usd']:.4f}"
    if m.get("errors_by_type"):
        table["Errors"] = ", ".join(f"{k}: {v}" for k, v in m["errors_by_type"].items())
    table["Duration"] = f"{report.duration_ms / 1000:.1f}s"
    table["Output"] = str(report.output_path)
    return table


def _outcomes(metrics: dict[str, Any]) -> dict[str, int]:
    """The summary's outcome counts, every outcome present."""
    counts = metrics.get("outcomes") or {}
    return {name: int(counts.get(name, 0)) for name in OUTCOMES}


def _first_line(message: object) -> str:
    """An error message's first non-empty line, cut to fit a terminal line."""
    from osmosis.cli.eval.report import printable

    lines = [line.strip() for line in printable(message or "").splitlines() if line.strip()]
    return lines[0][:200] if lines else ""


def _with_messages(report: RunReport) -> None:
    """Add each errored row's `error_message` (from the journal) to `report.failed_rows`."""
    if not report.failed_rows:
        return
    from osmosis.cli.eval.local_runs import read_local_run

    messages = {
        record.rollout_id: record.error_message
        for record in read_local_run(report.output_path).records()
        if record.status == "failed"
    }
    for row in report.failed_rows:
        row.setdefault("error_message", messages.get(row["rollout_id"]))


def _interval(metrics: dict[str, Any], key: str, *, rate: bool = False) -> str:
    """`  [95% CI 40.1% to 55.6%, wilson]`: a rate's interval in percent, as the rate is."""
    interval = (metrics.get("confidence_intervals") or {}).get(key)
    if not interval:
        return ""
    level = interval.get("level", 0.95)
    method = f", {interval['method']}" if interval.get("method") else ""
    low, high = interval["low"], interval["high"]
    ends = f"{format_rate(low)} to {format_rate(high)}" if rate else f"{low:.3f} to {high:.3f}"
    return f"  [{level:.0%} CI {ends}{method}]"


def _headline(report: RunReport) -> str:
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
    from osmosis.cli.eval.progress import EvalProgress

    return EvalProgress(out, verbose=verbose)
