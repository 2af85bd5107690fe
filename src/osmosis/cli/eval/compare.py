"""`osmosis eval compare A B [C…]`: runs row by row against the first (the baseline).

Each of A, B, … is looked up in this order: a run directory (a path holding manifest.json),
a run name under the local runs root (`-o`, else `<workspace>/.osmosis/evals`), then a
platform run name or id. Local and platform runs mix freely. Runs whose datasets, selected
rows or pass thresholds differ are refused (every difference named) unless
`--allow-mismatch`, which compares anyway and prints the differences as warnings.

    osmosis eval compare baseline try2 --fail-on-regression   # exit 4 on a real drop
    osmosis eval compare baseline try2 --fail-on-regression --margin 0.02

`--fail-on-regression` gates on the paired interval of the change, not on row flips: it fails
only when the whole interval of the pass-rate (or `--measure mean-reward`) change lies below
`-margin`. Rows that flipped stay listed, with each side's passes/attempts; rows whose
attempts disagree within a run are named flaky.

Typer only at module level; everything else is imported inside the command body.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from osmosis.cli.output import Output
    from osmosis.client import PlatformClient
    from osmosis.eval.results.compare import (
        Comparison,
        Difference,
        GateResult,
        RowOutcome,
        RunIdentity,
    )

REGRESSION_EXIT_CODE = 4
"""`--fail-on-regression`: a change's interval lies below `-margin` (1 stays "error", 3 "below
a gate")."""


class GateMeasure(StrEnum):
    """What `--fail-on-regression` gates on."""

    pass_rate = "pass-rate"
    mean_reward = "mean-reward"


_ATTEMPT_PAGE = 200
_ROWS_SHOWN = 50


def compare_command(
    runs: list[str] = typer.Argument(
        ..., help="Two or more runs: directories, local run names, or platform runs."
    ),
    output_root: Path | None = typer.Option(
        None, "--output", "-o", help="Local runs root (default <workspace>/.osmosis/evals)."
    ),
    fail_on_regression: bool = typer.Option(
        False,
        "--fail-on-regression",
        help=f"Exit {REGRESSION_EXIT_CODE} when a run's paired interval of the change lies "
        "wholly below -margin (row flips alone never fail).",
    ),
    margin: float = typer.Option(
        0.0,
        "--margin",
        min=0.0,
        help="Tolerated drop for --fail-on-regression, as a fraction (0.02 = 2 points).",
    ),
    measure: GateMeasure = typer.Option(
        GateMeasure.pass_rate,
        "--measure",
        help="What --fail-on-regression gates on: pass-rate or mean-reward.",
    ),
    allow_mismatch: bool = typer.Option(
        False,
        "--allow-mismatch",
        help="Compare even when datasets, rows or thresholds differ (warn instead of refusing).",
    ),
) -> None:
    """Compare runs row by row against the first: regressions, improvements, intervals.

    The pass rate and mean reward changes carry paired intervals over the rows scored in
    both runs; see docs/platform.md for the methods."""
    from osmosis.cli.eval.context import runs_root
    from osmosis.cli.output import CLIError, output
    from osmosis.eval.results.compare import check_alignment, compare_outcomes, regression_gate

    out = output()
    if len(runs) < 2:
        raise CLIError(
            "eval compare needs at least two runs", details={"runs": runs}, hint="eval compare A B"
        )
    root = runs_root(output_root)
    loaded = _load_runs(runs, root)
    identities = [run.identity for run in loaded]
    outcomes = [run.outcomes for run in loaded]
    problems = check_alignment(
        identities, outcomes, source_rows=[run.source_rows for run in loaded]
    )
    if problems and not allow_mismatch:
        sampled = [run.identity.label for run in loaded if run.sampled]
        raise CLIError(
            f"the runs are not comparable row for row ({len(problems)} difference(s)):",
            details={"problems": problems, "runs": runs},
            hint=(
                f"{', '.join(sampled)} ran a random sample of the dataset (without "
                "[evaluation] limit the platform samples 10 % at random): set limit to "
                "compare platform runs row for row, or pass --allow-mismatch"
                if sampled
                else "compare runs of the same dataset and rows, or pass --allow-mismatch"
            ),
        )
    for problem in problems:
        out.warn(problem)
    result = compare_outcomes([i.label for i in identities], outcomes, problems=problems)
    gate = regression_gate(
        result,
        margin=margin,
        measure="mean_reward" if measure is GateMeasure.mean_reward else "pass_rate",
    )
    _show(out, result, gate if fail_on_regression else None)
    if fail_on_regression and gate.failed:
        if out.mode.value != "json":
            for line in _gate_lines(result, gate):
                out.err_console.print(line, markup=False, highlight=False)
        raise typer.Exit(REGRESSION_EXIT_CODE)


# -- loading ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Loaded:
    """One run as compare needs it."""

    identity: RunIdentity
    outcomes: dict[int, RowOutcome]
    source_rows: dict[int, int] | None = None
    """Each row's dataset position, where known (local journals and platform attempts since
    migration 0009 carry it)."""
    sampled: bool = False
    """A platform run that sampled its rows at random: rows of another run cannot pair."""


def _load_runs(refs: list[str], root: Path) -> list[_Loaded]:
    """Every run, local first; the platform is asked only for refs that are not local."""
    from osmosis.cli.eval.local_runs import find_local_run

    local = {ref: find_local_run(ref, root=root) for ref in refs}
    remote = [ref for ref, path in local.items() if path is None]
    fetched = _platform_runs(remote, root) if remote else {}
    loaded = []
    for ref in refs:
        path = local[ref]
        loaded.append(_local(ref, path) if path is not None else fetched[ref])
    return loaded


def _local(ref: str, path: Path) -> _Loaded:
    from osmosis.cli.eval.local_runs import read_local_run
    from osmosis.cli.output import CLIError
    from osmosis.eval.results.compare import RunIdentity, row_outcomes, source_rows

    try:
        run = read_local_run(path)
    except ValueError as error:
        raise CLIError(str(error), details={"run": ref}) from None
    identity = RunIdentity(
        label=ref,
        dataset_sha256=run.dataset_sha256,
        rows_digest=run.rows_digest,
        pass_threshold=run.pass_threshold,
    )
    records = run.records()
    return _Loaded(
        identity, row_outcomes(records, run.pass_threshold), source_rows=source_rows(records)
    )


def _platform_runs(refs: list[str], root: Path) -> dict[str, _Loaded]:
    from osmosis.cli.credentials import open_client, platform_errors
    from osmosis.cli.output import CLIError
    from osmosis.client import PlatformAPIError

    found = {}
    try:
        client = open_client(None)
    except CLIError as error:
        # Not local, and no platform to ask: say both, not only "not logged in".
        raise CLIError(
            f"run {refs[0]!r} not found: not a run directory, not a local run under {root}, "
            f"and the platform cannot be asked ({error.message})",
            code="NOT_FOUND",
            details={"runs": refs, "runs_root": str(root)},
            hint=error.hint,
        ) from None
    with platform_errors(), client:
        for ref in refs:
            try:
                found[ref] = _platform_run(client, ref)
            except PlatformAPIError as error:
                if error.code != "NOT_FOUND":
                    raise
                raise CLIError(
                    f"run {ref!r} not found: not a run directory, not a local run under the "
                    "runs root, and not a platform run",
                    code="NOT_FOUND",
                    details={"run": ref},
                    hint="osmosis eval list (platform) or ls .osmosis/evals (local)",
                ) from None
    return found


def _platform_run(client: PlatformClient, ref: str) -> _Loaded:
    from osmosis.eval.results.compare import RunIdentity, row_outcomes, source_rows

    detail = client.runs.get(ref)
    attempts: list[dict[str, Any]] = []
    offset: int | None = 0
    while offset is not None:
        page = client.runs.attempts(detail.eval_run.id, limit=_ATTEMPT_PAGE, offset=offset)
        attempts += [attempt.model_dump() for attempt in page.attempts]
        offset = page.next_offset if page.has_more else None
    threshold = detail.summary.pass_threshold
    rows_digest, sampled = _platform_selection(detail)
    sources = source_rows(attempts)
    # Attempts stored before the platform kept their dataset rows (migration 0009) lack them.
    every_row_known = bool(attempts) and len(sources) == len({a["row_index"] for a in attempts})
    if every_row_known:
        rows_digest = None  # pairs are checked row by row (check_alignment) instead
    identity = RunIdentity(
        label=ref,
        dataset_sha256=detail.dataset.sha256 or None,
        rows_digest=rows_digest,
        pass_threshold=threshold,
    )
    return _Loaded(
        identity,
        row_outcomes(attempts, threshold),
        source_rows=sources if every_row_known else None,
        sampled=sampled,
    )


def _platform_selection(detail: Any) -> tuple[str | None, bool]:
    """(rows digest, sampled at random) of a platform run, from its config and counts.

    What compare falls back on for attempts stored before the platform kept each one's
    dataset row (migration 0009); the rule is known: `limit` takes the first rows, as a local
    run does (so the digest is the one a local manifest records); without it the platform
    samples 10 % at random, and such a run's row 0 is nobody else's row 0 (a digest of its own
    id says so). None when the counts cannot tell (an older or imported run without them)."""
    from osmosis.eval.host.plan import _selection_digest
    from osmosis.eval.inputs.dataset_select import Selection

    config, summary = detail.config, detail.summary
    limit, n, dataset_rows = config.get("limit"), config.get("n"), summary.dataset_rows
    total = summary.progress.total
    if not (isinstance(n, int) and n > 0 and isinstance(dataset_rows, int) and total):
        return None, False
    if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
        selected = range(min(limit, dataset_rows))
    elif total // n < dataset_rows:
        return f"random sample of platform run {detail.eval_run.id}", True
    else:
        selected = range(dataset_rows)
    digest = _selection_digest(Selection(tuple(selected), dataset_rows, "limit"))
    return digest, False


# -- output ----------------------------------------------------------------------------------
def _change(difference: Difference | None, fmt: str) -> str:
    if difference is None:
        return "-"
    ci = difference.interval
    return (
        f"{difference.baseline:{fmt}} → {difference.other:{fmt}}, change {ci.estimate:+{fmt}} "
        f"({ci.level:.0%} CI {ci.low:+{fmt}} to {ci.high:+{fmt}}, {ci.method})"
    )


def _rate(outcome: RowOutcome | None) -> str:
    if outcome is None:
        return "absent"
    if outcome.rate is None:
        return "skipped"
    return f"{outcome.passes}/{outcome.attempts}" + (" flaky" if outcome.flaky else "")


def _gate_lines(result: Comparison, gate: GateResult) -> list[str]:
    """Why `--fail-on-regression` failed: each regressed run's interval against the margin."""
    fmt = ".1%" if gate.measure == "pass_rate" else ".3f"
    name = gate.measure.replace("_", " ")
    lines = []
    for d in gate.regressed:
        found = d.pass_rate if gate.measure == "pass_rate" else d.mean_reward
        assert found is not None  # the gate regressed it on this interval
        ci = found.interval
        lines.append(
            f"{d.label} regressed against {result.labels[0]}: {name} change {ci.estimate:+{fmt}}, "
            f"{ci.level:.0%} CI {ci.low:+{fmt}} to {ci.high:+{fmt}} lies below "
            f"{_bound(gate, fmt)}; exit {REGRESSION_EXIT_CODE} (--fail-on-regression)"
        )
    return lines


def _bound(gate: GateResult, fmt: str) -> str:
    """`-margin` as the gate compares with it: "0 (--margin 0)", "-2.0% (--margin 0.02)"."""
    return f"{'0' if gate.margin == 0 else f'-{gate.margin:{fmt}}'} (--margin {gate.margin:g})"


def _verdict(result: Comparison, gate: GateResult) -> str:
    """The gate's decision in one line, when it passed."""
    name = gate.measure.replace("_", " ")
    fmt = ".1%" if gate.measure == "pass_rate" else ".3f"
    said = f"--fail-on-regression passed: no {name} interval lies wholly below {_bound(gate, fmt)}"
    if result.regressed_rows:
        said += f" ({len(result.regressed_rows)} row flip(s) listed are within noise)"
    if gate.ungated:
        said += f"; no {name} interval for {', '.join(gate.ungated)}: not gated"
    return said


def _show(out: Output, result: Comparison, gate: GateResult | None = None) -> None:
    if out.mode.value == "json":
        out.detail({**result.as_dict(), "gate": gate.as_dict() if gate else None})
        return
    for d in result.differences:
        out.detail(
            {
                "Run": f"{d.label} against {result.labels[0]} "
                f"({d.paired_rows} rows scored in both)",
                "Pass rate": _change(d.pass_rate, ".1%"),
                "Mean reward": _change(d.mean_reward, ".3f"),
                "Rows": ", ".join(f"{count} {kind}" for kind, count in d.counts.items()),
            }
        )
    flaky = {label: rows for label, rows in result.flaky_rows.items() if rows}
    if flaky:
        out.info(
            "Flaky rows (attempts disagree within a run): "
            + "; ".join(f"{label}: {_rows_named(rows)}" for label, rows in flaky.items())
        )
    if gate is not None and not gate.failed:
        out.info(_verdict(result, gate))
    changed = [row for row in result.rows if any(k in ("regressed", "improved") for k in row.kinds)]
    if not changed:
        out.info("No row changed its pass rate.")
        return
    shown = changed if out.mode.value == "plain" else changed[:_ROWS_SHOWN]
    out.listing(
        [
            {
                "row": row.row_index,
                **{label: _rate(o) for label, o in zip(result.labels, row.outcomes, strict=True)},
                "change": ", ".join(
                    f"{label}: {kind}"
                    for label, kind in zip(result.labels[1:], row.kinds, strict=True)
                    if kind in ("regressed", "improved")
                ),
            }
            for row in shown
        ],
        columns=["row", *result.labels, "change"],
        title="Rows that changed (passes/attempts; information, not the gate)",
        headers={label: label for label in result.labels},
    )
    if len(shown) < len(changed):
        out.info(f"… and {len(changed) - len(shown)} more rows (--json lists every row).")


def _rows_named(rows: list[int], limit: int = 20) -> str:
    shown = ", ".join(f"row {row}" for row in rows[:limit])
    return shown + (f", … ({len(rows)} in all)" if len(rows) > limit else "")
