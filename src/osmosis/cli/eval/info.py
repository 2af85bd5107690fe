"""`osmosis eval info NAME`: one run, from the platform or from its local directory.

    osmosis eval info smoke-brave-otter-1a2b        # the platform's run; saves metrics.json
    osmosis eval info .osmosis/evals/try1           # a local run directory
    osmosis eval info .osmosis/evals/smoke-brave-otter-1a2b   # a run `eval download` fetched

Only typer and this package's light helpers load at module level; the rest inside the command.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from osmosis.cli.eval.context import aware, run_url, runs_root, when
from osmosis.cli.eval.runs import log_row

if TYPE_CHECKING:
    from osmosis.cli.eval.local_runs import LocalRun
    from osmosis.client import PlatformClient
    from osmosis.wire.runs import EvalRunDetail, RunCache

SCOPE_LABELS = {"user": "Personal", "workspace": "Workspace", "run": "Run"}


def _duration(run: Any) -> str | None:
    """The run's duration; while it runs, the time since it started."""
    from datetime import UTC, datetime

    ms = run.duration_ms
    if ms is None and run.started_at is not None:
        end = aware(run.completed_at) if run.completed_at else datetime.now(UTC)
        ms = (end - aware(run.started_at)).total_seconds() * 1000
    if ms is None:
        return None
    seconds = round(ms / 1000)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes}m {seconds}s"
    return f"{minutes}m {seconds}s" if minutes else f"{ms / 1000:.1f}s"


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
        "outcomes": _platform_outcomes(detail, metrics.get("outcomes")),
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
        "flaky_rows": detail.flaky_rows,
    }


def _platform_outcomes(detail: EvalRunDetail, recorded: object) -> dict[str, int]:
    """The four outcomes (`osmosis.vocabulary.outcome`): the engine's count in metrics.json
    when it covers every attempt finished so far, else the live counts (errored = failed)."""
    from osmosis.vocabulary import OUTCOMES, outcomes_of_counts

    summary = detail.summary
    done = summary.progress.completed
    if isinstance(recorded, Mapping) and sum(recorded.get(k, 0) for k in OUTCOMES) == done:
        return {name: int(recorded.get(name, 0)) for name in OUTCOMES}
    counts = outcomes_of_counts(
        completed=done, passed=summary.passed, failed=summary.failed, skipped=summary.skipped
    )
    return {name: count for name, count in counts.items()}


def _local_outcomes(summary: Mapping[str, Any], run: LocalRun) -> dict[str, int]:
    """The four outcomes from metrics.json, or counted from the journal (older runs)."""
    from osmosis.vocabulary import OUTCOMES, count_outcomes

    recorded = summary.get("outcomes")
    if isinstance(recorded, Mapping):
        return {name: int(recorded.get(name, 0)) for name in OUTCOMES}
    threshold = summary.get("pass_threshold", run.pass_threshold)
    counted = count_outcomes(((r.status, r.reward) for r in run.records()), threshold)
    return {name: count for name, count in counted.items()}


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
    from osmosis.vocabulary import describe_outcomes

    rows: dict[str, Any] = {
        "Samples": f"{results['graded']} graded · {describe_outcomes(results['outcomes'])}",
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
    if results.get("flaky_rows"):
        rows["Flaky Rows"] = _shown_rows(results["flaky_rows"])
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
    from osmosis.cli.eval.download import fetcher
    from osmosis.cli.eval.transfer import plan_transfer, run_dir_name, transfer
    from osmosis.client import PlatformAPIError

    run = detail.eval_run
    if run.status == "pending":
        return None, "metrics are not available while the run is pending"
    run_dir = root / run_dir_name(run.name, run.id)
    if (run_dir / "manifest.json").is_file():
        # A local run of the same name (uploaded as this run): its own metrics stay.
        return None, f"{run_dir} is a local run directory; its metrics.json is left as it is"
    try:
        manifest = client.runs.files(run.id, types=["metrics"])
    except PlatformAPIError as error:
        return None, f"could not list the run's files: {error.message}"
    plan = plan_transfer(manifest.files, run_dir, selected_types=("metrics",))
    if not plan.files:
        return None, "the run has no metrics.json yet"
    result = transfer(plan, fetcher(client, run.id))
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

    NAME is looked up as a run directory (a path holding manifest.json, or a path to a run
    `eval download` fetched) first, then on the platform (name or id), then, when the
    platform does not know it or cannot be reached, as a local run name under the runs root
    (a downloaded copy there included)."""
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.eval.local_runs import find_local_run, read_local_run
    from osmosis.cli.output import CLIError, output
    from osmosis.eval.results.official_layout import is_download_dir
    from osmosis.vocabulary import TERMINAL_RUN_STATUSES

    out = output()
    save = out.mode.value == "rich" or output_root is not None
    given = Path(name).expanduser()
    # A bare name is the platform's run (a downloaded copy may be stale); a path is the copy.
    as_path = "/" in name or name.startswith((".", "~"))
    if given.joinpath("manifest.json").is_file() or (as_path and is_download_dir(given)):
        _show_local_info(out, read_local_run(given.resolve()))
        return
    try:
        with platform_errors(), open_client(None) as client:
            detail = client.runs.get(name)
            output_path, save_warning = (
                _save_metrics(client, detail, runs_root(output_root)) if save else (None, None)
            )
            url = run_url(client.base_url, detail.eval_run.name)
    except CLIError as error:
        local = find_local_run(name, root=runs_root(output_root))
        copy = runs_root(output_root) / name
        if local is None and not as_path and name not in ("", ".") and is_download_dir(copy):
            local = copy.resolve()
        if local is None or error.code not in ("NOT_FOUND", "NETWORK", "AUTH_REQUIRED"):
            raise
        _show_local_info(out, read_local_run(local))
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
        "Submitted": when(run.created_at),
        "Submitted By": run.creator_name or run.creator_email,
        "Started": when(run.started_at),
        "Completed": when(run.completed_at),
        "Dataset": _dataset_line(detail),
        "Model": run.model,
        "Rollout": run.rollout,
    }
    if run.error:
        main["Halted" if run.status == "halted" else "Error"] = run.error
    if run.waiting_reason:
        main["Waiting"] = run.waiting_reason
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
            "Model Traffic": _traffic(((detail.metrics or {}).get("eval_run") or {}).get("bridge")),
            "Model Cache": _cache_line(detail.cache),
        },
        title="Configuration",
    )
    if run.status != "pending":
        out.detail(_results_rows(results), title="Results")
    if detail.recent_logs and out.mode.value == "rich":
        out.listing(
            [log_row(entry) for entry in detail.recent_logs],
            columns=["time", "level", "step", "message"],
            title="Recent logs",
        )
    out.info(f"View: {url}")
    if run.status == "failed":
        out.info(f"See why: osmosis eval logs {run.name}")
    if run.status == "halted":  # its budget is spent: nothing failed
        out.info(f"Resume it once its budget is raised: osmosis eval retry {run.name}")
    if run.status not in TERMINAL_RUN_STATUSES:
        out.info(f"Stop it: osmosis eval stop {run.name}")
    if output_path:
        out.info(f"Saved metrics to {output_path}")
    if save_warning:
        out.warn(save_warning)


# -- a local run ------------------------------------------------------------------------------
def _flaky_rows(records: Any, threshold: float) -> list[int]:
    from osmosis.eval.results.compare import row_outcomes

    return sorted(row for row, found in row_outcomes(records, threshold).items() if found.flaky)


def _shown_rows(rows: list[int]) -> str | None:
    """`3, 7, 12` (attempts disagree within the run), at most 20 named; None: none."""
    if not rows:
        return None
    more = f" … and {len(rows) - 20} more" if len(rows) > 20 else ""
    return ", ".join(map(str, rows[:20])) + more + " (attempts disagree within the run)"


def _traffic(bridge: object) -> str | None:
    """`429s 12 · limit 10 in flight` from metrics.json's `eval_run.bridge`; None before."""
    if not isinstance(bridge, dict) or "throttled_calls" not in bridge:
        return None
    limit = bridge.get("adaptive_limit")
    shown = f" · limit {limit} in flight" if limit is not None else ""
    return f"429s {bridge['throttled_calls']:,}{shown}"


def _cache_line(cache: RunCache) -> str | None:
    """`replay from smoke-1 · 24 answered from the record, 0 not in it`; None: off."""
    if cache.mode == "off":
        return None
    shown = cache.mode + (f" from {cache.replay_from}" if cache.replay_from else "")
    if cache.hits is not None:
        shown += f" · {cache.hits:,} answered from the record, {cache.misses or 0:,} not in it"
    return shown


def _show_local_info(out: Any, run: LocalRun) -> None:
    """`eval info` for a local run: the platform view's sections, from the run directory."""
    metrics = run.metrics or {}
    info = metrics.get("eval_run") or {}
    summary = metrics.get("summary") or {}
    records = run.records()
    progress: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        progress = json.loads((run.path / "progress.json").read_text(encoding="utf-8"))
    total = progress.get("total_runs")
    # No metrics.json yet, or older than the journal: the run is still going (or was killed).
    status = str(info.get("status") or "running")
    if status == "finished" and len(records) != total:
        status = "running"
    completed = len(records)
    if run.downloaded and not summary and records:
        # Attempts without metrics.json (`--type trajectories`): the same figures from them.
        from osmosis.eval.results.metrics import summarize

        summary = summarize(records, run.pass_threshold)
    if run.downloaded:
        # The platform's own status and figures; what the download does not carry (the
        # planned total of a run that did not finish, its config) is not recorded.
        status = str(info.get("status") or NOT_RECORDED)
        completed = completed or int(summary.get("total_samples") or 0)
        total = completed if status == "finished" else None
    inputs, provenance = run.inputs, run.manifest.get("provenance") or {}
    rollout = inputs.get("rollout") or {}
    results = {
        "graded": summary.get("graded", 0),
        "passed": summary.get("passed", 0),
        "failed": summary.get("failed", 0),
        "skipped": summary.get("skipped", 0),
        "outcomes": _local_outcomes(summary, run),
        "pass_rate": summary.get("pass_rate"),
        "pass_threshold": summary.get("pass_threshold", run.pass_threshold),
        "reward_stats": summary.get("reward_stats"),
        "pass_at_k": summary.get("pass_at_k"),
        "pass_hat_k": summary.get("pass_hat_k"),
        "confidence_intervals": summary.get("confidence_intervals"),
        "tokens_used": summary.get("tokens_used", 0),
        "cost_usd": summary.get("cost_usd"),
        "errors_by_type": summary.get("errors_by_type") or {},
        # Rows whose attempts disagree within this run (`results.compare.RowOutcome.flaky`).
        "flaky_rows": _flaky_rows(records, summary.get("pass_threshold", run.pass_threshold)),
    }
    if out.mode.value == "json":
        out.detail(
            {
                "source": "download" if run.downloaded else "local",
                "output_path": str(run.path),
                "eval_run": {**info, "status": status, "name": run.name},
                "progress": {"completed": completed, "total": total},
                "metrics": metrics or None,
                "metrics_available": bool(metrics),
                "results": results,
                "manifest": None if run.downloaded else run.manifest,
            }
        )
        return
    if run.downloaded:
        _show_downloaded_info(out, run, status, completed, total, results)
        return
    duration = info.get("duration_ms")
    out.detail(
        {
            "Name": run.name,
            "Status": f"{status} (local run)",
            "Progress": f"{len(records)} / {total} samples" if total else f"{len(records)}",
            "Duration": f"{duration / 1000:.1f}s" if isinstance(duration, int | float) else None,
            "Pass Rate": None if results["pass_rate"] is None else f"{results['pass_rate']:.1%}",
            "Tokens Used": f"{results['tokens_used']:,}",
            "Model Traffic": _traffic(info.get("bridge")),
            "Flaky Rows": _shown_rows(results["flaky_rows"]),
            "Started": info.get("started_at") or run.manifest.get("created_at"),
            "Completed": info.get("completed_at"),
            "Dataset": f"{info.get('dataset_name') or '-'} ({provenance.get('dataset_path')})",
            "Model": inputs.get("model_path"),
            "Rollout": rollout.get("name"),
        },
        title=f"Local evaluation run {run.name}",
    )
    out.detail(
        {
            "Entrypoint": rollout.get("entrypoint"),
            "Config": f"n={inputs.get('n')}, pass_threshold={run.pass_threshold}",
            "Config file": provenance.get("config_path"),
            "Secrets": ", ".join(inputs.get("secrets") or []) or "-",
        },
        title="Configuration",
    )
    if metrics:
        out.detail(_results_rows(results), title="Results")
    else:
        out.info("No metrics.json yet: the run has not finished or halted once.")
    out.info(f"Output: {run.path}")


NOT_RECORDED = "not recorded"


def _show_downloaded_info(
    out: Any, run: LocalRun, status: str, completed: int, total: int | None, results: Any
) -> None:
    """`eval info DIR` for a platform run `eval download` fetched: the platform's status and
    metrics from its metrics.json, and "not recorded" for what the download does not carry."""
    info = run.eval_run
    duration = info.get("duration_ms")
    halted = info.get("halted")
    out.detail(
        {
            "Name": run.name,
            "Status": f"{status} (downloaded platform run)",
            "Progress": f"{completed} / {total} samples"
            if total is not None
            else f"{completed} samples (planned total {NOT_RECORDED})",
            "Duration": f"{duration / 1000:.1f}s"
            if isinstance(duration, int | float)
            else NOT_RECORDED,
            "Pass Rate": NOT_RECORDED
            if results["pass_rate"] is None
            else f"{results['pass_rate']:.1%}",
            "Tokens Used": f"{results['tokens_used']:,}",
            "Flaky Rows": _shown_rows(results["flaky_rows"]),
            "Started": info.get("started_at") or NOT_RECORDED,
            "Completed": info.get("completed_at") or NOT_RECORDED,
            "Dataset": info.get("dataset_name") or NOT_RECORDED,
            "Model": info.get("model_name") or NOT_RECORDED,
            "Rollout": info.get("rollout_name") or NOT_RECORDED,
            "Platform Run ID": info.get("id") or NOT_RECORDED,
        }
        | ({("Halted" if status == "halted" else "Error"): halted} if halted else {}),
        title=f"Downloaded evaluation run {run.name}",
    )
    if run.metrics:
        out.detail(_results_rows(results), title="Results")
    else:
        out.info(f"No metrics.json in {run.path}: osmosis eval download {run.name} fetches it.")
    out.info(f"Output: {run.path}")
