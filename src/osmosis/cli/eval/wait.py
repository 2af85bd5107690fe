"""`eval submit --wait`: follow a platform run to its end, then apply the CI gates.

    osmosis eval submit configs/eval/qa.toml -y --wait --min-pass-rate 0.8   # exit 3 if below

A line is printed when the run's status or progress changes (at most every few seconds) and
at least every `HEARTBEAT_S` seconds. The platform going away for a while (a restart, a
network blip, a 5xx) is said once and waited out for up to `UNREACHABLE_S` seconds: the run
goes on there, and a CI job must not fail for a poll that found no answer. Ctrl-C stops
following, not the run: it prints the command that follows it again. Exit codes as
`eval run`: 1 when the run failed or was stopped (or the platform stayed away), 5 when it
finished with every attempt errored, 3 when it finished below a gate.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Final

from osmosis.cli.eval.report import ERRORED_EXIT_CODE, GATE_EXIT_CODE, all_errored, check_gates

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

    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.output import CLIError
    from osmosis.client import PlatformAPIError
    from osmosis.vocabulary import TERMINAL_RUN_STATUSES

    out.info(f"Following {name} until it ends (Ctrl-C stops following, not the run)")
    last_line, last_state = 0.0, None
    away_since: float | None = None  # when polls stopped being answered
    try:
        with platform_errors(), open_client(None) as client:
            while True:
                try:
                    detail = client.runs.get(name)
                except PlatformAPIError as error:
                    transient = error.code == "NETWORK" or error.status_code in _TRANSIENT_STATUS
                    now = time.monotonic()
                    if not transient or (
                        away_since is not None and now - away_since >= unreachable_s
                    ):
                        raise
                    if away_since is None:
                        away_since = now
                        out.warn(
                            f"no answer from the platform ({error.message}); still following "
                            f"{name}, for up to {unreachable_s:.0f}s"
                        )
                    time.sleep(poll_s)
                    continue
                if away_since is not None:
                    out.info(f"the platform answers again; following {name}")
                    away_since = None
                run = detail.eval_run
                progress = detail.summary.progress
                state = (run.status, progress.completed)
                now = time.monotonic()
                if state != last_state or now - last_line >= HEARTBEAT_S:
                    rate = detail.summary.pass_rate
                    shown = "-" if rate is None else f"{rate:.0%}"
                    out.info(
                        f"{run.name}: {run.status} · {progress.completed}/{progress.total} "
                        f"samples · pass {shown}"
                    )
                    last_line, last_state = now, state
                if run.status in TERMINAL_RUN_STATUSES:
                    break
                time.sleep(poll_s)
    except KeyboardInterrupt:
        raise CLIError(
            f"stopped following {name}; the run goes on on the platform",
            code="INTERRUPTED",
            details={"name": name},
            hint=f"osmosis eval info {name} (or osmosis eval stop {name})",
            exit_code=130,
        ) from None
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
