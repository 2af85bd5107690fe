"""Two runs on the same dataset, row by row: which rows improved, regressed or errored, and
the change in pass rate with a paired bootstrap interval (rows resampled together).

    diff = compare_runs(a_rows, b_rows)      # per-row outcomes of run A and run B
    diff.counts["regressed"], diff.change.low, diff.change.high
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import fmean

from osmosis.eval.intervals import ConfidenceInterval, bootstrap_ci
from osmosis.platform.web.run_queries import RowOutcome

KINDS = ("regressed", "improved", "errored", "unchanged", "missing")


@dataclass(frozen=True)
class RowChange:
    row_index: int
    kind: str  # one of KINDS
    a: RowOutcome | None
    b: RowOutcome | None

    @property
    def delta(self) -> float | None:
        if self.a is None or self.b is None or not self.a.scored or not self.b.scored:
            return None
        return self.b.rate - self.a.rate


@dataclass(frozen=True)
class Comparison:
    """`change` is the mean over paired rows (scored in both runs) of B's row pass rate minus
    A's, so it equals `paired_b - paired_a`, the two runs' mean row pass rates over those
    rows; it differs from the runs' own pass rates when rows have unequal attempts or only
    one run scored some rows."""

    rows: list[RowChange]
    counts: dict[str, int]
    change: ConfidenceInterval | None
    paired_rows: int
    paired_a: float | None = None
    paired_b: float | None = None


def _kind(a: RowOutcome | None, b: RowOutcome | None) -> str:
    if a is None or b is None:
        return "missing"
    if b.scored and a.scored and b.rate < a.rate:
        return "regressed"
    if b.scored and a.scored and b.rate > a.rate:
        return "improved"
    # Same pass rate, but run B failed with an error where A did not: worth a look.
    if b.errored > a.errored:
        return "errored"
    return "unchanged"


def compare_runs(a: Mapping[int, RowOutcome], b: Mapping[int, RowOutcome]) -> Comparison:
    """Classify every row of either run; the interval pairs each row's B-A pass rate."""
    rows = [
        RowChange(row, _kind(a.get(row), b.get(row)), a.get(row), b.get(row))
        for row in sorted(set(a) | set(b))
    ]
    pairs = [
        (c.a, c.b)
        for c in rows
        if c.a is not None and c.b is not None and c.a.scored and c.b.scored
    ]
    # One (B - A, 1) per row: the bootstrap resamples rows, each carrying both runs' results.
    deltas = [(b.rate - a.rate, 1.0) for a, b in pairs]
    counts = Counter(change.kind for change in rows)
    return Comparison(
        rows=rows,
        counts={kind: counts.get(kind, 0) for kind in KINDS},
        change=bootstrap_ci(deltas) if deltas else None,
        paired_rows=len(deltas),
        paired_a=fmean(a.rate for a, _ in pairs) if pairs else None,
        paired_b=fmean(b.rate for _, b in pairs) if pairs else None,
    )
