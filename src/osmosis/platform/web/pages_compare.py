"""`/compare?run=A&run=B[&run=C…]`: runs on the same dataset, row by row, against the first
(the baseline), as `osmosis eval compare` does: a matrix of rows by runs, each run's change in
pass rate and mean reward with its paired interval, and for one row every run's outputs side
by side (`/compare/rows/{row}`).

The arithmetic is `osmosis.eval.results.compare`'s; every run is judged at the baseline's pass
threshold, so a changed threshold is not a change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from osmosis.eval.results.compare import (
    Comparison,
    RowComparison,
    RowOutcome,
    RunIdentity,
    check_alignment,
    compare_outcomes,
    source_rows,
)
from osmosis.platform.core.errors import ValidationFailed
from osmosis.platform.web.params import Offset, RowIndex
from osmosis.platform.web.render import render
from osmosis.platform.web.samples_index import RowInput, Sample
from osmosis.platform.web.source import RunFilters, RunSource, RunView, Source

router = APIRouter()

ROWS_PER_PAGE = 100
MAX_RUNS = 8
SHOWS = ("changed", "regressed", "improved", "missing", "all")
RECENT_RUNS = 100


@dataclass(frozen=True)
class Chosen:
    """The runs named in the URL, found, with the problems that stop a comparison."""

    refs: list[str]
    runs: list[RunView]
    refusal: str | None


def _refs(run: list[str], a: str, b: str) -> list[str]:
    # `a`/`b` are the two-run page's links (and still work); empty menus choose nothing.
    refs = [ref.strip() for ref in (a, b, *run) if ref.strip()]
    if len(refs) > MAX_RUNS:
        raise ValidationFailed(
            f"compare at most {MAX_RUNS} runs at once; got {len(refs)}",
            details={"runs": refs},
        )
    return refs


def _same_dataset(runs: list[RunView]) -> str | None:
    """Why the runs cannot be lined up row by row, or None."""
    base = runs[0]
    for other in runs[1:]:
        a, b = base.detail, other.detail
        shas = (a.dataset_sha256 if a else None, b.dataset_sha256 if b else None)
        differs = shas[0] != shas[1] if all(shas) else base.dataset != other.dataset
        if differs:
            return (
                f"{base.name} ran on dataset {base.dataset} and {other.name} on "
                f"{other.dataset}{' (another version)' if base.dataset == other.dataset else ''}: "
                "pick runs on the same dataset (and version)"
            )
    return None


def _choose(source: RunSource, refs: list[str]) -> Chosen:
    found = [source.find(ref) for ref in refs]
    refusal = _same_dataset(found) if len(found) >= 2 else None
    return Chosen(refs=refs, runs=found, refusal=refusal)


# The last comparisons made, by the runs' journals as they were: a paired bootstrap over
# thousands of rows takes a while, and a finished run's comparison never changes.
_MADE: dict[tuple[Any, ...], Comparison] = {}
_KEEP = 16


def _compare(source: RunSource, runs: list[RunView]) -> tuple[Comparison, float]:
    threshold = runs[0].detail.pass_threshold if runs[0].detail else 1.0
    indexes = [source.samples(run) for run in runs]
    key = (threshold, *((str(i.run_dir), i.state) for i in indexes))
    made = _MADE.get(key)
    if made is None:
        made = _MADE[key] = _compare_outcomes(
            runs,
            [i.outcomes(threshold) for i in indexes],
            [source_rows(i.samples) for i in indexes],
        )
        while len(_MADE) > _KEEP:
            _MADE.pop(next(iter(_MADE)), None)
    return made, threshold


def _compare_outcomes(
    runs: list[RunView], outcomes: list[dict[int, RowOutcome]], sources: list[dict[int, int]]
) -> Comparison:
    identities = [
        RunIdentity(
            label=run.name,
            dataset_sha256=run.detail.dataset_sha256 if run.detail else None,
            rows_digest=run.detail.rows_digest if run.detail else None,
            pass_threshold=run.detail.pass_threshold if run.detail else None,
        )
        for run in runs
    ]
    # The journals say which dataset row each row is: two platform runs without `limit`
    # sampled different rows at random, and the digest of their selection is not exposed.
    problems = check_alignment(identities, outcomes, source_rows=[s or None for s in sources])
    return compare_outcomes([run.name for run in runs], outcomes, problems=problems)


def _shown(rows: list[RowComparison], show: str) -> list[RowComparison]:
    if show == "all":
        return rows
    if show == "changed":
        return [r for r in rows if any(kind != "same" for kind in r.kinds)]
    return [r for r in rows if show in r.kinds]


def _menu(source: RunSource) -> list[RunView]:
    return source.list_runs(RunFilters(), limit=RECENT_RUNS, offset=0).rows


@router.get("/compare")
def compare(
    request: Request,
    source: Source,
    run: Annotated[list[str], Query()] = [],  # noqa: B006 - FastAPI copies the default
    a: str = "",
    b: str = "",
    show: str = "changed",
    offset: Offset = 0,
) -> Response:
    if show not in SHOWS:
        raise ValidationFailed(f"unknown show {show!r}", details={"valid": list(SHOWS)})
    refs = _refs(run, a, b)
    menu = _menu(source)
    context: dict[str, Any] = {
        "refs": refs,
        "show": show,
        "recent": menu,
        "recent_refs": {view.ref for view in menu},
        "slots": min(max(len(refs) + 1, 2), MAX_RUNS),
        "run_params": {"run": refs},
    }
    chosen = _choose(source, refs)
    context["runs"] = chosen.runs
    if chosen.refusal:
        context["problem"] = chosen.refusal
    elif len(chosen.runs) >= 2:
        result, threshold = _compare(source, chosen.runs)
        shown = _shown(result.rows, show)
        page_rows = shown[offset : offset + ROWS_PER_PAGE]
        context.update(
            result=result,
            threshold=threshold,
            rows=page_rows,
            inputs=_row_inputs(source, chosen.runs, {r.row_index for r in page_rows}),
            page={
                "offset": offset,
                "limit": ROWS_PER_PAGE,
                "total": len(shown),
                "params": {"run": refs, "show": show},
            },
            counts={kind: len(_shown(result.rows, kind)) for kind in SHOWS},
        )
    return render(request, "compare.html", source.viewer, nav="compare", **context)


def _row_inputs(source: RunSource, runs: list[RunView], wanted: set[int]) -> dict[int, RowInput]:
    """Each shown row's input and expected answer, from the first run that recorded it."""
    found: dict[int, RowInput] = {}
    for view in runs:
        missing = wanted - found.keys()
        if not missing:
            break
        index = source.samples(view)
        firsts: dict[int, Sample] = {}
        for sample in index.samples:
            if sample.row_index in missing:
                firsts.setdefault(sample.row_index, sample)
        for row_index, sample in firsts.items():
            given = index.input_of(sample)
            if given is not None:
                found[row_index] = given
    return found


@dataclass(frozen=True)
class Column:
    """One run's attempts at the row, texts read, for the side-by-side view."""

    run: RunView
    kind: str | None  # against the baseline; None for the baseline itself
    samples: list[Sample]


@router.get("/compare/rows/{row_index}")
def compare_row(
    row_index: RowIndex,
    request: Request,
    source: Source,
    run: Annotated[list[str], Query()] = [],  # noqa: B006 - FastAPI copies the default
) -> Response:
    """One row in every run: the input once, then each run's outputs and errors."""
    refs = _refs(run, "", "")
    if len(refs) < 2:
        raise ValidationFailed("name two or more runs: /compare/rows/ROW?run=A&run=B")
    chosen = _choose(source, refs)
    if chosen.refusal:
        raise ValidationFailed(chosen.refusal)
    result, threshold = _compare(source, chosen.runs)
    compared = next((r for r in result.rows if r.row_index == row_index), None)
    columns, row_input = [], None
    for position, view in enumerate(chosen.runs):
        index = source.samples(view)
        samples = index.with_texts([s for s in index.samples if s.row_index == row_index])
        if row_input is None and samples:
            row_input = index.input_of(samples[0])
        kind = compared.kinds[position - 1] if compared is not None and position else None
        columns.append(Column(run=view, kind=kind, samples=samples))
    return render(
        request,
        "compare_row.html",
        source.viewer,
        nav="compare",
        row_index=row_index,
        compared=compared,
        columns=columns,
        row_input=row_input,
        threshold=threshold,
        run_params={"run": refs},
    )
