"""`eval submit --wait`: follow a platform run to its end, then apply the CI gates.

    osmosis eval submit configs/eval/qa.toml -y --wait --min-pass-rate 0.8   # exit 3 if below

A line is printed when the run's status or progress changes (at most every few seconds) and
at least every `HEARTBEAT_S` seconds. The platform going away for a while (a restart, a
network blip, a 5xx) is said once and waited out for up to `UNREACHABLE_S` seconds: the run
goes on there, and a CI job must not fail for a poll that found no answer. Ctrl-C stops
following, not the run: it prints the command that follows it again. Exit codes as
`eval run`: 1 when the run failed or was stopped (or the platform stayed away), 5 when it
finished with every attempt errored, 3 when it finished below a gate.

Several runs (`eval submit --model a --model b --wait`) are followed together (`watch`) and
shown as one table of models side by side (`follow_many`), with `eval run`'s matrix exit rule.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

from osmosis.cli.eval.report import ERRORED_EXIT_CODE, GATE_EXIT_CODE, all_errored, check_gates
from osmosis.vocabulary import format_rate

POLL_S: Final = 2.0
HEARTBEAT_S: Final = 30.0
UNREACHABLE_S: Final = 600.0
"""How long polls may go unanswered (no connection, 429, 5xx) before following gives up."""
_TRANSIENT_STATUS: Final = frozenset({408, 429, 500, 502, 503, 504})


def follow(
    out: Any,
    name: str,
    *,
    resource: Mapping[str, Any],
    next_steps: list[dict[str, Any]],
    min_pass_rate: float | None,
    min_mean_reward: float | None,
    poll_s: float = POLL_S,
    unreachable_s: float = UNREACHABLE_S,
) -> None:
    """Poll the run until it is finished, failed or stopped; print one envelope at the end."""
    import typer

    detail = watch(out, [name], poll_s=poll_s, unreachable_s=unreachable_s)[name]
    run = detail.eval_run
    summary = (detail.metrics or {}).get("summary") or {}
    gates = check_gates(summary, min_pass_rate=min_pass_rate, min_mean_reward=min_mean_reward)
    final = {
        **resource,
        "status": run.status,
        "error": run.error,
        "metrics": summary or None,
        "outcomes": summary.get("outcomes"),
        "gates": [gate.as_dict() for gate in gates],
    }
    finished = run.status == "finished"
    out.operation(
        "eval.submit",
        message=f"Evaluation run {run.name} {run.status}"
        + (f": {run.error}" if run.error else "")
        + (f"; pass rate {summary['pass_rate']:.1%}" if "pass_rate" in summary else ""),
        status="success" if finished else "partial",
        resource=final,
        next_steps=next_steps,
    )
    if not finished:
        raise typer.Exit(1)
    failed = [gate for gate in gates if not gate.passed]
    if out.mode.value != "json":
        for gate in gates:
            if gate.passed:
                out.info(f"gate passed: {gate.describe()}")
        for gate in failed:
            out.err_console.print(f"gate failed: {gate.describe()}", markup=False, highlight=False)
    errored = all_errored(summary)
    if errored:
        out.err_console.print(
            f"every attempt errored ({errored}): exit {ERRORED_EXIT_CODE}",
            markup=False,
            highlight=False,
        )
        raise typer.Exit(ERRORED_EXIT_CODE)
    if failed:
        raise typer.Exit(GATE_EXIT_CODE)


def watch(
    out: Any,
    names: Sequence[str],
    *,
    poll_s: float = POLL_S,
    unreachable_s: float = UNREACHABLE_S,
) -> dict[str, Any]:
    """Poll every run until each is finished, failed or stopped; its last detail by name.

    A line per run when its status or progress changes, or every `HEARTBEAT_S` seconds."""
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.output import CLIError
    from osmosis.client import PlatformAPIError
    from osmosis.vocabulary import TERMINAL_RUN_STATUSES

    if len(names) == 1:
        which, ends = names[0], "it ends (Ctrl-C stops following, not the run)"
    else:
        which = f"{len(names)} runs ({', '.join(names)})"
        ends = "they end (Ctrl-C stops following, not the runs)"
    out.info(f"Following {which} until {ends}")
    shown: dict[str, tuple[float, tuple[str, int]]] = {}  # name -> (when, state) last printed
    ended: dict[str, Any] = {}
    away_since: float | None = None  # when polls stopped being answered
    try:
        with platform_errors(), open_client(None) as client:
            while True:
                for name in [n for n in names if n not in ended]:
                    try:
                        detail = client.runs.get(name)
                    except PlatformAPIError as error:
                        transient = (
                            error.code == "NETWORK" or error.status_code in _TRANSIENT_STATUS
                        )
                        now = time.monotonic()
                        if not transient or (
                            away_since is not None and now - away_since >= unreachable_s
                        ):
                            raise
                        if away_since is None:
                            away_since = now
                            out.warn(
                                f"no answer from the platform ({error.message}); still following "
                                f"{which}, for up to {unreachable_s:.0f}s"
                            )
                        break
                    if away_since is not None:
                        out.info(f"the platform answers again; following {which}")
                        away_since = None
                    run = detail.eval_run
                    progress = detail.summary.progress
                    state = (run.status, progress.completed)
                    now = time.monotonic()
                    last_line, last_state = shown.get(name, (0.0, None))
                    if state != last_state or now - last_line >= HEARTBEAT_S:
                        rate = detail.summary.pass_rate
                        rate_shown = "-" if rate is None else f"{rate:.0%}"
                        out.info(
                            f"{run.name}: {run.status} · {progress.completed}/{progress.total} "
                            f"samples · pass {rate_shown}"
                        )
                        shown[name] = (now, state)
                    if run.status in TERMINAL_RUN_STATUSES:
                        ended[name] = detail
                if len(ended) == len(names):
                    return ended
                time.sleep(poll_s)
    except KeyboardInterrupt:
        going = [name for name in names if name not in ended]
        raise CLIError(
            f"stopped following {', '.join(going)}; the run goes on on the platform",
            code="INTERRUPTED",
            details={"name": going[0], "names": going},
            hint=f"osmosis eval info {going[0]} (or osmosis eval stop {going[0]})",
            exit_code=130,
        ) from None


def follow_many(
    out: Any,
    resources: Sequence[Mapping[str, Any]],
    *,
    min_pass_rate: float | None,
    min_mean_reward: float | None,
    poll_s: float = POLL_S,
    unreachable_s: float = UNREACHABLE_S,
) -> None:
    """Follow one run per model to its end, then print one table of them side by side (as
    `eval run --model a --model b`) and exit as that matrix does: 1 when a run did not
    finish, 3 when a finished run is below a gate (each run is held to the gates)."""
    import typer

    details = watch(
        out,
        [resource["name"] for resource in resources],
        poll_s=poll_s,
        unreachable_s=unreachable_s,
    )
    finals, rows = [], []
    for resource in resources:
        detail = details[resource["name"]]
        run = detail.eval_run
        summary = (detail.metrics or {}).get("summary") or {}
        gates = check_gates(summary, min_pass_rate=min_pass_rate, min_mean_reward=min_mean_reward)
        finals.append(
            {
                **resource,
                "status": run.status,
                "error": run.error,
                "metrics": summary or None,
                "outcomes": summary.get("outcomes"),
                "gates": [gate.as_dict() for gate in gates],
            }
        )
        rows.append(_model_row(resource["model_name"], detail, summary))
    columns = ["model", "status", "pass_rate", "pass_at_k", "tokens", "cost_usd", "duration_s"]
    if out.mode.value == "json":
        out.listing(finals, columns=columns)
    else:
        out.listing(
            rows,
            columns=[*columns, "run"],
            title="Models side by side",
            cells={"cost_usd": lambda v: "-" if v is None else f"${v:.4f}",
                   "tokens": lambda v: f"{v:,}"},
        )  # fmt: skip
    unfinished = [final for final in finals if final["status"] != "finished"]
    for final in unfinished:
        out.warn(
            f"{final['name']} ({final['model_name']}) {final['status']}"
            + (f": {final['error']}" if final["error"] else "")
        )
    if unfinished:
        raise typer.Exit(1)
    below = [f["model_name"] for f in finals if any(not g["passed"] for g in f["gates"])]
    if below:
        out.warn(f"below the gate: {', '.join(below)} (exit {GATE_EXIT_CODE})")
        raise typer.Exit(GATE_EXIT_CODE)


def _model_row(model: str, detail: Any, summary: Mapping[str, Any]) -> dict[str, Any]:
    """One model's line of the side-by-side table: the figures `eval run`'s table shows."""
    rate = summary.get("pass_rate")
    interval = (summary.get("confidence_intervals") or {}).get("pass_rate") or {}
    shown = "-" if rate is None else format_rate(rate)
    if rate is not None and interval:
        shown += f" [{format_rate(interval['low'])}, {format_rate(interval['high'])}]"
    duration_ms = detail.eval_run.duration_ms
    cost = summary.get("cost_usd", detail.cost_usd)
    return {
        "model": model,
        "status": detail.eval_run.status,
        "pass_rate": shown,
        "pass_at_k": ", ".join(
            f"@{p['k']} {format_rate(p['value'])}" for p in summary.get("pass_at_k") or []
        ),
        "tokens": int(summary.get("tokens_used") or detail.summary.total_tokens or 0),
        "cost_usd": cost,
        "duration_s": None if duration_ms is None else round(duration_ms / 1000, 1),
        "run": detail.eval_run.name,
    }
